// Native unit tests for the core, built with -DKBCORE_BUILD_TESTS=ON and run under
// AddressSanitizer + UBSan by .ci/run. Each test compares against a brute-force oracle.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "binary_io.h"
#include "distance.h"
#include "errors.h"
#include "filter_expr.h"
#include "id_map.h"
#include "index.h"
#include "string_dict.h"

namespace {

int g_failed = 0;
int g_passed = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "  CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      throw std::runtime_error("check failed");                                  \
    }                                                                            \
  } while (0)

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

std::vector<float> clustered(std::size_t n, std::size_t dim, std::uint64_t seed) {
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

std::vector<std::int64_t> exact_topk(const std::vector<float>& x, const std::vector<std::int64_t>& ids,
                                     const float* q, std::size_t dim, std::size_t k,
                                     const std::function<bool(std::size_t)>& pass = nullptr) {
  std::vector<std::pair<float, std::int64_t>> all;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (pass && !pass(i)) continue;
    float d = 0;
    for (std::size_t j = 0; j < dim; ++j) d += (x[i * dim + j] - q[j]) * (x[i * dim + j] - q[j]);
    all.push_back({d, ids[i]});
  }
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < std::min(k, all.size()); ++i) out.push_back(all[i].second);
  return out;
}

double recall(const std::vector<std::int64_t>& got, const std::vector<std::int64_t>& want) {
  std::set<std::int64_t> w(want.begin(), want.end());
  std::size_t hit = 0;
  for (auto g : got) hit += w.count(g);
  return want.empty() ? 1.0 : static_cast<double>(hit) / static_cast<double>(want.size());
}

void test_kernels_agree_with_scalar() {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t dim : {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 384}) {
    std::vector<float> a(dim), b(dim * 4);
    for (auto& v : a) v = u(rng);
    for (auto& v : b) v = u(rng);
    const auto& s = kbcore::kernels_for(kbcore::SimdLevel::kScalar);
    for (auto level : kbcore::supported_simd_levels()) {
      const auto& k = kbcore::kernels_for(level);
      CHECK(std::fabs(k.dot(a.data(), b.data(), dim) - s.dot(a.data(), b.data(), dim)) < 1e-4f);
      CHECK(std::fabs(k.l2sq(a.data(), b.data(), dim) - s.l2sq(a.data(), b.data(), dim)) < 1e-4f);
      const float* rows[4] = {b.data(), b.data() + dim, b.data() + 2 * dim, b.data() + 3 * dim};
      float out[4], ref[4];
      k.dot4(a.data(), rows, dim, out);
      s.dot4(a.data(), rows, dim, ref);
      for (int j = 0; j < 4; ++j) CHECK(std::fabs(out[j] - ref[j]) < 1e-4f);
      k.l2sq4(a.data(), rows, dim, out);
      s.l2sq4(a.data(), rows, dim, ref);
      for (int j = 0; j < 4; ++j) CHECK(std::fabs(out[j] - ref[j]) < 1e-4f);
    }
  }
}

kbcore::IndexConfig config(std::size_t dim, kbcore::IndexKind kind) {
  kbcore::IndexConfig c;
  c.dim = dim;
  c.metric = kbcore::Metric::kL2;
  c.kind = kind;
  c.hnsw.M = 8;
  c.hnsw.ef_construction = 64;
  c.ef_search = 64;
  return c;
}

