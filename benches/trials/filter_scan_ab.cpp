// A/B of the filtered exact scan (issue 28, h44), in one process, on 100k x 384 clustered unit
// rows, 10 % of the slots passing (uniform, ascending), k 10, re-rank depth 20:
//   sq8      the scan of codes as it was (prefetch_row_l2, copied below as old_scan) against
//            scan_slots_codes as hnsw_codes.h now has it (prefetch_row_pairs_l1);
//   float32  scan_slots as it was (old_scan_rows) against scan_slots now: the same code since the
//            pair prefetch measured 1.01x there and was not kept, so a control of the harness.
// Answers are checked identical (ids and distances) before timing; thread CPU time per query,
// alternating passes, medians. A trial, not part of the build; after `cmake --build build/ctest`:
//   g++ -O3 -std=c++17 -Icpp -o /tmp/ab benches/trials/filter_scan_ab.cpp build/ctest/libkbcore_core.a -lpthread
//   /tmp/ab [passes]
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "hnsw_codes.h"
#include "sq8_codes.h"
#include "vector_store.h"

using namespace kbcore;

namespace {

double thread_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// scan_slots_codes for SQ8 before this change (git show HEAD~:cpp/hnsw_codes.h).
std::vector<Scored> old_scan(const VectorStore& store, const Sq8Codes& codes, Metric metric, const float* q,
                             const std::vector<Slot>& slots, std::size_t k, std::size_t rerank) {
  const std::size_t depth = std::max(rerank, k);
  if (slots.size() <= depth) return scan_slots(store, metric, q, slots, k);
  const auto& kern = CodeTraits<Sq8Codes>::kernels(codes);
  auto& pq = code_query<Sq8Codes>(search_scratch());
  codes.prepare(q, pq);
  constexpr std::size_t kAhead = 16;
  const std::size_t stride = codes.stride();
  const std::size_t n = slots.size();
  for (std::size_t j = 0; j < std::min(kAhead, n); ++j) prefetch_row_l2(codes.code(slots[j]), stride);
  TopK heap(depth);
  std::size_t i = 0;
  float d[4];
  for (; i + 4 <= n; i += 4) {
    for (std::size_t j = i + kAhead; j < std::min(n, i + kAhead + 4); ++j)
      prefetch_row_l2(codes.code(slots[j]), stride);
    codes.distance4(kern, pq, slots.data() + i, d);
    for (std::size_t t = 0; t < 4; ++t) {
      if (d[t] <= heap.worst()) heap.push(d[t], slots[i + t]);
    }
  }
  for (; i < n; ++i) {
    const float e = codes.distance(kern, pq, slots[i]);
    if (e <= heap.worst()) heap.push(e, slots[i]);
  }
  return rerank_exact(store, metric, q, heap.take_sorted(), depth, k);
}

// scan_slots (float32 rows) before this change.
std::vector<Scored> old_scan_rows(const VectorStore& store, Metric metric, const float* q,
                                  const std::vector<Slot>& slots, std::size_t k) {
  TopK heap(k);
  constexpr std::size_t kBlock = 256;
  float d[kBlock];
  for (std::size_t b = 0; b < slots.size(); b += kBlock) {
    const std::size_t n = std::min(kBlock, slots.size() - b);
    score_slots(store, metric, q, slots.data() + b, n, d);
    for (std::size_t j = 0; j < n; ++j) {
      if (d[j] <= heap.worst()) heap.push(d[j], slots[b + j]);
    }
  }
  return heap.take_sorted();
}

}  // namespace

int main(int argc, char** argv) {
  const int passes = argc > 1 ? std::atoi(argv[1]) : 7;
  constexpr std::size_t kN = 100000, kDim = 384, kQueries = 200;
  std::mt19937 rng(7);
  std::normal_distribution<float> gauss;
  std::vector<float> centres(1000 * kDim);
  for (float& c : centres) c = gauss(rng);
  const auto draw = [&](float* out) {
    const float* c = centres.data() + (rng() % 1000) * kDim;
    float norm = 0;
    for (std::size_t d = 0; d < kDim; ++d) {
      out[d] = c[d] + gauss(rng);
      norm += out[d] * out[d];
    }
    for (std::size_t d = 0; d < kDim; ++d) out[d] /= std::sqrt(norm);
  };
  std::vector<float> rows(kN * kDim);
  for (std::size_t i = 0; i < kN; ++i) draw(rows.data() + i * kDim);
  VectorStore store(kDim);
  store.reserve_more(kN);
  for (std::size_t i = 0; i < kN; ++i) store.allocate(static_cast<std::int64_t>(i), rows.data() + i * kDim);
  Sq8Codes codes(kDim, Metric::kCosine);
  codes.train(rows.data(), kN);
  codes.resize(kN);
  for (std::size_t i = 0; i < kN; ++i) codes.encode(static_cast<std::uint32_t>(i), rows.data() + i * kDim);
  std::vector<Slot> slots;
  for (Slot s = 0; s < kN; ++s) {
    if (rng() % 10 == 0) slots.push_back(s);
  }
  std::vector<float> queries(kQueries * kDim);
  for (std::size_t i = 0; i < kQueries; ++i) draw(queries.data() + i * kDim);
  // One A/B: the answers of every query identical, then alternating timed passes.
  const auto ab = [&](const char* name, const auto& old_fn, const auto& new_fn) {
    for (std::size_t i = 0; i < kQueries; ++i) {
      const float* q = queries.data() + i * kDim;
      const auto a = old_fn(q);
      const auto b = new_fn(q);
      bool same = a.size() == b.size();
      for (std::size_t j = 0; same && j < a.size(); ++j) same = a[j].slot == b[j].slot && a[j].dist == b[j].dist;
      if (!same) {
        std::printf("%s: answers differ at query %zu\n", name, i);
        std::exit(1);
      }
    }
    std::vector<double> t_old, t_new;
    std::size_t sink = 0;
    for (int p = 0; p < passes; ++p) {
      for (int side = 0; side < 2; ++side) {
        const bool run_new = (side == 0) == (p % 2 == 0);
        const double t0 = thread_ns();
        for (std::size_t i = 0; i < kQueries; ++i) {
          const float* q = queries.data() + i * kDim;
          sink += run_new ? new_fn(q)[0].slot : old_fn(q)[0].slot;
        }
        (run_new ? t_new : t_old).push_back((thread_ns() - t0) / kQueries);
      }
    }
    std::sort(t_old.begin(), t_old.end());
    std::sort(t_new.begin(), t_new.end());
    const double mo = t_old[t_old.size() / 2], mn = t_new[t_new.size() / 2];
    std::printf("%s: old %.1f us/query (%.1f ns/row), new %.1f us/query (%.1f ns/row): old/new %.3f (sink %zu)\n", name,
                mo / 1e3, mo / slots.size(), mn / 1e3, mn / slots.size(), mo / mn, sink);
  };
  const Metric m = Metric::kCosine;
  ab(
      "sq8", [&](const float* q) { return old_scan(store, codes, m, q, slots, 10, 20); },
      [&](const float* q) { return scan_slots_codes(store, codes, m, q, slots, 10, 20); });
  ab(
      "float32", [&](const float* q) { return old_scan_rows(store, m, q, slots, 10); },
      [&](const float* q) { return scan_slots(store, m, q, slots, 10); });
  return 0;
}
