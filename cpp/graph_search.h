#pragma once
// The HNSW search walk, written once for every row representation: the greedy descent through
// the upper levels and the level-0 beam search (Malkov & Yashunin 2018, Algorithms 2 and 5),
// and the expanding level-0 search of grouped search, which with a bitmap is the two-hop
// filtered traversal (ACORN-1, Patel et al., SIGMOD 2024). Construction keeps its own locked
// walk (HnswIndex::greedy / search_layer); every search goes through here.
//
// The walk is a template over a Scorer (faiss's DistanceComputer, as a compile-time concept so
// that the hot loop makes no virtual call): a query-bound object providing
//   float one(Slot s) const;                        the distance of one slot
//   void block(std::uint32_t* slots, std::size_t m, float* out) const;
//                                                   the distances of slots[0..m) into out;
//                                                   slots and out hold m rounded up to four
//                                                   (block may write the padding of slots)
//   void prefetch(Slot s) const;                    starts loading what scoring s reads
// Its adapters: RowScorer (float32 rows, row_scorer.h) and CodeScorer<Codes> (hnsw_codes.h).
// The walk takes the scorer by value (a few pointers): a local copy stays in registers across
// the kernel calls, where members reached through a reference are reloaded after each.
// Results come back in heap order with the scorer's distances; the caller sorts them (float32)
// or re-ranks them exactly (codes).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "bitmap.h"
#include "hnsw_index.h"
#include "search_scratch.h"
#include "topk.h"
#include "visited_pool.h"

