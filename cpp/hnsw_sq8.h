#pragma once
// Graph search on SQ8 codes (sq8_codes.h) with an exact float32 re-rank.
//
// The graph is the float32 index's graph (construction and repair run on the float32 rows,
// so a quantized index links exactly the nodes a float32 one would). A query walks the upper
// levels and level 0 scoring each visited node from its code (stride bytes, a quarter of the
// float32 row), keeps the usual candidate list of ef, and then re-scores the best `rerank`
// of that list exactly from the float32 rows: the rows it reads are few and the order it
// returns is the exact one.
#include <algorithm>
#include <vector>

#include "flat_index.h"
#include "hnsw_index.h"
#include "sq8_codes.h"

namespace kbcore {

/// Exact distances of the first min(depth, cands.size()) candidates (any order), sorted
/// ascending and cut to k. O(depth * dim).
std::vector<Scored> rerank_exact(const VectorStore& store, Metric metric, const float* q,
                                 std::vector<Scored> cands, std::size_t depth, std::size_t k);

/// The k nearest of `slots` by an SQ8 scan of their codes, re-ranked exactly over the best
/// max(rerank, k) of them. O(|slots| * stride + rerank * dim).
std::vector<Scored> scan_slots_sq8(const VectorStore& store, const Sq8Codes& codes, Metric metric,
                                   const float* q, const std::vector<Slot>& slots, std::size_t k,
                                   std::size_t rerank);

/// Traversal of an HnswIndex on codes (a friend of HnswIndex: it reads the link lists).
class HnswSq8Search {
 public:
  /// k nearest slots to q (prepared: normalised for cosine), ascending by exact distance.
  /// The level-0 candidate list holds max(ef, k, rerank); its best max(rerank, k) are re-ranked.
  /// `accept` admits slots to the results (the walk strategy of filtered search).
  template <typename Accept>
  static std::vector<Scored> search(const HnswIndex& g, const Sq8Codes& codes, const float* q, std::size_t k,
                                    std::size_t ef, std::size_t rerank, const Accept& accept,
                                    std::size_t* evals = nullptr);

 private:
  template <typename Accept>
  static std::vector<Scored> layer0(const HnswIndex& g, const Sq8Codes& codes, const Sq8Kernels& kern,
                                    const Sq8Query& pq, Scored ep, std::size_t ef, const Accept& accept,
                                    std::size_t* evals);
  static void score(const Sq8Codes& codes, const Sq8Kernels& kern, const Sq8Query& pq, const std::uint32_t* slots,
                    std::size_t m, float* out) {
    for (std::size_t j = 0; j < m; j += 4) {
      const std::size_t last = m - 1;
      const std::uint32_t four[4] = {slots[j], slots[std::min(j + 1, last)], slots[std::min(j + 2, last)],
                                     slots[std::min(j + 3, last)]};
      float d[4];
      codes.distance4(kern, pq, four, d);
      for (std::size_t t = j; t < std::min(m, j + 4); ++t) out[t] = d[t - j];
    }
  }
};

// ---- template implementation -------------------------------------------------------------

template <typename Accept>
std::vector<Scored> HnswSq8Search::layer0(const HnswIndex& g, const Sq8Codes& codes, const Sq8Kernels& kern,
                                          const Sq8Query& pq, Scored ep, std::size_t ef, const Accept& accept,
                                          std::size_t* evals) {
  auto visited = g.visited_.acquire(g.levels_.size());
  thread_local std::vector<Scored> candidates;
  candidates.clear();
  std::vector<Scored> results;
  results.reserve(ef + 1);
  const auto push_result = [&](const Scored& s) {
    results.push_back(s);
    std::push_heap(results.begin(), results.end());
    if (results.size() > ef) {
      std::pop_heap(results.begin(), results.end());
      results.pop_back();
    }
  };
  visited->test_and_set(ep.slot);
  candidates.push_back(ep);
  if (accept(ep.slot)) push_result(ep);
  const std::size_t stride = codes.stride();
  std::uint32_t fresh[4 + 2 * 256];
  float dists[4 + 2 * 256];
  while (!candidates.empty()) {
    const Scored c = candidates.front();
    if (results.size() >= ef && c.dist > results.front().dist) break;
    std::pop_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
    candidates.pop_back();
    if (!candidates.empty()) prefetch_l1(g.links(candidates.front().slot, 0));
    const std::uint32_t* src = g.links(c.slot, 0);
    const std::size_t count = src[0];
    std::size_t m = 0;
    for (std::size_t j = 0; j < count; ++j) {
      const Slot n = src[1 + j];
      if (visited->test_and_set(n)) continue;
      prefetch_row_l2(codes.code(n), stride);
      fresh[m++] = n;
    }
    score(codes, kern, pq, fresh, m, dists);
    if (evals != nullptr) *evals += m;
    for (std::size_t j = 0; j < m; ++j) {
      const float d = dists[j];
      if (results.size() < ef || d < results.front().dist) {
        candidates.push_back({d, fresh[j]});
        std::push_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
        prefetch_l1(g.links(fresh[j], 0));
        if (accept(fresh[j])) push_result({d, fresh[j]});
      }
    }
  }
  return results;  // heap order; the caller re-ranks
}

template <typename Accept>
std::vector<Scored> HnswSq8Search::search(const HnswIndex& g, const Sq8Codes& codes, const float* q, std::size_t k,
                                          std::size_t ef, std::size_t rerank, const Accept& accept,
                                          std::size_t* evals) {
  if (g.entry_ == kNoSlot || k == 0) return {};
  const Sq8Kernels& kern = sq8_active_kernels();
  thread_local Sq8Query pq;
  codes.prepare(q, pq);
  Scored cur{codes.distance(kern, pq, g.entry_), g.entry_};
  float d[4 + 2 * 256];
  for (int level = g.max_level_; level > 0; --level) {
    bool changed = true;
    while (changed) {
      changed = false;
      const std::uint32_t* src = g.links(cur.slot, level);
      const std::size_t count = src[0];
      for (std::size_t j = 0; j < count; ++j) prefetch_row_l2(codes.code(src[1 + j]), codes.stride());
      score(codes, kern, pq, src + 1, count, d);
      for (std::size_t j = 0; j < count; ++j) {
        if (d[j] < cur.dist) {
          cur = {d[j], src[1 + j]};
          changed = true;
        }
      }
    }
  }
  const std::size_t depth = std::max(rerank, k);
  std::vector<Scored> res = layer0(g, codes, kern, pq, cur, std::max({ef, k, depth}), accept, evals);
  return rerank_exact(g.store_, g.metric_, q, std::move(res), depth, k);
}

}  // namespace kbcore
