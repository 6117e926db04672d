// Exact re-ranks of a quantized search (hnsw_codes.h).
#include "hnsw_codes.h"

#include <algorithm>
#include <cmath>

namespace kbcore {

std::vector<Scored> rerank_exact(const VectorStore& store, Metric metric, const float* q, std::vector<Scored> cands,
                                 std::size_t depth, std::size_t k) {
  if (cands.size() > depth) {
    std::nth_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(depth), cands.end());
    cands.resize(depth);
  }
  SearchScratch& scratch = search_scratch();
  std::vector<Slot>& slots = scratch.rerank_slots;
  std::vector<float>& d = scratch.rerank_dists;
  slots.resize(cands.size());
  d.resize(cands.size());
  for (std::size_t i = 0; i < cands.size(); ++i) slots[i] = cands[i].slot;
  score_slots(store, metric, q, slots.data(), slots.size(), d.data());
  for (std::size_t i = 0; i < cands.size(); ++i) cands[i].dist = d[i];
  const std::size_t keep = std::min(k, cands.size());
  std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(keep), cands.end());
  cands.resize(keep);
  return cands;
}

std::vector<Scored> rerank_bounded(const VectorStore& store, const RabitqCodes& codes, const RabitqQuery& pq,
                                   Metric metric, const float* q, std::vector<Scored> cands, std::size_t depth,
                                   std::size_t k) {
  if (cands.size() > depth) {
    std::nth_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(depth), cands.end());
    cands.resize(depth);
  }
  // Lower bounds, ascending: a row whose lower bound exceeds the k-th exact distance found so
  // far cannot enter the top k, nor can any row after it.
  for (Scored& c : cands) c.dist -= codes.error_bound(pq, c.slot);
  std::sort(cands.begin(), cands.end());
  SearchScratch& scratch = search_scratch();
  std::vector<Slot>& slots = scratch.rerank_slots;
  std::vector<float>& d = scratch.rerank_dists;
  // Rows are read in blocks (score_slots prefetches within a block); the bound is tested
  // before each block against the k-th exact distance of the blocks before it.
  constexpr std::size_t kBlock = 8;
  std::vector<Scored> best;  // a max-heap of the k best exact
  best.reserve(k + 1);
  for (std::size_t i = 0; i < cands.size(); i += kBlock) {
    const bool full = best.size() >= k;
    const float worst = full ? best.front().dist : INFINITY;
    if (full && cands[i].dist > worst) break;
    const std::size_t end = std::min(cands.size(), i + kBlock);
    slots.clear();
    for (std::size_t j = i; j < end; ++j) {
      if (!(cands[j].dist > worst)) slots.push_back(cands[j].slot);
    }
    d.resize(slots.size());
    score_slots(store, metric, q, slots.data(), slots.size(), d.data());
    for (std::size_t j = 0; j < slots.size(); ++j) {
      const Scored e{d[j], slots[j]};
      if (best.size() < k) {
        best.push_back(e);
        std::push_heap(best.begin(), best.end());
      } else if (e < best.front()) {
        detail::heap_replace_top(best.data(), best.size(), e);
      }
    }
  }
  std::sort_heap(best.begin(), best.end());
  return best;
}

}  // namespace kbcore