namespace kbcore {

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

/// Work counts of one search walk (the debug statistics of Index::search_stats): hops are
/// the level-0 nodes expanded (link lists read), upper_hops the link lists the greedy descent
/// read, scored the distances evaluated (code or row scores, descent and level 0).
struct WalkStats {
  std::uint64_t hops = 0;
  std::uint64_t upper_hops = 0;
  std::uint64_t scored = 0;
};

namespace detail {
/// The counter of the walks: a template argument, so that the walk of ordinary searches
/// (kOn false) compiles to no counting at all and only the statistics entry point pays.
template <bool kOn>
struct WalkCounter {
  WalkStats* stats;
  void hop() const {
    if constexpr (kOn) ++stats->hops;
  }
  void upper_hop() const {
    if constexpr (kOn) ++stats->upper_hops;
  }
  void scored(std::size_t m) const {
    if constexpr (kOn) stats->scored += m;
  }
};
}  // namespace detail

/// The beam of the descent at level 1 is ef / g_upper_beam_divisor in a graph of at least
/// g_upper_beam_min_slots slots, and the wider ef / g_upper_beam_wide_divisor in a graph of at
/// least g_upper_beam_wide_min_slots (wide divisor 0: no wider tier); searches whose beam
/// would be below 2, and every search of a smaller graph, descend greedily (divisor 0:
/// always). Process-wide, for measurements and tests (`_core._set_upper_beam`); see
/// GraphSearch::descend and GraphSearch::upper_beam.
inline std::atomic<std::uint32_t> g_upper_beam_divisor{8};
inline std::atomic<std::size_t> g_upper_beam_min_slots{50'000};
inline std::atomic<std::uint32_t> g_upper_beam_wide_divisor{4};
inline std::atomic<std::size_t> g_upper_beam_wide_min_slots{500'000};

/// The search walk over an HnswIndex (a friend: it reads the link lists). Every function is
/// thread-safe against other searches (per-thread scratch, pooled visited sets).
class GraphSearch {
 public:
  /// The level-0 entry point of a query: the greedy descent through the upper levels.
  /// The graph must not be empty. O(levels * M) distances.
  template <typename Scorer>
  static Slot entry_point(const HnswIndex& g, Scorer sc) {
    auto visited = g.visited_.acquire(g.levels_.size());
    return descend(g, sc, *visited, /*beam=*/1, detail::WalkCounter<false>{nullptr}).slot;
  }

  /// Descent, then the level-0 search with a candidate list of ef; `accept` admits slots to
  /// the results (the walk still crosses rejected nodes). The graph must not be empty.
  /// Returns at most ef results in heap order. O(ef log ef * M) distances typical.
  template <typename Scorer, typename Accept>
  static std::vector<Scored> search(const HnswIndex& g, Scorer sc, std::size_t ef, const Accept& accept,
                                    std::size_t* evals) {
    return walk(g, sc, ef, accept, evals, detail::WalkCounter<false>{nullptr});
  }

  /// search() counting its work into `stats` (added to; the debug statistics): the same
  /// walk, the same results.
  template <typename Scorer, typename Accept>
  static std::vector<Scored> search_counted(const HnswIndex& g, Scorer sc, std::size_t ef, const Accept& accept,
                                            WalkStats& stats) {
    return walk(g, sc, ef, accept, nullptr, detail::WalkCounter<true>{&stats});
  }

  /// Descent, then a level-0 search whose candidate list starts at ef (clamped to [1, rows])
  /// and doubles whenever the search converges before enough(results) holds (results in heap
  /// order), until the reachable graph is exhausted. With `allowed`, only passing slots are
  /// scored, and a failing neighbour's own neighbours are (two hops, at most 2M per
  /// expansion). The graph must not be empty. Returns every result kept, in heap order.
  template <typename Scorer, typename Enough>
  static std::vector<Scored> expanding(const HnswIndex& g, Scorer sc, std::size_t ef, const Bitmap* allowed,
                                       Enough enough, std::size_t* evals);

 private:
  /// The descent through the upper levels; the level-0 entry point. Greedy (one current
  /// node, Malkov & Yashunin's ef = 1) down to level 2; at level 1, with beam > 1, a beam
  /// search keeping the `beam` best, whose best is the entry point. On clustered data at
  /// scale the greedy walk of the sparse upper levels stops in a local minimum, often in
  /// another cluster, and level 0 then spends its candidate list walking back (synthetic 1M:
  /// recall 0.873 at ef 64 greedy, 0.936 with a beam of ef / 8; docs/graph-quality.md).
  /// `visited` (fresh) marks the nodes scored: a node scored once cannot beat the current
  /// node again (the current distance only decreases), so it is not scored twice.
  template <typename Scorer, typename Counter = detail::WalkCounter<false>>
  static Scored descend(const HnswIndex& g, Scorer sc, VisitedSet& visited, std::size_t beam,
                        Counter count = {nullptr});
  /// The level-1 beam width of a search of g with candidate list ef (g_upper_beam_*). In
  /// small graphs the greedy descent already lands beside the query and a beam only adds
  /// distances (SciFact, 19k rows: 5 % more at recall 0.99); the larger the graph, the wider
  /// the beam that pays (synthetic 1M: ef / 4 beats ef / 8, which beats it at 100k).
  static std::size_t upper_beam(const HnswIndex& g, std::size_t ef) {
    const std::uint32_t d = g_upper_beam_divisor.load(std::memory_order_relaxed);
    const std::size_t slots = g.levels_.size();
    if (d == 0 || slots < g_upper_beam_min_slots.load(std::memory_order_relaxed)) return 1;
    const std::uint32_t wide = g_upper_beam_wide_divisor.load(std::memory_order_relaxed);
    if (wide != 0 && slots >= g_upper_beam_wide_min_slots.load(std::memory_order_relaxed)) return ef / wide;
    return ef / d;
  }
  template <typename Scorer, typename Accept, typename Counter>
  static std::vector<Scored> walk(const HnswIndex& g, Scorer sc, std::size_t ef, const Accept& accept,
                                  std::size_t* evals, Counter count) {
    auto visited = g.visited_.acquire(g.levels_.size());
    const Scored ep = descend(g, sc, *visited, upper_beam(g, ef), count);
    visited->reset(g.levels_.size());  // a fresh epoch for level 0: O(1)
    if constexpr (std::is_same_v<Accept, AcceptAll>) {
      if (ef <= kPoolMaxEf) return layer0_pool(g, sc, ep, ef, *visited, evals, count);
    }
    return layer0(g, sc, ep, ef, accept, *visited, evals, count);
  }
  /// The longest candidate list layer0_pool keeps sorted (an insertion moves up to this many
  /// entries); longer lists use the heaps of layer0.
  static constexpr std::size_t kPoolMaxEf = 1024;
  /// The nodes the near probe of layer0 counts (the first it expands).
  static constexpr std::size_t kNearProbe = 32;
  template <typename Scorer, typename Accept, typename Counter>
  static std::vector<Scored> layer0(const HnswIndex& g, Scorer sc, Scored ep, std::size_t ef, const Accept& accept,
                                    VisitedSet& visited, std::size_t* evals, Counter count);
  /// The two-hop traversal's near probe (run by expanding() with `allowed` when
  /// SearchScratch::near_probe_floor is set): a best-first level-0 walk from ep that scores
  /// every node it meets, as the filtered walk does, for kProbeExpansions expansions of the
  /// first kProbeLinks links of each node. False when fewer than floor * kProbeRows of the
  /// kProbeRows nearest nodes it scored (about the query's nearest rows) pass; true when it
  /// met fewer (a graph too small to probe). O(kProbeExpansions * kProbeLinks) distances.
  template <typename Scorer>
  static bool near_rows_pass(const HnswIndex& g, Scorer sc, Scored ep, const Bitmap& allowed, double floor,
                             VisitedSet& visited);
  /// The near probe of expanding(): its expansions, the links it reads per node, and the
  /// nearest nodes it counts (docs/filter-ir.md, "Far passing rows").
  static constexpr std::size_t kProbeExpansions = 16;
  static constexpr std::size_t kProbeLinks = 16;
  static constexpr std::size_t kProbeRows = 64;
  /// layer0 admitting every slot, on one sorted list of the ef best (a linear pool, as
  /// NSG / SymphonyQG walk it) instead of a frontier heap and a result heap.
  template <typename Scorer, typename Counter>
  static std::vector<Scored> layer0_pool(const HnswIndex& g, Scorer sc, Scored ep, std::size_t ef, VisitedSet& visited,
                                         std::size_t* evals, Counter count);
};

// ---- template implementation -------------------------------------------------------------

template <typename Scorer, typename Counter>
Scored GraphSearch::descend(const HnswIndex& g, Scorer sc, VisitedSet& visited_set, std::size_t beam, Counter count) {
  const VisitedSet::View visited = visited_set.view();
  Scored cur{sc.one(g.entry_), g.entry_};
  count.scored(1);
  visited.test_and_set(g.entry_);
  std::uint32_t fresh[4 + kMaxLinks];
  float d[4 + kMaxLinks];
  const int greedy_to = beam > 1 ? 1 : 0;  // the last level walked greedily is greedy_to + 1
  for (int level = g.max_level_; level > greedy_to; --level) {
    bool changed = true;
    while (changed) {
      changed = false;
      const std::uint32_t* src = g.links(cur.slot, level);
      const std::size_t links = src[0];
      std::size_t m = 0;
      for (std::size_t j = 0; j < links; ++j) {
        const Slot n = src[1 + j];
        if (visited.test_and_set(n)) continue;
        sc.prefetch(n);
        fresh[m++] = n;
      }
      sc.block(fresh, m, d);
      count.upper_hop();
      count.scored(m);
      for (std::size_t j = 0; j < m; ++j) {
        if (d[j] < cur.dist) {
          cur = {d[j], fresh[j]};
          changed = true;
        }
      }
    }
  }
  if (greedy_to == 0 || g.max_level_ < 1) return cur;
  // Level 1: a best-first beam on one sorted list of the `beam` best (layer0_pool's list, not
  // in use before level 0), each entry flagged until it is expanded.
  SearchScratch& scratch = search_scratch();
  std::vector<Scored>& pool = scratch.walk_pool;
  std::vector<std::uint8_t>& open = scratch.walk_open;
  if (pool.size() < beam) {
    pool.resize(beam);
    open.resize(beam);
  }
  Scored* list = pool.data();
  std::uint8_t* flag = open.data();
  std::size_t size = 1;
  list[0] = cur;
  flag[0] = 1;
  std::size_t at = 0;  // the best open entry
  while (at < size) {
    flag[at] = 0;
    const std::uint32_t* src = g.links(list[at].slot, 1);
    const std::size_t links = src[0];
    std::size_t m = 0;
    for (std::size_t j = 0; j < links; ++j) {
      const Slot n = src[1 + j];
      if (visited.test_and_set(n)) continue;
      sc.prefetch(n);
      fresh[m++] = n;
    }
    sc.block(fresh, m, d);
    count.upper_hop();
    count.scored(m);
    std::size_t first_new = size;
    for (std::size_t j = 0; j < m; ++j) {
      if (size == beam && !(d[j] < list[beam - 1].dist)) continue;
      const Scored e{d[j], fresh[j]};
      const std::size_t p = static_cast<std::size_t>(std::upper_bound(list, list + size, e) - list);
      if (size < beam) ++size;  // else the worst entry falls off the end
      std::memmove(list + p + 1, list + p, (size - 1 - p) * sizeof(Scored));
      std::memmove(flag + p + 1, flag + p, size - 1 - p);
      list[p] = e;
      flag[p] = 1;
      first_new = std::min(first_new, p);
    }
    at = std::min(at, first_new);
    while (at < size && flag[at] == 0) ++at;
  }
  return list[0];
}

template <typename Scorer, typename Accept, typename Counter>
std::vector<Scored> GraphSearch::layer0(const HnswIndex& g, Scorer sc, Scored ep, std::size_t ef, const Accept& accept,
                                        VisitedSet& visited_set, std::size_t* evals, Counter count) {
  const VisitedSet::View visited = visited_set.view();
  std::vector<Scored>& candidates = search_scratch().walk_candidates;  // a min-heap (ScoredGreater)
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
  // The near probe (SearchScratch::near_probe_floor): how many of the first kNearProbe nodes
  // the walk expands pass. The walk expands nearest first from an entry point near the query,
  // so these are about the query's nearest rows; a filter passing far fewer of them than of
  // all rows is anti-correlated with the query, and the walk, which reaches only the passing
  // rows near where it starts, misses the nearest ones elsewhere (docs/filter-ir.md).
  SearchScratch& scratch = search_scratch();
  const double near_floor = scratch.near_probe_floor;
  std::size_t near_seen = 0;
  std::size_t near_pass = 0;
  visited.test_and_set(ep.slot);
  candidates.push_back(ep);
  if (accept(ep.slot)) push_result(ep);
  // A list holds at most kMaxLinks links; block() writes whole blocks of four.
  std::uint32_t fresh[4 + kMaxLinks];
  float dists[4 + kMaxLinks];
  static_assert(sizeof(fresh) / sizeof(fresh[0]) >= kMaxLinks + 3, "fresh must hold a full list");
  while (!candidates.empty()) {
    const Scored c = candidates.front();
    if (results.size() >= ef && c.dist > results.front().dist) break;
    if (near_floor > 0.0 && near_seen < kNearProbe) {
      ++near_seen;
      near_pass += accept(c.slot) ? 1 : 0;
    }
    // c stays at the root until the first neighbour admitted replaces it (one sift instead of
    // a pop and a push); it is popped only if none is. The pop order is that of popping first:
    // the order is total (distance, then slot) and c is the smallest either way.
    const std::size_t nc = candidates.size();
    if (nc > 1) g.prefetch_links(candidates[nc > 2 && candidates[2] < candidates[1] ? 2 : 1].slot, 0);
    bool top_open = true;
    const std::uint32_t* src = g.links(c.slot, 0);
    const std::size_t links = src[0];
    std::size_t m = 0;
    // Gather the unvisited neighbours first, prefetching them, then score them in blocks.
    for (std::size_t j = 0; j < links; ++j) {
      const Slot n = src[1 + j];
      if (visited.test_and_set(n)) continue;
      sc.prefetch(n);
      fresh[m++] = n;
    }
    sc.block(fresh, m, dists);
    if (evals != nullptr) *evals += m;
    count.hop();
    count.scored(m);
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
        // Its link list is read if it is expanded: start loading it now.
        prefetch_l1(g.links(fresh[j], 0));
        if (accept(fresh[j])) push_result(e);
      }
    }
    if (top_open) {
      std::pop_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
      candidates.pop_back();
    }
  }
  if (near_seen == kNearProbe && static_cast<double>(near_pass) < near_floor * static_cast<double>(near_seen)) {
    scratch.near_probe_failed = true;
  }
  return results;
}

// Without a filter, the frontier and the result list of layer0 hold the same nodes that can
// still be expanded: a node evicted from the results is worse than the list's worst from then
// on, and layer0 stops at the first candidate whose distance exceeds the worst's, so it never
// expands it, unless its distance ties the worst's exactly (frequent on codes: their distances
// come from integer sums). One sorted list of the ef best, followed by the evicted nodes that
// tie the worst, with a flag per entry "not expanded yet", therefore walks the same nodes in
// the same order (expand the best open entry; stop when none is open) and keeps the same
// results, with one binary search and one short move per admitted node instead of two heap
// insertions.
template <typename Scorer, typename Counter>
std::vector<Scored> GraphSearch::layer0_pool(const HnswIndex& g, Scorer sc, Scored ep, std::size_t ef,
                                             VisitedSet& visited_set, std::size_t* evals, Counter count) {
  const VisitedSet::View visited = visited_set.view();
  SearchScratch& scratch = search_scratch();
  std::vector<Scored>& pool = scratch.walk_pool;        // ascending, [0, size) in use
  std::vector<std::uint8_t>& open = scratch.walk_open;  // 1: not expanded yet
  if (pool.size() < ef + 1) {
    pool.resize(ef + 1);
    open.resize(ef + 1);
  }
  Scored* list = pool.data();
  std::uint8_t* flag = open.data();
  std::size_t size = 1;
  list[0] = ep;
  flag[0] = 1;
  visited.test_and_set(ep.slot);
  std::uint32_t fresh[4 + kMaxLinks];
  float dists[4 + kMaxLinks];
  static_assert(sizeof(fresh) / sizeof(fresh[0]) >= kMaxLinks + 3, "fresh must hold a full list");
  std::size_t cur = 0;  // the first open entry; every entry before it is expanded
  while (cur < size) {
    const Slot c = list[cur].slot;
    flag[cur] = 0;
    // The best open entry after c is expanded next unless a neighbour displaces it.
    std::size_t nx = cur + 1;
    while (nx < size && flag[nx] == 0) ++nx;
    if (nx < size) g.prefetch_links(list[nx].slot, 0);
    const std::uint32_t* src = g.links(c, 0);
    const std::size_t links = src[0];
    std::size_t m = 0;
    // Gather the unvisited neighbours first, prefetching them, then score them in blocks.
    for (std::size_t j = 0; j < links; ++j) {
      const Slot n = src[1 + j];
      if (visited.test_and_set(n)) continue;
      sc.prefetch(n);
      fresh[m++] = n;
    }
    sc.block(fresh, m, dists);
    if (evals != nullptr) *evals += m;
    count.hop();
    count.scored(m);
    std::size_t first_new = size;
    for (std::size_t j = 0; j < m; ++j) {
      const float d = dists[j];
      if (size < ef || d < list[ef - 1].dist) {
        if (size == pool.size()) {  // ties past the ef-th entry filled the buffer
          pool.resize(2 * size);
          open.resize(2 * size);
          list = pool.data();
          flag = open.data();
        }
        const Scored e{d, fresh[j]};
        const std::size_t p = static_cast<std::size_t>(std::upper_bound(list, list + size, e) - list);
        std::memmove(list + p + 1, list + p, (size - p) * sizeof(Scored));
        std::memmove(flag + p + 1, flag + p, size - p);
        list[p] = e;
        flag[p] = 1;
        ++size;
        // The entries past the ef-th that no longer tie the worst can never be expanded.
        while (size > ef && list[size - 1].dist > list[ef - 1].dist) --size;
        first_new = std::min(first_new, p);
        // Its link list is read if it is expanded: start loading it now.
        prefetch_l1(g.links(fresh[j], 0));
      }
    }
    cur = std::min(cur, first_new);
    while (cur < size && flag[cur] == 0) ++cur;
  }
  std::vector<Scored> results(list, list + std::min(size, ef));
  std::make_heap(results.begin(), results.end());  // the heap order of layer0's results
  return results;
}

template <typename Scorer>
bool GraphSearch::near_rows_pass(const HnswIndex& g, Scorer sc, Scored ep, const Bitmap& allowed, double floor,
                                 VisitedSet& visited_set) {
  const VisitedSet::View visited = visited_set.view();
  SearchScratch& scratch = search_scratch();
  std::vector<Scored>& frontier = scratch.walk_candidates;  // a min-heap (ScoredGreater)
  std::vector<Scored>& met = scratch.probe_met;
  frontier.clear();
  met.clear();
  visited.test_and_set(ep.slot);
  frontier.push_back(ep);
  met.push_back(ep);
  std::uint32_t fresh[4 + kMaxLinks];
  float dists[4 + kMaxLinks];
  static_assert(kProbeLinks <= kMaxLinks, "fresh must hold the links read");
  for (std::size_t expanded = 0; expanded < kProbeExpansions && !frontier.empty(); ++expanded) {
    const Scored c = frontier.front();
    std::pop_heap(frontier.begin(), frontier.end(), detail::ScoredGreater{});
    frontier.pop_back();
    if (!frontier.empty()) g.prefetch_links(frontier.front().slot, 0);
    // A list holds its heuristic links nearest first, then the nearest pruned candidates
    // (HnswIndex::select_neighbors): its head points at the node's own surroundings.
    const std::uint32_t* src = g.links(c.slot, 0);
    const std::size_t links = std::min<std::size_t>(src[0], kProbeLinks);
    std::size_t m = 0;
    for (std::size_t j = 0; j < links; ++j) {
      const Slot n = src[1 + j];
      if (visited.test_and_set(n)) continue;
      sc.prefetch(n);
      fresh[m++] = n;
    }
    sc.block(fresh, m, dists);
    for (std::size_t j = 0; j < m; ++j) {
      const Scored e{dists[j], fresh[j]};
      frontier.push_back(e);
      std::push_heap(frontier.begin(), frontier.end(), detail::ScoredGreater{});
      met.push_back(e);
    }
  }
  if (met.size() < kProbeRows) return true;
  std::nth_element(met.begin(), met.begin() + (kProbeRows - 1), met.end());
  std::size_t pass = 0;
  for (std::size_t j = 0; j < kProbeRows; ++j) pass += allowed.test(met[j].slot) ? 1 : 0;
  return static_cast<double>(pass) >= floor * static_cast<double>(kProbeRows);
}

template <typename Scorer, typename Enough>
std::vector<Scored> GraphSearch::expanding(const HnswIndex& g, Scorer sc, std::size_t ef, const Bitmap* allowed,
                                           Enough enough, std::size_t* evals) {
  const std::size_t limit = std::max<std::size_t>(g.store_.size(), 1);
  ef = std::min(std::max<std::size_t>(ef, 1), limit);
  const auto passes = [allowed](Slot s) { return allowed == nullptr || allowed->test(s); };
  // Upper levels are walked without the filter: they only find the region of the query.
  auto visited = g.visited_.acquire(g.levels_.size());
  const Scored cur = descend(g, sc, *visited, upper_beam(g, ef));
  visited->reset(g.levels_.size());  // a fresh epoch for level 0: O(1)
  SearchScratch& scratch = search_scratch();
  // The near probe (Index::search sets its floor for the two-hop traversal): where the query's
  // nearest rows pass far less than the filter's selectivity, the nearest passing rows lie in
  // regions the traversal, which scores passing rows only, does not reach from here.
  if (allowed != nullptr && scratch.near_probe_floor > 0.0) {
    if (!near_rows_pass(g, sc, cur, *allowed, scratch.near_probe_floor, *visited)) {
      scratch.near_probe_failed = true;
      return {};
    }
    visited->reset(g.levels_.size());
  }
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
      sc.prefetch(n);
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
          sc.prefetch(n2);
          fresh[m++] = n2;
        }
      }
    }
    sc.block(fresh, m, dists);
    n_evals += m;
    for (std::size_t j = 0; j < m; ++j) offer({dists[j], fresh[j]});
  }
  if (evals != nullptr) *evals += n_evals;
  // Do not keep the memory of an exhaustive expansion for the life of the thread.
  constexpr std::size_t kKeepScratch = std::size_t{1} << 16;
  if (deferred.capacity() > kKeepScratch) std::vector<Scored>().swap(deferred);
  if (again.capacity() > kKeepScratch) std::vector<Scored>().swap(again);
  return results;
}

