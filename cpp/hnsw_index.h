#pragma once
// Hierarchical Navigable Small World graph (Malkov & Yashunin 2018, "Efficient and robust
// approximate nearest neighbor search using HNSW graphs", TPAMI). The graph indexes rows of a
// VectorStore by slot; it does not own the vectors.
//
// Thread-safety: search() is const and may run concurrently with other searches. Inserts may
// run concurrently with each other (per-node striped locks guard link lists, as in hnswlib),
// but not with searches or removals; the owning Index serialises those with a shared_mutex.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "aligned.h"
#include "bitmap.h"
#include "distance.h"
#include "graph_reorder.h"
#include "mapped_array.h"
#include "prefetch.h"
#include "row_scorer.h"
#include "search_scratch.h"
#include "topk.h"
#include "vector_store.h"
#include "visited_pool.h"

namespace kbcore {

class BinaryReader;
class BinaryWriter;
struct WalkStats;

/// Upper bound of HnswParams::M, checked by the constructor and by load.
inline constexpr std::size_t kMaxM = 256;
/// The longest link list (level 0 holds 2M links): the size of the search stack buffers.
inline constexpr std::size_t kMaxLinks = 2 * kMaxM;
static_assert(kMaxLinks <= 0xFFFF, "core0_ counts level-0 links in 16 bits");
/// The largest ef_construction, search ef, re-rank depth and search k an index accepts: one
/// limit, checked by the constructors, set_ef_search, search and load alike, so that every
/// value a constructor takes is one a saved file can hold and load accepts. Work buffers are
/// bounded by the rows that exist whatever the value (docs/index.md, "Limits").
inline constexpr std::size_t kMaxEf = std::size_t{1} << 30;

/// Construction parameters. M: links per node on upper levels (2M on level 0);
/// ef_construction: candidate list size while inserting; seed: level assignment.
struct HnswParams {
  std::size_t M = 16;
  std::size_t ef_construction = 200;
  std::uint64_t seed = 42;
};

/// Admits every slot (unfiltered search).
struct AcceptAll {
  bool operator()(Slot) const { return true; }
};

class HnswIndex {
 public:
  HnswIndex(const VectorStore& store, Metric metric, HnswParams params);

  const HnswParams& params() const { return params_; }
  /// Grows per-slot arrays to store.slot_count(). Not thread-safe.
  void grow();
  /// Inserts the given (already stored) slots; `threads` workers (0 = all cores).
  /// Levels are drawn sequentially from the seeded generator, so they are reproducible.
  void insert_batch(const std::vector<Slot>& slots, std::size_t threads);
  /// Registers stored slots whose graph insertion is deferred: they are not linked yet, and
  /// searches must scan them exactly (pending()). build_pending() links them later.
  void add_pending(const std::vector<Slot>& slots);
  /// Links up to max_rows pending slots (oldest slots first); returns how many remain.
  std::size_t build_pending(std::size_t max_rows, std::size_t threads);
  /// Slots stored but not yet linked into the graph, ascending. O(1).
  const std::vector<Slot>& pending() const { return pending_list_; }
  bool is_pending(Slot s) const { return s < pending_.size() && pending_[s] != 0; }
  /// Unlinks the given slots and repairs every node that pointed at them by reconnecting it
  /// to the removed nodes' neighbours with the selection heuristic (the local repair of
  /// FreshDiskANN, Singh et al. 2021), so recall does not decay. Slots are then free.
  void remove_batch(const std::vector<Slot>& slots, std::size_t threads);
  /// k nearest slots to q with a level-0 candidate list of max(ef, k), ascending.
  /// O(ef log ef * M) distance evaluations typical. Thread-safe against other searches.
  std::vector<Scored> search(const float* q, std::size_t k, std::size_t ef) const {
    return search_with(q, k, ef, AcceptAll{});
  }
  /// Same, admitting only slots for which accept(slot) is true into the results; the
  /// traversal still walks through rejected nodes (so the graph stays navigable).
  template <typename Accept>
  std::vector<Scored> search_with(const float* q, std::size_t k, std::size_t ef, const Accept& accept,
                                  std::size_t* evals = nullptr) const;
  /// search() counting the walk's work into `stats` (added to; Index::search_stats): the
  /// same walk, the same results.
  std::vector<Scored> search_counted(const float* q, std::size_t k, std::size_t ef, WalkStats& stats) const;
  /// Level-0 search whose candidate list starts at ef and doubles whenever the search
  /// converges before enough(results) holds (results in heap order, not sorted), until the
  /// reachable (filtered) graph is exhausted. With `allowed`, only passing slots are scored: a
  /// neighbour that fails the filter is not scored but its own neighbours are (two-hop
  /// expansion, ACORN-1 of Patel et al., SIGMOD 2024), at most 2M per expansion, so the graph
  /// stays navigable when most neighbours fail. Grouped and two-hop filtered search (with
  /// enough() always true). Returns every result kept, ascending. Thread-safe against searches.
  template <typename Enough>
  std::vector<Scored> search_expanding(const float* q, std::size_t ef, const Bitmap* allowed, Enough enough,
                                       std::size_t* evals = nullptr) const;

