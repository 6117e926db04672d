#pragma once
// Collapsing hits by source: each hit's group is the value of one metadata field (int or
// str); a group keeps its best `group_size` hits and the slots of every part of it that the
// search met. Groups are ordered by their best distance.
//
// Results are flat (a few arrays per query, not a few per group) and the per-call group
// lookups use dense per-thread marks indexed by the field's group ordinal (GroupOrdinals),
// so collapsing a page allocates nothing per group and never hashes.
#include <cstdint>
#include <utility>
#include <vector>

#include "metadata_store.h"
#include "prefetch.h"
#include "topk.h"

namespace kbcore {

/// Dense group ordinals of one field: ints by value, then strings by dictionary id, numbered
/// 0.. in that order; slots with no int or str value have none. What grouped search collapses on.
class GroupOrdinals {
 public:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFu;

  /// The ordinals of field's current values: built on the first call after a write (O(n log n))
  /// and cached in the field (Field::derived), O(1) after. Thread-safe for concurrent readers;
  /// the reference is valid until the next write to the field.
  static const GroupOrdinals& of(const Field& field);
  /// Builds the ordinals of field's values (use of() to share the cached ones). O(n log n).
  explicit GroupOrdinals(const Field& field);

  /// The ordinal of slot s's value, or kNone. O(1).
  std::uint32_t of_slot(Slot s) const { return group_of_[s]; }
  /// Number of distinct groups. O(1).
  std::size_t size() const { return keys_.size(); }
  /// The (ValueKind as a byte, payload: the int or the dictionary id) of ordinal g. O(1).
  const std::pair<std::uint8_t, std::int64_t>& key(std::uint32_t g) const { return keys_[g]; }

 private:
  std::vector<std::uint32_t> group_of_;                      // per slot
  std::vector<std::pair<std::uint8_t, std::int64_t>> keys_;  // per ordinal
};

/// The groups of one query, best first, flattened. Group g has ordinal ordinals[g]; its best
/// hits are best[best_begin(g), best_end[g]) and the parts met parts[parts_begin(g),
/// parts_end[g]), both ascending by distance (the best hits are a prefix of the parts).
struct GroupedSlots {
  std::vector<std::uint32_t> ordinals;  // dense group ordinal in the field, one per group
  std::vector<std::uint32_t> best_end;  // one per group: end offset of its hits in `best`
  std::vector<Scored> best;
  std::vector<std::uint32_t> parts_end;  // one per group: end offset of its parts in `parts`
  std::vector<Slot> parts;

  std::size_t size() const { return ordinals.size(); }
  std::size_t best_begin(std::size_t g) const { return g == 0 ? 0 : best_end[g - 1]; }
  std::size_t parts_begin(std::size_t g) const { return g == 0 ? 0 : parts_end[g - 1]; }
  void clear();
};

namespace detail {

// One value per group ordinal, valid only when stamped with the current epoch: starting a
// new pass is O(1) (bump the epoch) instead of clearing an array of every group, and nothing
// needs undoing if a pass is abandoned by an exception. One instance per thread and purpose.
class DenseMarks {
 public:
  /// Starts a pass over ordinals in [0, n); every ordinal reads as unmarked.
  void begin(std::size_t n) {
    if (slots_.size() < n) slots_.resize(n, Entry{0, 0});
    if (++epoch_ == 0) {  // wrapped: old stamps could alias the new epoch
      for (Entry& s : slots_) s.stamp = 0;
      epoch_ = 1;
    }
  }
  bool marked(std::uint32_t g) const { return slots_[g].stamp == epoch_; }
  std::uint32_t value(std::uint32_t g) const { return slots_[g].value; }
  void mark(std::uint32_t g, std::uint32_t v) { slots_[g] = Entry{epoch_, v}; }
  /// Starts loading the entry of g (the caller will look it up soon).
  void prefetch(std::uint32_t g) const { prefetch_l1(&slots_[g]); }

 private:
  struct Entry {
    std::uint32_t stamp;
    std::uint32_t value;
  };
  std::vector<Entry> slots_;  // stamp and value side by side: one cache line per lookup
  std::uint32_t epoch_ = 0;
};

/// Per-thread scratch of the grouping functions (a part of SearchScratch, search_scratch.h).
struct GroupingScratch {
  DenseMarks marks;
  std::vector<std::uint32_t> per_hit;
  std::vector<std::uint32_t> per_group;
  std::vector<Scored> best_of;
  std::vector<std::pair<Scored, std::uint32_t>> ranked;
  std::vector<std::pair<std::uint32_t, Scored>> members;
  std::vector<std::pair<std::int64_t, std::uint32_t>> keyed;
};

}  // namespace detail

/// Groups `sorted` (in rank order: ascending distance, or any best-first order) by their
/// ordinals in `groups` into `out` (cleared first); keeps the first k groups to appear and,
/// for them, the first group_size hits and every part met. Slots without a group value are
/// skipped. O(|sorted|), no allocation in steady state beyond `out`'s growth.
void collapse_sorted(const std::vector<Scored>& sorted, const GroupOrdinals& groups, std::size_t k,
                     std::size_t group_size, GroupedSlots& out);

/// The same rule over hits whose groups are given as int64 keys (keys[i] is the group of
/// ranked[i]; every hit has one): the first k groups to appear in `ranked`'s order, each with
/// its first group_size hits and every part. out.ordinals are the positions in `ranked` of
/// each group's first hit. O(n log n) for n = |ranked|.
void collapse_keys(const std::vector<Scored>& ranked, const std::int64_t* keys, std::size_t k, std::size_t group_size,
                   GroupedSlots& out);

/// Number of distinct groups among `hits` (any order), counting stops at `k`. O(|hits|).
std::size_t count_groups(const std::vector<Scored>& hits, const GroupOrdinals& groups, std::size_t k);

/// Exact grouping over all `rows` with their distances `dist` (same order) into `out`
/// (cleared first): the k groups with the smallest best distance, each with its best
/// group_size hits and every part among rows. O(|rows| + groups + m log m) for the m parts of
/// the k groups.
void collapse_exact(const std::vector<Slot>& rows, const std::vector<float>& dist, const GroupOrdinals& groups,
                    std::size_t k, std::size_t group_size, GroupedSlots& out);

}  // namespace kbcore
