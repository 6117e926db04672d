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
// The walk is graph_search.h's, shared with float32; CodeScorer is its adapter to codes, and
// CodeTraits (code_traits.h) names for each code type the prepared query type and the kernels.
#include <algorithm>
#include <vector>

#include "code_types.h"
#include "flat_index.h"
#include "graph_search.h"
#include "hnsw_index.h"
#include "search_scratch.h"

namespace kbcore {

/// The Scorer (graph_search.h) of codes: estimated distances from one query prepared into
/// `pq` (which must outlive it). Thread-safe (const).
template <typename Codes>
class CodeScorer {
 public:
  using Traits = CodeTraits<Codes>;
  CodeScorer(const Codes& codes, const typename Traits::Query& pq)
      : codes_(codes), kernels_(Traits::kernels(codes)), pq_(pq), stride_(codes.stride()) {}
  /// Estimated distance of one slot (the one-row kernel). O(stride).
  float one(Slot s) const { return codes_.distance(kernels_, pq_, s); }
  /// Scores slots[0..m) into out. slots and out hold m rounded up to four. Blocks of four go
  /// through the 4-row kernel; a last block of two or three too (the last slot repeated into
  /// the padding), a single last slot through the 1-row kernel, which reads a quarter of the
  /// block. Both give the same distance for a slot.
  void block(std::uint32_t* slots, std::size_t m, float* out) const {
    std::size_t j = 0;
    for (; j + 4 <= m; j += 4) codes_.distance4(kernels_, pq_, slots + j, out + j);
    if (m - j == 1) {
      out[j] = codes_.distance(kernels_, pq_, slots[j]);
    } else if (m > j) {
      for (std::size_t t = m; t < j + 4; ++t) slots[t] = slots[m - 1];
      codes_.distance4(kernels_, pq_, slots + j, out + j);
    }
  }
  /// Starts loading the code row of s into L2.
  void prefetch(Slot s) const { prefetch_row_l2(codes_.code(s), stride_); }

 private:
  const Codes& codes_;
  const typename Traits::Kernels& kernels_;
  const typename Traits::Query& pq_;
  std::size_t stride_;
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

/// Searches of an HnswIndex on codes: graph_search.h's walk with a CodeScorer, then the
/// exact re-rank (a friend of HnswIndex: it reads the graph's store and metric).
class HnswCodeSearch {
 public:
  /// k nearest slots to q (prepared: normalised for cosine), ascending by exact distance.
  /// The level-0 candidate list holds max(ef, k, rerank); its best max(rerank, k) are re-ranked.
  /// `accept` admits slots to the results (the walk strategy of filtered search).
  template <typename Codes, typename Accept>
  static std::vector<Scored> search(const HnswIndex& g, const Codes& codes, const float* q, std::size_t k,
                                    std::size_t ef, std::size_t rerank, const Accept& accept,
                                    std::size_t* evals = nullptr);

  /// search() counting the walk's work into `stats` (added to; Index::search_stats): the
  /// same walk and re-rank, the same results.
  template <typename Codes>
  static std::vector<Scored> search_counted(const HnswIndex& g, const Codes& codes, const float* q, std::size_t k,
                                            std::size_t ef, std::size_t rerank, WalkStats& stats);

  /// HnswIndex::search_expanding on codes (grouped search, and with `allowed` the two-hop
  /// filtered traversal); every result kept is re-ranked exactly, ascending.
  template <typename Codes, typename Enough>
  static std::vector<Scored> search_expanding(const HnswIndex& g, const Codes& codes, const float* q, std::size_t ef,
                                              const Bitmap* allowed, Enough enough, std::size_t* evals = nullptr);
};

// ---- template implementation -------------------------------------------------------------

template <typename Codes, typename Accept>
std::vector<Scored> HnswCodeSearch::search(const HnswIndex& g, const Codes& codes, const float* q, std::size_t k,
                                           std::size_t ef, std::size_t rerank, const Accept& accept,
                                           std::size_t* evals) {
  if (g.entry_ == kNoSlot || k == 0) return {};
  auto& pq = code_query<Codes>(search_scratch());
  codes.prepare(q, pq);
  const std::size_t depth = std::max(rerank, k);
  std::vector<Scored> res =
      GraphSearch::search(g, CodeScorer<Codes>(codes, pq), std::max({ef, k, depth}), accept, evals);
  if constexpr (CodeTraits<Codes>::kBounded) {
    return rerank_bounded(g.store_, codes, pq, g.metric_, q, std::move(res), depth, k);
  } else {
    return rerank_exact(g.store_, g.metric_, q, std::move(res), depth, k);
  }
}

template <typename Codes>
std::vector<Scored> HnswCodeSearch::search_counted(const HnswIndex& g, const Codes& codes, const float* q,
                                                   std::size_t k, std::size_t ef, std::size_t rerank,
                                                   WalkStats& stats) {
  if (g.entry_ == kNoSlot || k == 0) return {};
  auto& pq = code_query<Codes>(search_scratch());
  codes.prepare(q, pq);
  const std::size_t depth = std::max(rerank, k);
  std::vector<Scored> res =
      GraphSearch::search_counted(g, CodeScorer<Codes>(codes, pq), std::max({ef, k, depth}), AcceptAll{}, stats);
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
  if (g.entry_ == kNoSlot) return {};
  auto& pq = code_query<Codes>(search_scratch());
  codes.prepare(q, pq);
  std::vector<Scored> results = GraphSearch::expanding(g, CodeScorer<Codes>(codes, pq), ef, allowed, enough, evals);
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
  auto& pq = code_query<Codes>(search_scratch());
  codes.prepare(q, pq);
  // Reading the scattered code rows is the cost (docs/filter-ir.md, "The exact scan"): each is
  // requested kAhead rows before it is scored, into L1, one pair of lines at a time (12, 16 and
  // 24 rows ahead measured within noise).
  constexpr std::size_t kAhead = 16;
  const std::size_t stride = codes.stride();
  const std::size_t n = slots.size();
  for (std::size_t j = 0; j < std::min(kAhead, n); ++j) prefetch_row_pairs_l1(codes.code(slots[j]), stride);
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
      prefetch_row_pairs_l1(codes.code(slots[j]), stride);
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