void test_hnsw_recall_delete_and_reload() {
  const std::size_t n = 1500, dim = 24, k = 10;
  auto x = clustered(n, dim, 7);
  std::vector<std::int64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>(i * 3 + 1);
  kbcore::Index index(config(dim, kbcore::IndexKind::kHnsw));
  index.add(x.data(), ids.data(), n, 2);
  CHECK(index.size() == n);
  auto q = clustered(50, dim, 8);
  std::vector<std::int64_t> out_ids(50 * k);
  std::vector<float> out_d(50 * k);
  index.search(q.data(), 50, k, 0, 2, out_ids.data(), out_d.data());
  double r = 0;
  for (std::size_t i = 0; i < 50; ++i) {
    std::vector<std::int64_t> got(out_ids.begin() + i * k, out_ids.begin() + (i + 1) * k);
    r += recall(got, exact_topk(x, ids, q.data() + i * dim, dim, k));
  }
  CHECK(r / 50 > 0.9);
  // Remove a third; removed ids never come back; the rest stays findable.
  std::vector<std::int64_t> gone;
  for (std::size_t i = 0; i < n; i += 3) gone.push_back(ids[i]);
  index.remove(gone.data(), gone.size(), 2);
  CHECK(index.size() == n - gone.size());
  index.search(q.data(), 50, k, 0, 1, out_ids.data(), out_d.data());
  std::set<std::int64_t> gone_set(gone.begin(), gone.end());
  for (auto id : out_ids) CHECK(!gone_set.count(id));
  CHECK(throws<kbcore::NotFound>([&] { index.remove(gone.data(), 1, 1); }));
  // Save, reload, same answers.
  const std::string path = "kbcore_test_index.bin";
  index.save(path);
  auto loaded = kbcore::Index::load(path);
  std::vector<std::int64_t> ids2(50 * k);
  std::vector<float> d2(50 * k);
  loaded->search(q.data(), 50, k, 0, 1, ids2.data(), d2.data());
  CHECK(ids2 == out_ids);
  // Truncations and a flipped byte are FormatErrors, never crashes.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  for (std::size_t cut : {std::size_t{0}, std::size_t{5}, std::size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(cut));
    CHECK(throws<kbcore::FormatError>([&] { kbcore::Index::load(path); }));
  }
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  CHECK(throws<kbcore::FormatError>([&] { kbcore::Index::load(path); }));
  std::remove(path.c_str());
}

void test_flat_is_exact_and_filters() {
  const std::size_t n = 800, dim = 16, k = 7;
  auto x = clustered(n, dim, 3);
  std::vector<std::int64_t> ids(n), tag(n);
  std::vector<std::uint8_t> valid(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int64_t>(i);
    tag[i] = static_cast<std::int64_t>(i % 10);
  }
  kbcore::ColumnInput col;
  col.name = "tag";
  col.kind = kbcore::ValueKind::kInt;
  col.valid = valid.data();
  col.ints = tag.data();
  for (auto kind : {kbcore::IndexKind::kFlat, kbcore::IndexKind::kHnsw}) {
    kbcore::Index index(config(dim, kind));
    index.add(x.data(), ids.data(), n, 1, {col});
    kbcore::FilterNode f;
    f.field = "tag";
    f.op = kbcore::FilterOp::kLt;
    kbcore::Operand o;
    o.kind = kbcore::ValueKind::kInt;
    o.i = 2;
    f.operands.push_back(o);
    CHECK(index.count(f) == n / 5);
    auto q = clustered(20, dim, 4);
    std::vector<std::int64_t> out(20 * k);
    std::vector<float> d(20 * k);
    index.search(q.data(), 20, k, 0, 1, out.data(), d.data(), &f);
    for (std::size_t i = 0; i < 20; ++i) {
      std::vector<std::int64_t> got(out.begin() + i * k, out.begin() + (i + 1) * k);
      const auto want = exact_topk(x, ids, q.data() + i * dim, dim, k, [&](std::size_t r) { return tag[r] < 2; });
      for (auto g : got) CHECK(g >= 0 && tag[static_cast<std::size_t>(g)] < 2);
      if (kind == kbcore::IndexKind::kFlat) CHECK(got == want);
    }
  }
}

void test_iso8601() {
  CHECK(kbcore::parse_iso8601("1970-01-01").value() == 0.0);
  CHECK(kbcore::parse_iso8601("2024-02-29T12:00:00Z").value() == 1709208000.0);
  CHECK(kbcore::parse_iso8601("2024-02-29T14:00:00+02:00").value() == 1709208000.0);
  CHECK(!kbcore::parse_iso8601("2023-02-29"));
  CHECK(!kbcore::parse_iso8601("not a date"));
  CHECK(!kbcore::parse_iso8601("2024-01-01T25:00"));
}

void test_bad_input_changes_nothing() {
  kbcore::Index index(config(4, kbcore::IndexKind::kHnsw));
  std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, NAN};
  std::vector<std::int64_t> ids = {1, 2};
  CHECK(throws<kbcore::InvalidArgument>([&] { index.add(v.data(), ids.data(), 2, 1); }));
  CHECK(index.size() == 0);
  v[7] = 8;
  ids[1] = 1;
  CHECK(throws<kbcore::InvalidArgument>([&] { index.add(v.data(), ids.data(), 2, 1); }));
  CHECK(index.size() == 0);
  std::vector<std::int64_t> out(3);
  std::vector<float> d(3);
  index.search(v.data(), 1, 3, 0, 1, out.data(), d.data());
  CHECK(out[0] == -1 && std::isinf(d[0]));
}

}  // namespace

