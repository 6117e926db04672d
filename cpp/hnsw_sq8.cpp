// Exact re-rank and the SQ8 scan of a slot list (hnsw_sq8.h).
#include "hnsw_sq8.h"

namespace kbcore {

std::vector<Scored> rerank_exact(const VectorStore& store, Metric metric, const float* q, std::vector<Scored> cands,
                                 std::size_t depth, std::size_t k) {
  if (cands.size() > depth) {
    std::nth_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(depth), cands.end());
    cands.resize(depth);
  }
  SearchScratch& scratch = search_scratch();
  std::vector<Slot>& slots = scratch.sq8_rerank_slots;
  std::vector<float>& d = scratch.sq8_rerank_dists;
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

std::vector<Scored> scan_slots_sq8(const VectorStore& store, const Sq8Codes& codes, Metric metric, const float* q,
                                   const std::vector<Slot>& slots, std::size_t k, std::size_t rerank) {
  const std::size_t depth = std::max(rerank, k);
  if (slots.size() <= depth) return scan_slots(store, metric, q, slots, k);
  const Sq8Kernels& kern = sq8_active_kernels();
  Sq8Query& pq = search_scratch().sq8_query;
  codes.prepare(q, pq);
  TopK heap(depth);
  constexpr std::size_t kAhead = 16;
  const std::size_t stride = codes.stride();
  const std::size_t n = slots.size();
  for (std::size_t j = 0; j < std::min(kAhead, n); ++j) prefetch_row_l2(codes.code(slots[j]), stride);
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

}  // namespace kbcore