  /// A new slot order in which a node's level-0 neighbours have nearby slots (graph_reorder.h):
  /// the slots a level-0 walk from the entry point reaches, then every other slot in its old
  /// order. O(n * M) (RCM: and a sort of each list by degree). Thread-safe against searches.
  std::vector<Slot> locality_order(ReorderMethod method) const;
  /// Renumbers the graph's slots by `p` (the store's rows are moved by its owner in the same
  /// step, under the same exclusive lock): every per-slot array and every link. O(n * M).
  /// `links0`, if given, is permuted_links0(p) of this same graph, made earlier (it is made
  /// here otherwise, or if its size no longer fits). Not thread-safe.
  void permute_slots(const SlotPermutation& p, std::optional<MappedArray<std::uint32_t>> links0 = std::nullopt);
  /// The level-0 link lists renumbered by `p` (a new array; the largest part of
  /// permute_slots). Only reads the graph: thread-safe against searches.
  MappedArray<std::uint32_t> permuted_links0(const SlotPermutation& p) const;

  /// Bytes held by the graph (links, levels), approximately.
  std::size_t memory_bytes() const;
  /// Writes the graph (from format version 7 on, the level-0 lists at a 64-byte file offset).
  void save(BinaryWriter& w) const;
  /// Replaces the graph with a persisted one; validates every link against slot_count. From a
  /// mapped file of format version 7 the level-0 lists are read in place (not copied).
  void load(BinaryReader& r);
  /// True while the level-0 lists are read in place from the mapped file (before a write).
  bool links_in_place() const { return links0_.in_place(); }
  /// Level-0 lists read in place are copied to the heap (as the first write would); a no-op
  /// otherwise.
  void copy_links_to_heap() { (void)links0_.mutable_data(); }
  /// The level-0 lists' bytes (diagnostics; the range a load keeps resident).
  std::pair<const void*, std::size_t> level0_bytes() const {
    return {links0_.data(), links0_.size() * sizeof(std::uint32_t)};
  }

 private:
  friend class GraphSearch;     // the search walk (graph_search.h)
  friend class HnswCodeSearch;  // searches on codes (hnsw_codes.h)
  using Lock = std::mutex;
  static constexpr std::size_t kLockStripes = 4096;
  static constexpr int kMaxLevel = 32;
  static constexpr std::size_t kLinksAlign = 64;  // file offset of the level-0 lists (version 7)

