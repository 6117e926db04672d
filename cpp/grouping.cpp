#include "grouping.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace kbcore {

std::vector<Group> collapse_sorted(const std::vector<Scored>& sorted, const Field& field, std::size_t k,
                                   std::size_t group_size) {
  std::vector<Group> groups;
  std::unordered_map<std::uint32_t, std::size_t> where;
  for (const Scored& s : sorted) {
    const std::uint32_t g = field.group_of[s.slot];
    if (g == Field::kNoGroup) continue;
    auto it = where.find(g);
    if (it == where.end()) {
      if (groups.size() >= k) continue;
      it = where.emplace(g, groups.size()).first;
      groups.push_back(Group{g, {}, {}});
    }
    Group& grp = groups[it->second];
    if (grp.best.size() < group_size) grp.best.push_back(s);
    grp.parts.push_back(s.slot);
  }
  return groups;
}

std::size_t count_groups(const std::vector<Scored>& sorted, const Field& field, std::size_t k) {
  std::unordered_set<std::uint32_t> seen;
  for (const Scored& s : sorted) {
    const std::uint32_t g = field.group_of[s.slot];
    if (g == Field::kNoGroup) continue;
    seen.insert(g);
    if (seen.size() >= k) break;
  }
  return seen.size();
}

std::vector<Group> collapse_exact(const std::vector<Slot>& rows, const std::vector<float>& dist,
                                  const Field& field, std::size_t k, std::size_t group_size) {
  // Best distance per group in one pass over dense ordinals, then the k best groups.
  const std::size_t ng = field.group_keys.size();
  thread_local std::vector<Scored> best_of;
  best_of.assign(ng, Scored{std::numeric_limits<float>::infinity(), kNoSlot});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint32_t g = field.group_of[rows[i]];
    if (g == Field::kNoGroup) continue;
    const Scored s{dist[i], rows[i]};
    if (s < best_of[g]) best_of[g] = s;
  }
  std::vector<std::pair<Scored, std::uint32_t>> ranked;
  for (std::uint32_t g = 0; g < ng; ++g) {
    if (best_of[g].slot != kNoSlot) ranked.push_back({best_of[g], g});
  }
  const auto by_best = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (ranked.size() > k) {
    std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(k), ranked.end(), by_best);
    ranked.resize(k);
  }
  std::sort(ranked.begin(), ranked.end(), by_best);
  std::vector<Group> groups(ranked.size());
  thread_local std::vector<std::uint32_t> rank_of;
  rank_of.assign(ng, Field::kNoGroup);
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    groups[i].ordinal = ranked[i].second;
    rank_of[ranked[i].second] = static_cast<std::uint32_t>(i);
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint32_t g = field.group_of[rows[i]];
    if (g == Field::kNoGroup || rank_of[g] == Field::kNoGroup) continue;
    groups[rank_of[g]].best.push_back({dist[i], rows[i]});
  }
  for (Group& grp : groups) {
    std::sort(grp.best.begin(), grp.best.end());
    for (const Scored& s : grp.best) grp.parts.push_back(s.slot);
    if (grp.best.size() > group_size) grp.best.resize(group_size);
  }
  return groups;
}

}  // namespace kbcore