// ---- the float32 searches of HnswIndex (declared in hnsw_index.h) ----------------------------

template <typename Accept>
std::vector<Scored> HnswIndex::search_with(const float* q, std::size_t k, std::size_t ef, const Accept& accept,
                                           std::size_t* evals) const {
  if (entry_ == kNoSlot || k == 0) return {};
  const RowScorer sc(store_, metric_, active_kernels(), q);
  std::vector<Scored> res = GraphSearch::search(*this, sc, std::max(ef, k), accept, evals);
  std::sort_heap(res.begin(), res.end());
  if (res.size() > k) res.resize(k);
  return res;
}

inline std::vector<Scored> HnswIndex::search_counted(const float* q, std::size_t k, std::size_t ef,
                                                     WalkStats& stats) const {
  if (entry_ == kNoSlot || k == 0) return {};
  const RowScorer sc(store_, metric_, active_kernels(), q);
  std::vector<Scored> res = GraphSearch::search_counted(*this, sc, std::max(ef, k), AcceptAll{}, stats);
  std::sort_heap(res.begin(), res.end());
  if (res.size() > k) res.resize(k);
  return res;
}

template <typename Enough>
std::vector<Scored> HnswIndex::search_expanding(const float* q, std::size_t ef, const Bitmap* allowed, Enough enough,
                                                std::size_t* evals) const {
  if (entry_ == kNoSlot) return {};
  const RowScorer sc(store_, metric_, active_kernels(), q);
  std::vector<Scored> res = GraphSearch::expanding(*this, sc, ef, allowed, enough, evals);
  std::sort_heap(res.begin(), res.end());
  return res;
}

}  // namespace kbcore