  // Mutable lists: level-0 lists read in place are copied to the heap first (every public
  // mutator does that on its calling thread before any worker runs, so here it is a test).
  std::uint32_t* links(Slot s, int level) {
    return level == 0 ? links0_.mutable_data() + static_cast<std::size_t>(s) * (1 + m0_)
                      : &upper_[s][static_cast<std::size_t>(level - 1) * (1 + params_.M)];
  }
  const std::uint32_t* links(Slot s, int level) const {
    return level == 0 ? links0_.data() + static_cast<std::size_t>(s) * (1 + m0_)
                      : &upper_[s][static_cast<std::size_t>(level - 1) * (1 + params_.M)];
  }
  std::size_t capacity(int level) const { return level == 0 ? m0_ : params_.M; }
  /// Starts loading the whole link list of s at level (count and every id slot) into L1.
  void prefetch_links(Slot s, int level) const {
    prefetch_block_l1(links(s, level), (1 + capacity(level)) * sizeof(std::uint32_t));
  }
  /// Words of s's upper-level lists.
  std::size_t upper_words(Slot s) const { return static_cast<std::size_t>(levels_[s]) * (1 + params_.M); }
  float dist(const Kernels& k, const float* q, Slot s) const {
    return distance(k, metric_, q, store_.vector(s), store_.dim());
  }
  Lock& lock_for(Slot s) const { return locks_[s % kLockStripes]; }
  /// Distances from q to m slots into out (RowScorer::block): the walks of construction.
  void score(const Kernels& k, const float* q, const std::uint32_t* slots, std::size_t m, float* out) const;
  /// True if some slot lies closer to v than d (four rows per kernel call, first hit stops).
  bool any_closer(const Kernels& k, const float* v, const std::uint32_t* slots, std::size_t n, float d) const;
  /// Starts loading each slot's whole row into L2 (see prefetch_row).
  void prefetch_rows(const std::uint32_t* slots, std::size_t n) const {
    for (std::size_t j = 0; j < n; ++j) prefetch_row(slots[j]);
  }
  /// Starts loading the whole row of s into L2 (prefetch_row_l2, which has the figures).
  /// Searches call it for every unvisited neighbour of an expanded node before scoring any.
  void prefetch_row(Slot s) const;

  /// Gorder's window order (graph_reorder.cpp) of the slots `reached` (a breadth-first order).
  std::vector<Slot> window_order(const std::vector<Slot>& reached) const;
  int draw_level();
  void insert(Slot s, const Kernels& k);
  /// Links s (whose own level is set) into levels [0, level]; used by insert and repair.
  void link(Slot s, int level, Slot ep, int top, const Kernels& k, bool locked);
  void connect_back(Slot n, Slot s, float d, int level, const Kernels& k, bool locked);
  /// Candidate search on one level from entry points; results ascending, at most ef. The
  /// walk of construction (locked reads, any level); searches use graph_search.h.
  template <bool kLocked, typename Accept>
  std::vector<Scored> search_layer(const float* q, const std::vector<Scored>& eps, std::size_t ef, int level,
                                   const Kernels& k, const Accept& accept, std::size_t* evals = nullptr) const;
  /// The links of s at level: in place when unlocked (no concurrent writer), else copied
  /// into `local` under s's lock (inserts run concurrently). Sets count; returns the ids.
  /// Locked reads (the traversals of insert) see only the core (heuristic) links of a level-0
  /// list, as hnswlib's construction does: the fill links are the pruned candidates, whose
  /// neighbourhoods the core links already reach, and skipping them took 12% of the distance
  /// evaluations out of a SciFact-chunks build at the same recall@10 (ef 10 to 64). Searches
  /// and repair (unlocked) walk the full lists.
  template <bool kLocked>
  const std::uint32_t* read_links(Slot s, int level, std::vector<std::uint32_t>& local, std::size_t& count) const {
    if constexpr (kLocked) {
      std::lock_guard<Lock> guard(lock_for(s));
      const std::uint32_t* src = links(s, level);
      const std::size_t n = level == 0 ? std::min<std::size_t>(core0_[s], src[0]) : src[0];
      local.assign(src + 1, src + 1 + n);
      count = local.size();
      return local.data();
    } else {
      const std::uint32_t* src = links(s, level);
      count = src[0];
      return src + 1;
    }
  }
  /// Empties s's lists and level (before an insert, or when s is freed or made pending).
  void reset_slot(Slot s, int level = 0);
  template <bool kLocked>
  Scored greedy(const float* q, Scored cur, int from_level, int to_level, const Kernels& k) const;
  /// Selection heuristic (Malkov & Yashunin, Algorithm 4): keep a candidate only if it is
  /// closer to the base than to every already kept neighbour. `cands` ascending. Link slots
  /// the heuristic leaves free then take the pruned candidates, nearest first (the "keep
  /// pruned connections" option of the paper). Returns the number of heuristic ("core")
  /// links; cands becomes [core ascending, fill ascending]. Full lists raise recall per
  /// distance evaluation (figures in benches/README.md). core0_ keeps the core count of level-0 lists so that
  /// connect_back can settle most new links without re-running the heuristic.
  std::size_t select_neighbors(std::vector<Scored>& cands, std::size_t m, const Kernels& k) const;
  /// The invariants of a graph that load() checks (levels in range, free and pending slots
  /// unlinked, every link to a linked live slot with a list at that level, not to the node
  /// itself and at most once per list, counts within capacity, a valid entry point). Returns
  /// the first violation (load's FormatError text) or null. save() runs it on the graph in
  /// memory, so it never writes a file load() refuses. O(n + links).
  static const char* check_graph(const VectorStore& store, std::size_t m, std::size_t m0,
                                 const std::vector<std::uint8_t>& levels, const std::uint32_t* links0,
                                 const std::vector<std::unique_ptr<std::uint32_t[]>>& upper,
                                 const std::vector<std::uint8_t>& pending, Slot entry, int max_level);
  void pick_new_entry(const std::vector<std::uint8_t>& dead);
  /// Re-links live nodes that a level-0 traversal from the entry point cannot reach.
  /// O(n * M) for the check; runs after parallel inserts and after removals.
  void ensure_reachable(const Kernels& k, const std::vector<std::uint8_t>* dead = nullptr);

