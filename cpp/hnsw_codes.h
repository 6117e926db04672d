#pragma once
// Graph search on compressed codes (SQ8, sq8_codes.h, or RaBitQ, rabitq_codes.h) with an exact
// float32 re-rank.
//
// The graph is the float32 index's graph (construction and repair run on the float32 rows,
// so a quantized index links exactly the nodes a float32 one would). A query walks the upper
// levels and level 0 scoring each visited node from its code row (a quarter of the float32
// row for SQ8, a sixth or less for RaBitQ), keeps the usual candidate list of ef, and then
// re-scores the best `rerank` of that list exactly from the float32 rows: the rows it reads
// are few and the order it returns is the exact one. RaBitQ's per-row error bound lets the
// re-rank skip the candidates that cannot enter the top k.
//
// The traversal is written once for both code types through CodeTraits: the prepared query
// type, the kernels, and where the thread's prepared query lives.
#include <algorithm>
#include <vector>

#include "flat_index.h"
#include "hnsw_index.h"
#include "rabitq_codes.h"
#include "search_scratch.h"
#include "sq8_codes.h"

namespace kbcore {

template <typename Codes>
struct CodeTraits;
template <>
struct CodeTraits<Sq8Codes> {
  using Query = Sq8Query;
  using Kernels = Sq8Kernels;
  static const Kernels& kernels(const Sq8Codes&) { return sq8_active_kernels(); }
  static Query& query(SearchScratch& s) { return s.sq8_query; }
  static constexpr bool kBounded = false;
};
template <>
struct CodeTraits<RabitqCodes> {
  using Query = RabitqQuery;
  using Kernels = RabitqKernels;
  static const Kernels& kernels(const RabitqCodes& c) { return c.kernels(); }
  static Query& query(SearchScratch& s) { return s.rabitq_query; }
  static constexpr bool kBounded = true;
};

/// Exact distances of the first min(depth, cands.size()) candidates (any order), sorted
/// ascending and cut to k. O(depth * dim).
std::vector<Scored> rerank_exact(const VectorStore& store, Metric metric, const float* q, std::vector<Scored> cands,
                                 std::size_t depth, std::size_t k);

/// rerank_exact for RaBitQ: the candidates (estimated distances) are read in ascending order of
/// their lower bound (estimate - error bound) and the scan stops at the first whose lower bound
/// exceeds the k-th exact distance found: the rows skipped could not enter the top k (but for
/// the bound's small failure rate). At most min(depth, cands.size()) rows are read.
std::vector<Scored> rerank_bounded(const VectorStore& store, const RabitqCodes& codes, const RabitqQuery& pq,
                                   Metric metric, const float* q, std::vector<Scored> cands, std::size_t depth,
                                   std::size_t k);

/// The k nearest of `slots` by a scan of their codes, re-ranked exactly: SQ8 over the best
/// max(rerank, k) estimates, RaBitQ over the rows its error bound cannot rule out (at most
/// max(rerank, k) of them; rerank 0: no cap). O(|slots| * stride + re-ranked rows * dim).
template <typename Codes>
std::vector<Scored> scan_slots_codes(const VectorStore& store, const Codes& codes, Metric metric, const float* q,
                                     const std::vector<Slot>& slots, std::size_t k, std::size_t rerank);

/// Traversal of an HnswIndex on codes (a friend of HnswIndex: it reads the link lists).
class HnswCodeSearch {
 public:
  /// k nearest slots to q (prepared: normalised for cosine), ascending by exact distance.
  /// The level-0 candidate list holds max(ef, k, rerank); its best max(rerank, k) are re-ranked.
  /// `accept` admits slots to the results (the walk strategy of filtered search).
  template <typename Codes, typename Accept>
  static std::vector<Scored> search(const HnswIndex& g, const Codes& codes, const float* q, std::size_t k,
                                    std::size_t ef, std::size_t rerank, const Accept& accept,
                                    std::size_t* evals = nullptr);

  /// HnswIndex::local_selectivity with the greedy descent on codes (the float32 rows, which
  /// may be on disk, are not read).
  template <typename Codes>
  static double local_selectivity(const HnswIndex& g, const Codes& codes, const float* q, const Bitmap& allowed);