// match_filter against a per-row oracle: the count, the bitmap and the list (in any order) agree
// for single-key leaves (rows straight from the index), multi-key ranges, $in, negations and
// AND / OR trees, with dead slots, at every rows_up_to threshold.
void test_match_filter_agrees_with_oracle() {
  using namespace kbcore;
  std::mt19937 rng(7);
  // 20000 rows with 2000 values: few rows pass the small ranges and $in (the list read
  // straight from the index, several keys' runs one after the other).
  for (const std::size_t n : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{1000},
                              std::size_t{20000}}) {
    for (const bool with_dead : {true, false}) {
      std::vector<std::int64_t> val(n);
      std::vector<std::uint8_t> valid(n);
      const std::uint32_t values = n >= 20000 ? 2000 : 20;
      for (std::size_t i = 0; i < n; ++i) {
        val[i] = static_cast<std::int64_t>(rng() % values);
        valid[i] = rng() % 10 != 0;  // some rows lack the field
      }
      ColumnInput col;
      col.name = "v";
      col.kind = ValueKind::kInt;
      col.valid = valid.data();
      col.ints = val.data();
      MetadataStore meta;
      meta.grow(n);
      std::vector<Slot> slots(n);
      for (std::size_t i = 0; i < n; ++i) slots[i] = static_cast<Slot>(i);
      meta.assign(slots, {col});
      Bitmap live(n, true);
      // Dead slots keep their metadata here and must not pass; without them match_filter is
      // told that every slot is live.
      if (with_dead) {
        for (std::size_t i = 0; i < n; ++i) {
          if (rng() % 7 == 0) live.reset(i);
        }
      }
      const auto leaf = [](FilterOp op, std::vector<std::int64_t> xs) {
        FilterNode f;
        f.field = "v";
        f.op = op;
        for (std::int64_t x : xs) {
          Operand o;
          o.kind = ValueKind::kInt;
          o.i = x;
          f.operands.push_back(o);
        }
        return f;
      };
      const auto tree = [](FilterNode::Type t, std::vector<FilterNode> c) {
        FilterNode f;
        f.type = t;
        f.children = std::move(c);
        return f;
      };
      struct Case {
        FilterNode f;
        std::function<bool(std::int64_t)> pass;  // on a present value; missing rows never pass here
      };
      std::vector<Case> cases = {
          {leaf(FilterOp::kEq, {3}), [](std::int64_t x) { return x == 3; }},
          {leaf(FilterOp::kEq, {99}), [](std::int64_t x) { return x == 99; }},
          {leaf(FilterOp::kLt, {5}), [](std::int64_t x) { return x < 5; }},
          {leaf(FilterOp::kGte, {19}), [](std::int64_t x) { return x >= 19; }},
          {leaf(FilterOp::kLte, {100}), [](std::int64_t x) { return x <= 100; }},
          {leaf(FilterOp::kIn, {2, 7}), [](std::int64_t x) { return x == 2 || x == 7; }},
          {leaf(FilterOp::kIn, {4}), [](std::int64_t x) { return x == 4; }},
          {tree(FilterNode::Type::kAnd, {leaf(FilterOp::kGt, {3}), leaf(FilterOp::kLt, {9})}),
           [](std::int64_t x) { return x > 3 && x < 9; }},
          {tree(FilterNode::Type::kOr, {leaf(FilterOp::kEq, {1}), leaf(FilterOp::kEq, {18})}),
           [](std::int64_t x) { return x == 1 || x == 18; }},
      };
      for (const Case& c : cases) {
        std::vector<Slot> want;
        for (std::size_t i = 0; i < n; ++i) {
          if (live.test(i) && valid[i] && c.pass(val[i])) want.push_back(static_cast<Slot>(i));
        }
        CHECK(evaluate_filter(c.f, meta, live).count() == want.size());
        for (const std::size_t up_to : {std::size_t{0}, want.size() ? want.size() - 1 : 0, want.size(), n}) {
          FilterMatches m = match_filter(c.f, meta, live, up_to, /*all_live=*/live.count() == n);
          CHECK(m.count == want.size());
          CHECK(m.has_rows || m.has_bitmap);
          if (up_to >= want.size()) CHECK(m.has_rows);
          std::vector<Slot> rows = m.ensure_rows();
          std::sort(rows.begin(), rows.end());
          CHECK(rows == want);  // each passing row exactly once
          const Bitmap& b = m.ensure_bitmap();
          CHECK(b.size() == n && b.count() == want.size());
          for (Slot s : want) CHECK(b.test(s));
        }
      }
      // ne: rows lacking the field pass too.
      FilterMatches ne = match_filter(leaf(FilterOp::kNe, {3}), meta, live, n);
      std::vector<Slot> want_ne;
      for (std::size_t i = 0; i < n; ++i) {
        if (live.test(i) && !(valid[i] && val[i] == 3)) want_ne.push_back(static_cast<Slot>(i));
      }
      std::vector<Slot> ne_rows = ne.ensure_rows();
      std::sort(ne_rows.begin(), ne_rows.end());
      CHECK(ne.count == want_ne.size() && ne_rows == want_ne);
    }
  }
  // to_slots on dense and sparse words, and a wrong count never writes past its buffer.
  Bitmap b(200);
  for (std::size_t i : {0, 1, 2, 3, 63, 64, 100, 127, 128, 129, 199}) b.set(i);
  const std::vector<std::uint32_t> want = {0, 1, 2, 3, 63, 64, 100, 127, 128, 129, 199};
  CHECK(b.to_slots(b.count()) == want);
  CHECK(b.to_slots(3).size() == 3);
  CHECK(b.to_slots(0).empty());
}

