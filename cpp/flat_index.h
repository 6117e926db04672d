#pragma once
// Exact search by scanning every live row. Rows are scanned in blocks that stay in cache
// while every query of a batch is scored against them, so a batch reads memory once per block
// rather than once per query.
#include <cstdint>
#include <vector>

#include "distance.h"
#include "prefetch.h"
#include "topk.h"
#include "vector_store.h"

namespace kbcore {

/// Scores queries [nq x dim] against every live row of `store` and keeps the k best per
/// query, ascending, ties by slot. `accept(slot)` filters rows (AcceptAll for none).
/// Single-threaded; callers split queries across threads. O(nq * n * dim).
template <typename Accept>
std::vector<std::vector<Scored>> flat_search(const VectorStore& store, Metric metric, const float* queries,
                                             std::size_t nq, std::size_t k, const Accept& accept) {
  const Kernels& kern = active_kernels();
  const std::size_t dim = store.dim();
  const std::size_t n = store.slot_count();
  // ~256 KiB of rows per block: fits L2 on every x86 and Arm core of the last decade.
  const std::size_t block = std::max<std::size_t>(16, (256 * 1024) / (dim * sizeof(float)));
  std::vector<TopK> heaps;
  heaps.reserve(nq);
  for (std::size_t i = 0; i < nq; ++i) heaps.emplace_back(k);
  std::vector<float> scores(block);
  // Scores for up to four queries against one block: scores[4 * block] (query-major).
  scores.resize(4 * block);
  const auto admit = [&](std::size_t qi, const float* d, std::size_t b0, std::size_t bn) {
    TopK& heap = heaps[qi];
    for (std::size_t r = 0; r < bn; ++r) {
      const Slot s = static_cast<Slot>(b0 + r);
      if (d[r] <= heap.worst() && store.is_live(s) && accept(s)) heap.push(d[r], s);
    }
  };
  // Inner-product metrics with a panel kernel and enough queries to amortise packing: rows
  // are packed 32 at a time, transposed, and every query group is multiplied against them.
  if (metric != Metric::kL2 && kern.dot_panel != nullptr && nq >= 8) {
    std::vector<float> panel(kPanelRows * dim);
    std::vector<float> out(kPanelQueries * kPanelRows);
    for (std::size_t b0 = 0; b0 < n; b0 += kPanelRows) {
      const std::size_t bn = std::min(kPanelRows, n - b0);
      std::fill(panel.begin(), panel.end(), 0.0f);
      for (std::size_t r = 0; r < bn; ++r) {
        const float* row = store.data() + (b0 + r) * dim;
        for (std::size_t d = 0; d < dim; ++d) panel[d * kPanelRows + r] = row[d];
      }
      for (std::size_t qi = 0; qi < nq; qi += kPanelQueries) {
        const std::size_t m = std::min(kPanelQueries, nq - qi);
        const float* qs[kPanelQueries];
        for (std::size_t a = 0; a < kPanelQueries; ++a) qs[a] = queries + std::min(qi + a, nq - 1) * dim;
        kern.dot_panel(qs, m, panel.data(), dim, out.data());
        for (std::size_t a = 0; a < m; ++a) {
          // distance = 1 - dot enters the heap when dot >= 1 - worst: test the raw dot
          // against that bar and convert only the (few) rows that pass it.
          const float* d = out.data() + kPanelRows * a;
          TopK& heap = heaps[qi + a];
          float bar = 1.0f - heap.worst();
          for (std::size_t r = 0; r < bn; ++r) {
            if (d[r] < bar) continue;
            const Slot s = static_cast<Slot>(b0 + r);
            if (!store.is_live(s) || !accept(s)) continue;
            heap.push(1.0f - d[r], s);
            bar = 1.0f - heap.worst();
          }
        }
      }
    }
    std::vector<std::vector<Scored>> result;
    result.reserve(nq);
    for (auto& h : heaps) result.push_back(h.take_sorted());
    return result;
  }
  for (std::size_t b0 = 0; b0 < n; b0 += block) {
    const std::size_t bn = std::min(block, n - b0);
    const float* rows = store.data() + b0 * dim;
    std::size_t qi = 0;
    // Four queries at a time: 4 x 4 tiles of (query, row) pairs.
    for (; qi + 4 <= nq; qi += 4) {
      const float* q4[4] = {queries + qi * dim, queries + (qi + 1) * dim, queries + (qi + 2) * dim,
                            queries + (qi + 3) * dim};
      std::size_t r = 0;
      float tile[16];
      for (; r + 4 <= bn; r += 4) {
        const float* r4[4] = {rows + r * dim, rows + (r + 1) * dim, rows + (r + 2) * dim, rows + (r + 3) * dim};
        if (metric == Metric::kL2) {
          kern.l2sq4x4(q4, r4, dim, tile);
        } else {
          kern.dot4x4(q4, r4, dim, tile);
          for (float& t : tile) t = 1.0f - t;
        }
        for (int a = 0; a < 4; ++a) {
          for (int b = 0; b < 4; ++b) scores[a * block + r + b] = tile[4 * a + b];
        }
      }
      for (; r < bn; ++r) {
        for (int a = 0; a < 4; ++a) scores[a * block + r] = distance(kern, metric, q4[a], rows + r * dim, dim);
      }
      for (int a = 0; a < 4; ++a) admit(qi + a, scores.data() + a * block, b0, bn);
    }
    for (; qi < nq; ++qi) {
      const float* q = queries + qi * dim;
      std::size_t r = 0;
      for (; r + 4 <= bn; r += 4) {
        const float* four[4] = {rows + r * dim, rows + (r + 1) * dim, rows + (r + 2) * dim, rows + (r + 3) * dim};
        distance4(kern, metric, q, four, dim, scores.data() + r);
      }
      for (; r < bn; ++r) scores[r] = distance(kern, metric, q, rows + r * dim, dim);
      admit(qi, scores.data(), b0, bn);
    }
  }
  std::vector<std::vector<Scored>> out;
  out.reserve(nq);
  for (auto& h : heaps) out.push_back(h.take_sorted());
  return out;
}

/// Distances from one prepared query to slots[0, n) into out[0, n). O(n * dim).
inline void score_slots(const VectorStore& store, Metric metric, const float* q, const Slot* slots, std::size_t n,
                        float* out) {
  const Kernels& kern = active_kernels();
  const std::size_t dim = store.dim();
  // Whole rows, kAhead rows ahead, into L2 (prefetch.h): the slots are scattered, so the
  // hardware prefetchers cannot guess them. 4, 8 and 16 rows ahead measured within noise.
  constexpr std::size_t kAhead = 8;
  const std::size_t row_bytes = dim * sizeof(float);
  const auto prefetch_row = [&](std::size_t j) { prefetch_row_l2(store.vector(slots[j]), row_bytes); };
  for (std::size_t j = 0; j < std::min(kAhead, n); ++j) prefetch_row(j);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float* rows[4] = {store.vector(slots[i]), store.vector(slots[i + 1]), store.vector(slots[i + 2]),
                            store.vector(slots[i + 3])};
    for (std::size_t j = i + kAhead; j < std::min(n, i + kAhead + 4); ++j) prefetch_row(j);
    distance4(kern, metric, q, rows, dim, out + i);
  }
  for (; i < n; ++i) out[i] = distance(kern, metric, q, store.vector(slots[i]), dim);
}

/// The k nearest of the given slots to one prepared query, ascending. O(|slots| * dim).
inline std::vector<Scored> scan_slots(const VectorStore& store, Metric metric, const float* q,
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

}  // namespace kbcore