  /// HnswIndex::search_expanding on codes (grouped search, and with `allowed` the two-hop
  /// filtered traversal); every result kept is re-ranked exactly, ascending.
  template <typename Codes, typename Enough>
  static std::vector<Scored> search_expanding(const HnswIndex& g, const Codes& codes, const float* q, std::size_t ef,
                                              const Bitmap* allowed, Enough enough, std::size_t* evals = nullptr);

 private:
  /// Greedy descent through the upper levels on codes; the level-0 entry point. `visited`
  /// (fresh) marks the nodes scored: a node scored once cannot beat the current node again
  /// (the current distance only decreases), so it is not scored twice; the entry point is the
  /// one a descent re-scoring every list would reach.
  template <typename Codes, typename Kernels, typename Query>
  static Scored descend(const HnswIndex& g, const Codes& codes, const Kernels& kern, const Query& pq,
                        VisitedSet& visited);
  template <typename Codes, typename Kernels, typename Query, typename Accept>
  static std::vector<Scored> layer0(const HnswIndex& g, const Codes& codes, const Kernels& kern, const Query& pq,
                                    Scored ep, std::size_t ef, const Accept& accept, VisitedSet& visited,
                                    std::size_t* evals);
  /// Scores slots[0..m) into out. slots and out hold m rounded up to four. Blocks of four go
  /// through the 4-row kernel; a last block of two or three too (the last slot repeated into
  /// the padding), a single last slot through the 1-row kernel, which reads a quarter of the
  /// block. Both give the same distance for a slot.
  template <typename Codes, typename Kernels, typename Query>
  static void score(const Codes& codes, const Kernels& kern, const Query& pq, std::uint32_t* slots, std::size_t m,
                    float* out) {
    std::size_t j = 0;
    for (; j + 4 <= m; j += 4) codes.distance4(kern, pq, slots + j, out + j);
    if (m - j == 1) {
      out[j] = codes.distance(kern, pq, slots[j]);
    } else if (m > j) {
      for (std::size_t t = m; t < j + 4; ++t) slots[t] = slots[m - 1];
      codes.distance4(kern, pq, slots + j, out + j);
    }
  }
};

namespace detail {
/// Replaces the top (largest) of a max-heap h[0..n) by s, which must not be larger than it,
/// and sifts it down: what push_heap then pop_heap of the largest would leave, in one pass.
inline void heap_replace_top(Scored* h, std::size_t n, const Scored& s) {
  std::size_t i = 0;
  for (;;) {
    std::size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && h[c] < h[c + 1]) ++c;
    if (!(s < h[c])) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = s;
}
/// The same for the min-heap of ScoredGreater: replaces the smallest by s (not smaller).
inline void min_heap_replace_top(Scored* h, std::size_t n, const Scored& s) {
  std::size_t i = 0;
  for (;;) {
    std::size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && h[c + 1] < h[c]) ++c;
    if (!(h[c] < s)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = s;
}
}  // namespace detail

// ---- template implementation -------------------------------------------------------------

template <typename Codes, typename Kernels, typename Query, typename Accept>
std::vector<Scored> HnswCodeSearch::layer0(const HnswIndex& g, const Codes& codes, const Kernels& kern, const Query& pq,
                                           Scored ep, std::size_t ef, const Accept& accept, VisitedSet& visited_set,
                                           std::size_t* evals) {
  const VisitedSet::View visited = visited_set.view();
  std::vector<Scored>& candidates = search_scratch().sq8_candidates;  // a min-heap (ScoredGreater)
  candidates.clear();
  std::vector<Scored> results;                      // a max-heap of at most ef
  results.reserve(std::min(ef, g.levels_.size()));  // it never holds more than the slots
  // Admits s (better than the worst when the list is full): a full list replaces its worst
  // in one sift, the same set push + pop would keep.
  const auto push_result = [&](const Scored& s) {
    if (results.size() < ef) {
      results.push_back(s);
      std::push_heap(results.begin(), results.end());
    } else {
      detail::heap_replace_top(results.data(), results.size(), s);
    }
  };
  visited.test_and_set(ep.slot);
  candidates.push_back(ep);
  if (accept(ep.slot)) push_result(ep);
  const std::size_t stride = codes.stride();
  // A list holds at most kMaxLinks links; score() writes whole blocks of four.
  std::uint32_t fresh[4 + kMaxLinks];
  float dists[4 + kMaxLinks];
  static_assert(sizeof(fresh) / sizeof(fresh[0]) >= kMaxLinks + 3, "fresh must hold a full list");
  while (!candidates.empty()) {
    const Scored c = candidates.front();
    if (results.size() >= ef && c.dist > results.front().dist) break;
    // c stays at the root until the first neighbour admitted replaces it (one sift instead of
    // a pop and a push); it is popped only if none is. The pop order is that of popping first:
    // the order is total (distance, then slot) and c is the smallest either way.
    const std::size_t nc = candidates.size();
    if (nc > 1) g.prefetch_links(candidates[nc > 2 && candidates[2] < candidates[1] ? 2 : 1].slot, 0);
    bool top_open = true;
    const std::uint32_t* src = g.links(c.slot, 0);
    const std::size_t count = src[0];
    std::size_t m = 0;
    for (std::size_t j = 0; j < count; ++j) {
      const Slot n = src[1 + j];
      if (visited.test_and_set(n)) continue;
      prefetch_row_l2(codes.code(n), stride);
      fresh[m++] = n;
    }
    score(codes, kern, pq, fresh, m, dists);
    if (evals != nullptr) *evals += m;
    for (std::size_t j = 0; j < m; ++j) {
      const float d = dists[j];
      if (results.size() < ef || d < results.front().dist) {
        const Scored e{d, fresh[j]};
        if (top_open) {
          detail::min_heap_replace_top(candidates.data(), candidates.size(), e);
          top_open = false;
        } else {
          candidates.push_back(e);
          std::push_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
        }
        prefetch_l1(g.links(fresh[j], 0));
        if (accept(fresh[j])) push_result(e);
      }
    }
    if (top_open) {
      std::pop_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
      candidates.pop_back();
    }
  }
  return results;  // heap order; the caller re-ranks
}

template <typename Codes, typename Kernels, typename Query>
Scored HnswCodeSearch::descend(const HnswIndex& g, const Codes& codes, const Kernels& kern, const Query& pq,
                               VisitedSet& visited_set) {
  const VisitedSet::View visited = visited_set.view();
  Scored cur{codes.distance(kern, pq, g.entry_), g.entry_};
  visited.test_and_set(g.entry_);
  std::uint32_t fresh[4 + kMaxLinks];
  float d[4 + kMaxLinks];
  const std::size_t stride = codes.stride();
  for (int level = g.max_level_; level > 0; --level) {
    bool changed = true;
    while (changed) {
      changed = false;
      const std::uint32_t* src = g.links(cur.slot, level);
      const std::size_t count = src[0];
      std::size_t m = 0;
      for (std::size_t j = 0; j < count; ++j) {
        const Slot n = src[1 + j];
        if (visited.test_and_set(n)) continue;
        prefetch_row_l2(codes.code(n), stride);
        fresh[m++] = n;
      }
      score(codes, kern, pq, fresh, m, d);
      for (std::size_t j = 0; j < m; ++j) {
        if (d[j] < cur.dist) {
          cur = {d[j], fresh[j]};
          changed = true;
        }
      }
    }
  }
  return cur;
}

template <typename Codes>
double HnswCodeSearch::local_selectivity(const HnswIndex& g, const Codes& codes, const float* q,
                                         const Bitmap& allowed) {
  if (g.entry_ == kNoSlot) return 0.0;
  auto& pq = CodeTraits<Codes>::query(search_scratch());
  codes.prepare(q, pq);
  Slot ep;
  {
    auto visited = g.visited_.acquire(g.levels_.size());  // given back before the next acquire
    ep = descend(g, codes, CodeTraits<Codes>::kernels(codes), pq, *visited).slot;
  }
  return g.local_selectivity_at(ep, allowed);
}

template <typename Codes, typename Accept>
std::vector<Scored> HnswCodeSearch::search(const HnswIndex& g, const Codes& codes, const float* q, std::size_t k,
                                           std::size_t ef, std::size_t rerank, const Accept& accept,
                                           std::size_t* evals) {
  if (g.entry_ == kNoSlot || k == 0) return {};
  const auto& kern = CodeTraits<Codes>::kernels(codes);
  auto& pq = CodeTraits<Codes>::query(search_scratch());
  codes.prepare(q, pq);
  auto visited = g.visited_.acquire(g.levels_.size());
  const Scored cur = descend(g, codes, kern, pq, *visited);
  visited->reset(g.levels_.size());  // a fresh epoch for level 0: O(1)
  const std::size_t depth = std::max(rerank, k);
  std::vector<Scored> res = layer0(g, codes, kern, pq, cur, std::max({ef, k, depth}), accept, *visited, evals);
  if constexpr (CodeTraits<Codes>::kBounded) {
    return rerank_bounded(g.store_, codes, pq, g.metric_, q, std::move(res), depth, k);
  } else {
    return rerank_exact(g.store_, g.metric_, q, std::move(res), depth, k);
  }
}

template <typename Codes, typename Enough>
std::vector<Scored> HnswCodeSearch::search_expanding(const HnswIndex& g, const Codes& codes, const float* q,
                                                     std::size_t ef, const Bitmap* allowed, Enough enough,
                                                     std::size_t* evals) {
  // HnswIndex::search_expanding with every distance taken from the codes (same traversal,
  // same two-hop expansion through failing neighbours), then an exact re-rank of the results.
  if (g.entry_ == kNoSlot) return {};
  const auto& kern = CodeTraits<Codes>::kernels(codes);
  SearchScratch& scratch = search_scratch();
  auto& pq = CodeTraits<Codes>::query(scratch);
  codes.prepare(q, pq);
  const std::size_t stride = codes.stride();
  const std::size_t limit = std::max<std::size_t>(g.store_.size(), 1);
  ef = std::min(std::max<std::size_t>(ef, 1), limit);
  const auto passes = [allowed](Slot s) { return allowed == nullptr || allowed->test(s); };
  auto visited = g.visited_.acquire(g.levels_.size());
  const Scored cur = descend(g, codes, kern, pq, *visited);
  visited->reset(g.levels_.size());  // a fresh epoch for level 0: O(1)
  std::vector<Scored>& candidates = scratch.expand_candidates;
  candidates.clear();
  std::vector<Scored> results;
  results.reserve(ef + 1);
  visited->test_and_set(cur.slot);
  candidates.push_back(cur);
  if (passes(cur.slot)) results.push_back(cur);
  const std::size_t cap = g.m0_;  // at most kMaxLinks
  std::uint32_t fresh[4 + kMaxLinks];
  float dists[4 + kMaxLinks];
  static_assert(sizeof(dists) / sizeof(dists[0]) >= kMaxLinks + 3, "dists must hold a full list");
  std::size_t n_evals = 0;
  // Nodes scored but not admitted while the list was shorter; re-offered when it grows, so
  // that resuming with a larger ef loses nothing a fresh search with that ef would find.
  // Kept per thread so that steady-state searches do not regrow it: most searches never
  // resume and only ever append here.
  std::vector<Scored>& deferred = scratch.expand_deferred;
  std::vector<Scored>& again = scratch.expand_again;
  deferred.clear();
  const auto offer = [&](const Scored& e) {
    if (results.size() < ef || e.dist < results.front().dist) {
      candidates.push_back(e);
      std::push_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
      results.push_back(e);
      std::push_heap(results.begin(), results.end());
      if (results.size() > ef) {
        std::pop_heap(results.begin(), results.end());
        deferred.push_back(results.back());
        results.pop_back();
      }
    } else {
      deferred.push_back(e);
    }
  };
  for (;;) {
    const bool converged =
        candidates.empty() || (results.size() >= ef && candidates.front().dist > results.front().dist);
    if (converged) {
      if (ef >= limit || (candidates.empty() && deferred.empty())) break;
      if (enough(results)) break;
      ef = std::min(limit, ef * 2);  // resume from the same frontier with a longer list
      again.clear();
      again.swap(deferred);
      for (const Scored& e : again) offer(e);
      continue;
    }
    const Scored c = candidates.front();
    std::pop_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
    candidates.pop_back();
    if (!candidates.empty()) g.prefetch_links(candidates.front().slot, 0);
    const std::uint32_t* nl = g.links(c.slot, 0);
    std::size_t m = 0;
    for (std::size_t j = 0; j < nl[0] && m < cap; ++j) {
      const Slot n = nl[1 + j];
      if (!passes(n) || visited->test_and_set(n)) continue;
      prefetch_row_l2(codes.code(n), stride);
      fresh[m++] = n;
    }
    // Two hops through failing neighbours (ACORN-1), until the expansion holds 2M candidates.
    if (allowed != nullptr) {
      for (std::size_t j = 0; j < nl[0] && m < cap; ++j) {
        const Slot n = nl[1 + j];
        if (allowed->test(n) || visited->test_and_set(n)) continue;
        const std::uint32_t* nl2 = g.links(n, 0);
        for (std::size_t t = 0; t < nl2[0] && m < cap; ++t) {
          const Slot n2 = nl2[1 + t];
          if (!allowed->test(n2) || visited->test_and_set(n2)) continue;
          prefetch_row_l2(codes.code(n2), stride);
          fresh[m++] = n2;
        }
      }
    }
    score(codes, kern, pq, fresh, m, dists);
    n_evals += m;
    for (std::size_t j = 0; j < m; ++j) offer({dists[j], fresh[j]});
  }
  if (evals != nullptr) *evals += n_evals;
  // Do not keep the memory of an exhaustive expansion for the life of the thread.
  constexpr std::size_t kKeepScratch = std::size_t{1} << 16;
  if (deferred.capacity() > kKeepScratch) std::vector<Scored>().swap(deferred);
  if (again.capacity() > kKeepScratch) std::vector<Scored>().swap(again);
  // Exact distances for every result kept, ascending (the caller cuts or groups them).
  const std::size_t n = results.size();
  return rerank_exact(g.store_, g.metric_, q, std::move(results), n, n);
}

template <typename Codes>
std::vector<Scored> scan_slots_codes(const VectorStore& store, const Codes& codes, Metric metric, const float* q,
                                     const std::vector<Slot>& slots, std::size_t k, std::size_t rerank) {
  constexpr bool kBounded = CodeTraits<Codes>::kBounded;
  const std::size_t depth = std::max(rerank, k);
  // Few rows: read them exactly. (With bounds, the test is against k: the bounded scan below
  // reads only the rows that can still enter the top k, however many pass.)
  if (slots.size() <= (kBounded ? k : depth)) return scan_slots(store, metric, q, slots, k);
  const auto& kern = CodeTraits<Codes>::kernels(codes);
  auto& pq = CodeTraits<Codes>::query(search_scratch());
  codes.prepare(q, pq);
  constexpr std::size_t kAhead = 16;
  const std::size_t stride = codes.stride();
  const std::size_t n = slots.size();
  for (std::size_t j = 0; j < std::min(kAhead, n); ++j) prefetch_row_l2(codes.code(slots[j]), stride);
  // SQ8: the best `depth` estimates. RaBitQ: every row whose lower bound (estimate - bound) is
  // within the k-th smallest upper bound seen so far, a superset of the rows that can be in the
  // exact top k (but for the bound's failure rate); the re-rank reads them best bound first.
  TopK heap(kBounded ? k : depth);
  std::vector<Scored> kept;
  const auto offer = [&](float e, Slot s) {
    if constexpr (kBounded) {
      const float err = codes.error_bound(pq, s);
      if (e - err <= heap.worst()) kept.push_back({e, s});
      heap.push(e + err, s);
    } else {
      if (e <= heap.worst()) heap.push(e, s);
    }
  };
  std::size_t i = 0;
  float d[4];
  for (; i + 4 <= n; i += 4) {
    for (std::size_t j = i + kAhead; j < std::min(n, i + kAhead + 4); ++j)
      prefetch_row_l2(codes.code(slots[j]), stride);
    codes.distance4(kern, pq, slots.data() + i, d);
    for (std::size_t t = 0; t < 4; ++t) offer(d[t], slots[i + t]);
  }
  for (; i < n; ++i) offer(codes.distance(kern, pq, slots[i]), slots[i]);
  if constexpr (kBounded) {
    const float cut = heap.worst();
    std::size_t m = 0;
    for (const Scored& c : kept) {
      if (c.dist - codes.error_bound(pq, c.slot) <= cut) kept[m++] = c;
    }
    kept.resize(m);
    const std::size_t cap = rerank == 0 ? m : depth;
    return rerank_bounded(store, codes, pq, metric, q, std::move(kept), cap, k);
  } else {
    return rerank_exact(store, metric, q, heap.take_sorted(), depth, k);
  }
}

}  // namespace kbcore
