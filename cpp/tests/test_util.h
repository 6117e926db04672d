#pragma once
// The tiny harness of the native tests: CHECK, a test registry (KBCORE_TEST), and the oracles
// and data helpers the component tests share. Each tests/test_*.cpp is its own executable
// (main in test_main.cpp), registered with ctest, and run under ASan + UBSan by .ci/run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "index.h"

namespace kbcore_test {

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "  CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      throw std::runtime_error("check failed");                                         \
    }                                                                                   \
  } while (0)

/// The tests of this executable, in registration order.
std::vector<std::pair<const char*, void (*)()>>& registry();
struct Register {
  Register(const char* name, void (*fn)()) { registry().emplace_back(name, fn); }
};
#define KBCORE_TEST(name)                                                   \
  void test_##name();                                                       \
  static const ::kbcore_test::Register register_##name(#name, test_##name); \
  void test_##name()

/// True if fn throws exactly E (or a subclass), false if it throws something else or nothing.
template <typename E, typename Fn>
bool throws(Fn fn) {
  try {
    fn();
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

/// n x dim points around 20 Gaussian centres.
inline std::vector<float> clustered(std::size_t n, std::size_t dim, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> centres(20 * dim);
  for (auto& c : centres) c = g(rng);
  std::vector<float> x(n * dim);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t c = rng() % 20;
    for (std::size_t d = 0; d < dim; ++d) x[i * dim + d] = centres[c * dim + d] + 0.4f * g(rng);
  }
  return x;
}

inline float l2sq(const float* a, const float* b, std::size_t dim) {
  float d = 0;
  for (std::size_t j = 0; j < dim; ++j) d += (a[j] - b[j]) * (a[j] - b[j]);
  return d;
}

/// Exact L2 top-k ids of q among rows passing `pass` (brute force).
inline std::vector<std::int64_t> exact_topk(const std::vector<float>& x, const std::vector<std::int64_t>& ids,
                                            const float* q, std::size_t dim, std::size_t k,
                                            const std::function<bool(std::size_t)>& pass = nullptr) {
  std::vector<std::pair<float, std::int64_t>> all;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (pass && !pass(i)) continue;
    all.push_back({l2sq(&x[i * dim], q, dim), ids[i]});
  }
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < std::min(k, all.size()); ++i) out.push_back(all[i].second);
  return out;
}

inline double recall(const std::vector<std::int64_t>& got, const std::vector<std::int64_t>& want) {
  std::set<std::int64_t> w(want.begin(), want.end());
  std::size_t hit = 0;
  for (auto g : got) hit += w.count(g);
  return want.empty() ? 1.0 : static_cast<double>(hit) / static_cast<double>(want.size());
}

/// An L2 config of the given kind with M = 8, ef_construction = ef_search = 64.
inline kbcore::IndexConfig config(std::size_t dim, kbcore::IndexKind kind) {
  kbcore::IndexConfig c;
  c.dim = dim;
  c.metric = kbcore::Metric::kL2;
  c.kind = kind;
  c.hnsw.M = 8;
  c.hnsw.ef_construction = 64;
  c.ef_search = 64;
  return c;
}

/// Search parameters: k results at ef (0 = the index default) on `threads` threads.
inline kbcore::SearchParams params(std::size_t k, std::size_t ef, std::size_t threads,
                                   const kbcore::FilterNode* filter = nullptr) {
  kbcore::SearchParams p;
  p.k = k;
  p.ef = ef;
  p.threads = threads;
  p.filter = filter;
  return p;
}

/// Grouped search parameters.
inline kbcore::GroupParams group_params(std::size_t k, const std::string& group_by, std::size_t group_size,
                                        std::size_t ef, std::size_t threads) {
  kbcore::GroupParams p;
  p.k = k;
  p.ef = ef;
  p.threads = threads;
  p.group_by = group_by;
  p.group_size = group_size;
  return p;
}

/// An int column over n rows (all valid unless `valid` is given).
inline kbcore::ColumnInput int_column(const std::string& name, const std::vector<std::int64_t>& v,
                                      const std::vector<std::uint8_t>& valid) {
  kbcore::ColumnInput col;
  col.name = name;
  col.kind = kbcore::ValueKind::kInt;
  col.valid = valid.data();
  col.ints = v.data();
  return col;
}

}  // namespace kbcore_test
