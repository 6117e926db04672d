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
  const BatchFn batch = metric == Metric::kL2 ? kern.l2sq_batch : kern.dot_batch;
  for (std::size_t b0 = 0; b0 < n; b0 += block) {
    const std::size_t bn = std::min(block, n - b0);
    const float* rows = store.data() + b0 * dim;
    for (std::size_t qi = 0; qi < nq; ++qi) {
      batch(queries + qi * dim, rows, bn, dim, scores.data());
      TopK& heap = heaps[qi];
      for (std::size_t r = 0; r < bn; ++r) {
        const float d = metric == Metric::kL2 ? scores[r] : 1.0f - scores[r];
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

}  // namespace kbcore
