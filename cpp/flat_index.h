#pragma once
// Exact search by scanning every live row. Rows are scanned in blocks that stay in cache
// while every query of a batch is scored against them, so a batch reads memory once per block
// rather than once per query.
#include <cstdint>
#include <vector>

#include "distance.h"
#include "topk.h"
#include "vector_store.h"

namespace kbcore {

inline void detail_prefetch(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}

/// Scores queries [nq x dim] against every live row of `store` and keeps the k best per
/// query, ascending, ties by slot. `accept(slot)` filters rows (AcceptAll for none).
/// Single-threaded; callers split queries across threads. O(nq * n * dim).
template <typename Accept>
std::vector<std::vector<Scored>> flat_search(const VectorStore& store, Metric metric,
                                             const float* queries, std::size_t nq, std::size_t k,
                                             const Accept& accept) {
  const Kernels& kern = active_kernels();
  const std::size_t dim = store.dim();
  const std::size_t n = store.slot_count();
  // ~256 KiB of rows per block: fits L2 on every x86 and Arm core of the last decade.
  const std::size_t block = std::max<std::size_t>(16, (256 * 1024) / (dim * sizeof(float)));
  std::vector<TopK> heaps;
  heaps.reserve(nq);
  for (std::size_t i = 0; i < nq; ++i) heaps.emplace_back(k);
  std::vector<float> scores(block);
  for (std::size_t b0 = 0; b0 < n; b0 += block) {
    const std::size_t bn = std::min(block, n - b0);
    const float* rows = store.data() + b0 * dim;
    for (std::size_t qi = 0; qi < nq; ++qi) {
      const float* q = queries + qi * dim;
      std::size_t r = 0;
      for (; r + 4 <= bn; r += 4) {
        const float* four[4] = {rows + r * dim, rows + (r + 1) * dim, rows + (r + 2) * dim,
                                rows + (r + 3) * dim};
        distance4(kern, metric, q, four, dim, scores.data() + r);
      }
      for (; r < bn; ++r) scores[r] = distance(kern, metric, q, rows + r * dim, dim);
      TopK& heap = heaps[qi];
      for (r = 0; r < bn; ++r) {
        const float d = scores[r];
        const Slot s = static_cast<Slot>(b0 + r);
        if (d <= heap.worst() && store.is_live(s) && accept(s)) heap.push(d, s);
      }
    }
  }
  std::vector<std::vector<Scored>> out;
  out.reserve(nq);
  for (auto& h : heaps) out.push_back(h.take_sorted());
  return out;
}

/// The k nearest of the given slots to one prepared query, ascending. O(|slots| * dim).
inline std::vector<Scored> scan_slots(const VectorStore& store, Metric metric, const float* q,
                                      const std::vector<Slot>& slots, std::size_t k) {
  const Kernels& kern = active_kernels();
  const std::size_t dim = store.dim();
  TopK heap(k);
  float d[4];
  std::size_t i = 0;
  for (; i + 4 <= slots.size(); i += 4) {
    const float* rows[4] = {store.vector(slots[i]), store.vector(slots[i + 1]), store.vector(slots[i + 2]),
                            store.vector(slots[i + 3])};
    if (i + 8 <= slots.size()) {
      for (int j = 4; j < 8; ++j) detail_prefetch(store.vector(slots[i + j]));
    }
    distance4(kern, metric, q, rows, dim, d);
    for (int j = 0; j < 4; ++j) {
      if (d[j] <= heap.worst()) heap.push(d[j], slots[i + j]);
    }
  }
  for (; i < slots.size(); ++i) {
    const float x = distance(kern, metric, q, store.vector(slots[i]), dim);
    if (x <= heap.worst()) heap.push(x, slots[i]);
  }
  return heap.take_sorted();
}

}  // namespace kbcore