// IdMap against std::map under random inserts, erases (backward shift) and lookups, with ids
// that collide in the low bits and slots reused LIFO as VectorStore reuses them.
void test_id_map_agrees_with_oracle() {
  using namespace kbcore;
  std::mt19937_64 rng(11);
  for (const std::int64_t spread : {std::int64_t{64}, std::int64_t{1} << 40}) {
    IdMap map;
    std::map<std::int64_t, Slot> oracle;
    std::vector<std::int64_t> ids;  // id per slot
    std::vector<Slot> free;
    for (int step = 0; step < 200000; ++step) {
      const std::int64_t id = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(spread)) * 1024 - spread;
      const auto it = oracle.find(id);
      const auto got = map.find(id, ids.data());
      CHECK(got.has_value() == (it != oracle.end()));
      if (got) CHECK(*got == it->second);
      if (it == oracle.end() && rng() % 3 != 0) {
        Slot s;
        if (!free.empty()) {
          s = free.back();
          free.pop_back();
        } else {
          s = static_cast<Slot>(ids.size());
          ids.push_back(0);
        }
        ids[s] = id;
        map.insert(id, s, ids.data());
        oracle.emplace(id, s);
      } else if (it != oracle.end()) {
        CHECK(map.erase(id, ids.data()));
        free.push_back(it->second);
        oracle.erase(it);
        CHECK(!map.find(id, ids.data()));
      }
      CHECK(map.size() == oracle.size());
    }
    for (const auto& [id, s] : oracle) {
      const auto got = map.find(id, ids.data());
      CHECK(got && *got == s);
    }
    CHECK(!map.erase(spread * 4096 + 7, ids.data()));
    CHECK(map.bucket_count() >= 2 * map.size());
  }
}

int main() {
  const std::pair<const char*, void (*)()> tests[] = {
      {"kernels_agree_with_scalar", test_kernels_agree_with_scalar},
      {"hnsw_recall_delete_and_reload", test_hnsw_recall_delete_and_reload},
      {"flat_is_exact_and_filters", test_flat_is_exact_and_filters},
      {"iso8601", test_iso8601},
      {"bad_input_changes_nothing", test_bad_input_changes_nothing},
      {"match_filter_agrees_with_oracle", test_match_filter_agrees_with_oracle},
      {"id_map_agrees_with_oracle", test_id_map_agrees_with_oracle},
  };
  for (const auto& [name, fn] : tests) {
    try {
      fn();
      ++g_passed;
      std::printf("PASS %s\n", name);
    } catch (const std::exception& e) {
      ++g_failed;
      std::printf("FAIL %s: %s\n", name, e.what());
    }
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