  const VectorStore& store_;
  Metric metric_;
  HnswParams params_;
  std::size_t m0_;
  double level_mult_;
  // slot_count * (1 + m0_): [count, ids...]; huge pages, or read in place from the mapped file
  // of a format version 7 load (mapped_array.h) until the first write.
  MappedArray<std::uint32_t> links0_;
  std::vector<std::uint16_t> core0_;  // per slot: leading level-0 links that are not fill
  std::vector<std::uint8_t> levels_;  // top level per slot
  // Per slot: levels_[s] lists of [count, ids...] (1 + M each), null at level 0 (most slots):
  // 8 B per slot where a std::vector would take 24.
  std::vector<std::unique_ptr<std::uint32_t[]>> upper_;
  std::vector<std::uint8_t> pending_;  // per slot: 1 if stored but not linked yet
  std::vector<Slot> pending_list_;     // the same slots, ascending
  Slot entry_ = kNoSlot;
  int max_level_ = -1;
  std::mutex entry_mutex_;
  mutable std::array<Lock, kLockStripes> locks_;
  mutable VisitedPool visited_;
  std::mt19937_64 rng_;
};

// ---- template implementation -------------------------------------------------------------

namespace detail {
struct ScoredGreater {
  bool operator()(const Scored& a, const Scored& b) const { return b < a; }
};
}  // namespace detail

inline void HnswIndex::prefetch_row(Slot s) const { prefetch_row_l2(store_.vector(s), store_.dim() * sizeof(float)); }

inline bool HnswIndex::any_closer(const Kernels& k, const float* v, const std::uint32_t* slots, std::size_t n,
                                  float d) const {
  for (std::size_t i = 0; i < n; i += 4) {
    const std::size_t last = n - 1;
    const float* rows[4] = {store_.vector(slots[i]), store_.vector(slots[std::min(i + 1, last)]),
                            store_.vector(slots[std::min(i + 2, last)]), store_.vector(slots[std::min(i + 3, last)])};
    float d4[4];
    distance4(k, metric_, v, rows, store_.dim(), d4);
    for (std::size_t t = 0; t < 4 && i + t < n; ++t) {
      if (d4[t] < d) return true;
    }
  }
  return false;
}

inline void HnswIndex::score(const Kernels& k, const float* q, const std::uint32_t* slots, std::size_t m,
                             float* out) const {
  RowScorer(store_, metric_, k, q).block(slots, m, out);
}

template <bool kLocked, typename Accept>
std::vector<Scored> HnswIndex::search_layer(const float* q, const std::vector<Scored>& eps, std::size_t ef, int level,
                                            const Kernels& k, const Accept& accept, std::size_t* evals) const {
  auto visited = visited_.acquire(levels_.size());
  // candidates: min-heap of the frontier; results: max-heap of the best ef admitted nodes.
  // Scratch buffers are per thread so that a search allocates nothing in steady state.
  SearchScratch& scratch = search_scratch();
  std::vector<Scored>& candidates = scratch.layer_candidates;
  std::vector<std::uint32_t>& local = scratch.layer_links;
  candidates.clear();
  std::vector<Scored> results;
  results.reserve(std::min(ef, levels_.size()) + 1);  // it never holds more than the slots
  const auto push_result = [&](const Scored& s) {
    results.push_back(s);
    std::push_heap(results.begin(), results.end());
    if (results.size() > ef) {
      std::pop_heap(results.begin(), results.end());
      results.pop_back();
    }
  };
  for (const Scored& e : eps) {
    if (visited->test_and_set(e.slot)) continue;
    candidates.push_back(e);
    std::push_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
    if (accept(e.slot)) push_result(e);
  }
  // A list holds at most kMaxLinks links; score() writes whole blocks of four.
  std::uint32_t fresh[4 + kMaxLinks];
  float dists[4 + kMaxLinks];
  static_assert(sizeof(fresh) / sizeof(fresh[0]) >= kMaxLinks + 3, "fresh must hold a full list");
  while (!candidates.empty()) {
    const Scored c = candidates.front();
    if (results.size() >= ef && c.dist > results.front().dist) break;
    std::pop_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
    candidates.pop_back();
    // The next candidate's links will be read next: start loading them now. While inserts
    // run concurrently (kLocked) only level 0's address is safe to form without the lock
    // (it is arithmetic on links0_; an upper list's pointer may be replaced meanwhile), and
    // a prefetch reads nothing, so it cannot race with the writer.
    const bool may_prefetch = !kLocked || level == 0;
    if (may_prefetch && !candidates.empty()) prefetch_links(candidates.front().slot, level);
    std::size_t count;
    const std::uint32_t* nl = read_links<kLocked>(c.slot, level, local, count);
    // Gather the unvisited neighbours first, prefetching their rows, then score them four
    // at a time: independent dot products keep the FMA units busy.
    std::size_t m = 0;
    for (std::size_t j = 0; j < count; ++j) {
      const Slot n = nl[j];
      if (visited->test_and_set(n)) continue;
      prefetch_row(n);
      fresh[m++] = n;
    }
    score(k, q, fresh, m, dists);
    if (evals != nullptr) *evals += m;
    for (std::size_t j = 0; j < m; ++j) {
      const float d = dists[j];
      if (results.size() < ef || d < results.front().dist) {
        candidates.push_back({d, fresh[j]});
        std::push_heap(candidates.begin(), candidates.end(), detail::ScoredGreater{});
        // Its link list is read if it is expanded: start loading it now.
        if (may_prefetch) prefetch_l1(links(fresh[j], level));
        if (accept(fresh[j])) push_result({d, fresh[j]});
      }
    }
  }
  std::sort_heap(results.begin(), results.end());
  return results;
}

template <bool kLocked>
Scored HnswIndex::greedy(const float* q, Scored cur, int from_level, int to_level, const Kernels& k) const {
  std::vector<std::uint32_t> local;
  for (int level = from_level; level > to_level; --level) {
    bool changed = true;
    while (changed) {
      changed = false;
      std::size_t count;
      const std::uint32_t* nl = read_links<kLocked>(cur.slot, level, local, count);
      prefetch_rows(nl, count);
      float d[4 + kMaxLinks];
      score(k, q, nl, count, d);
      for (std::size_t j = 0; j < count; ++j) {
        if (d[j] < cur.dist) {
          cur = {d[j], nl[j]};
          changed = true;
        }
      }
    }
  }
  return cur;
}

}  // namespace kbcore

// The searches of HnswIndex are written on the one walk of graph_search.h, which needs the
// class complete: included last (either header may be included first).
#include "graph_search.h"  // IWYU pragma: export
