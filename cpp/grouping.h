#pragma once
// Collapsing hits by source: each hit's group is the value of one metadata field (int or
// str); a group keeps its best `group_size` hits and the ids of every part of it that the
// search met. Groups are ordered by their best distance.
#include <cstdint>
#include <vector>

#include "metadata_store.h"
#include "topk.h"

namespace kbcore {

/// One collapsed group: its dense ordinal in the field, best hits (ascending), parts met.
struct Group {
  std::uint32_t ordinal = Field::kNoGroup;
  std::vector<Scored> best;
  std::vector<Slot> parts;
};

/// Groups `sorted` (ascending) by field.group_of; keeps the first k groups to appear (the k
/// with the best distances) and, for them, the best group_size hits and every part met.
/// Slots without a group value are skipped. The field's index must be built. O(|sorted|).
std::vector<Group> collapse_sorted(const std::vector<Scored>& sorted, const Field& field, std::size_t k,
                                   std::size_t group_size);

/// Number of distinct groups among `sorted`, counting stops at `k`. O(|sorted|).
std::size_t count_groups(const std::vector<Scored>& sorted, const Field& field, std::size_t k);

/// Exact grouping over all `rows` with their distances `dist` (same order): the k groups with
/// the smallest best distance, each with its best group_size hits and every part among rows.
/// O(|rows| + groups).
std::vector<Group> collapse_exact(const std::vector<Slot>& rows, const std::vector<float>& dist,
                                  const Field& field, std::size_t k, std::size_t group_size);

}  // namespace kbcore
