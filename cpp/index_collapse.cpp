// Index::collapse: grouping of a ranked list the caller already has (a fused hybrid list),
// by the same rule and the same group ordinals as grouped search (grouping.h), so that there
// is one implementation of "the best hits per source".
#include <algorithm>
#include <string>

#include "errors.h"
#include "index.h"
#include "search_scratch.h"

namespace kbcore {

void Index::page_of(const GroupedSlots& groups, const GroupOrdinals& ordinals, GroupPage& page) const {
  const std::size_t ng = groups.size();
  page.key_kinds.resize(ng);
  page.key_ints.resize(ng);
  page.key_str_end.resize(ng);
  page.key_chars.clear();
  page.best_end.assign(groups.best_end.begin(), groups.best_end.end());
  page.parts_end.assign(groups.parts_end.begin(), groups.parts_end.end());
  for (std::size_t g = 0; g < ng; ++g) {
    const auto& key = ordinals.key(groups.ordinals[g]);
    page.key_kinds[g] = static_cast<ValueKind>(key.first);
    if (page.key_kinds[g] == ValueKind::kInt) {
      page.key_ints[g] = key.second;
    } else {
      page.key_ints[g] = 0;
      page.key_chars += meta_.dict().str(static_cast<std::uint32_t>(key.second));
    }
    page.key_str_end[g] = page.key_chars.size();
  }
  page.ids.resize(groups.best.size());
  page.distances.resize(groups.best.size());
  for (std::size_t i = 0; i < groups.best.size(); ++i) {
    page.ids[i] = store_.id_of(groups.best[i].slot);
    page.distances[i] = groups.best[i].dist;
  }
  page.part_ids.resize(groups.parts.size());
  for (std::size_t i = 0; i < groups.parts.size(); ++i) page.part_ids[i] = store_.id_of(groups.parts[i]);
}

Index::GroupPage Index::collapse(const std::int64_t* ids, const float* values, std::size_t n,
                                 const std::string& group_by, std::size_t group_size, std::size_t limit) const {
  if (group_size == 0) throw InvalidArgument("group_size must be positive, got 0");
  GroupPage page;
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<Scored> ranked(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto s = store_.slot_of(ids[i]);
    if (!s)
      throw NotFound("id " + std::to_string(ids[i]) + " (position " + std::to_string(i) + ") is not in the index");
    ranked[i] = Scored{values[i], *s};
  }
  if (n == 0) return page;
  // A repeated id would count twice among its group's parts: a caller's mistake, said so.
  std::vector<Slot> seen(n);
  for (std::size_t i = 0; i < n; ++i) seen[i] = ranked[i].slot;
  std::sort(seen.begin(), seen.end());
  const auto dup = std::adjacent_find(seen.begin(), seen.end());
  if (dup != seen.end()) {
    throw InvalidArgument("id " + std::to_string(store_.id_of(*dup)) + " appears more than once in the list");
  }
  const Field* field = meta_.field(group_by);
  if (field == nullptr || field->present_count() == 0) {
    throw InvalidArgument("group_by field '" + group_by + "' is not present in any stored row");
  }
  if (limit == 0) return page;
  const GroupOrdinals& ordinals = GroupOrdinals::of(*field);
  GroupedSlots& groups = search_scratch().groups;
  collapse_sorted(ranked, ordinals, limit, group_size, groups);
  page_of(groups, ordinals, page);
  return page;
}

}  // namespace kbcore
