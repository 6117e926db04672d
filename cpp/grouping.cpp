#include "grouping.h"

#include <algorithm>
#include <limits>

#include "prefetch.h"
#include "search_scratch.h"

namespace kbcore {
namespace {

constexpr std::uint32_t kSkip = std::numeric_limits<std::uint32_t>::max();

}  // namespace

const GroupOrdinals& GroupOrdinals::of(const Field& field) { return field.derived<GroupOrdinals>(); }

GroupOrdinals::GroupOrdinals(const Field& field) : group_of_(field.kinds().size(), kNone) {
  const FieldIndex& idx = field.index();
  const Entries<std::int64_t> ints =
      idx.ints_between(std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
  const std::pair<std::int64_t, Slot>* prev_int = nullptr;
  for (const auto& e : ints) {
    if (prev_int == nullptr || e.first != prev_int->first) {
      keys_.emplace_back(static_cast<std::uint8_t>(ValueKind::kInt), e.first);
    }
    group_of_[e.second] = static_cast<std::uint32_t>(keys_.size() - 1);
    prev_int = &e;
  }
  for (const StrRun& run : idx.str_runs()) {
    keys_.emplace_back(static_cast<std::uint8_t>(ValueKind::kStr), run.id);
    for (const auto& e : run.rows) group_of_[e.second] = static_cast<std::uint32_t>(keys_.size() - 1);
  }
}

void GroupedSlots::clear() {
  ordinals.clear();
  best_end.clear();
  best.clear();
  parts_end.clear();
  parts.clear();
}

namespace {

// The one collapse rule: `rank_of_hit` holds each hit's group ordinal (kNone: no group) on
// entry; keeps the first k groups to appear in `ranked`'s order (numbered by `rank_of`, a
// pass over ordinals [0, n_groups) begun by the caller) and, for each, its first group_size
// hits and every part. `group_id(i)` is what out.ordinals records for the group first met
// at hit i.
template <typename GroupId>
void collapse_ranked(const std::vector<Scored>& ranked, std::vector<std::uint32_t>& rank_of_hit,
                     detail::DenseMarks& rank_of, std::vector<std::uint32_t>& count, std::size_t k,
                     std::size_t group_size, GroupId group_id, GroupedSlots& out) {
  count.clear();
  // Pass 1: rank the first k groups to appear and count their parts.
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    const std::uint32_t g = rank_of_hit[i];
    std::uint32_t r = kSkip;
    if (g != GroupOrdinals::kNone) {
      if (rank_of.marked(g)) {
        r = rank_of.value(g);
      } else if (out.ordinals.size() < k) {
        r = static_cast<std::uint32_t>(out.ordinals.size());
        rank_of.mark(g, r);
        out.ordinals.push_back(group_id(i, g));
        count.push_back(0);
      }
    }
    rank_of_hit[i] = r;
    if (r != kSkip) ++count[r];
  }
  // Pass 2: offsets from the counts, then place every hit; `ranked` order keeps each group's
  // hits in rank order.
  const std::size_t ng = out.ordinals.size();
  out.best_end.resize(ng);
  out.parts_end.resize(ng);
  std::uint32_t best_total = 0, parts_total = 0;
  for (std::size_t r = 0; r < ng; ++r) {
    best_total += static_cast<std::uint32_t>(std::min<std::size_t>(count[r], group_size));
    parts_total += count[r];
    out.best_end[r] = best_total;
    out.parts_end[r] = parts_total;
  }
  out.best.resize(best_total);
  out.parts.resize(parts_total);
  // Reuse `count` as the number placed so far per group.
  std::fill(count.begin(), count.end(), 0);
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    const std::uint32_t r = rank_of_hit[i];
    if (r == kSkip) continue;
    const std::uint32_t j = count[r]++;
    out.parts[out.parts_begin(r) + j] = ranked[i].slot;
    if (j < group_size) out.best[out.best_begin(r) + j] = ranked[i];
  }
}

}  // namespace

void collapse_sorted(const std::vector<Scored>& sorted, const GroupOrdinals& groups, std::size_t k,
                     std::size_t group_size, GroupedSlots& out) {
  out.clear();
  detail::GroupingScratch& sc = search_scratch().grouping;
  detail::DenseMarks& rank_of = sc.marks;                // group ordinal -> rank among kept groups
  std::vector<std::uint32_t>& rank_of_hit = sc.per_hit;  // per hit: its group, then its rank or kSkip
  rank_of.begin(groups.size());
  rank_of_hit.resize(sorted.size());
  // Gather every hit's group first: independent loads that overlap their cache misses,
  // where the ranking loop would wait for each one in turn.
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const std::uint32_t g = groups.of_slot(sorted[i].slot);
    rank_of_hit[i] = g;
    if (g != GroupOrdinals::kNone) rank_of.prefetch(g);
  }
  collapse_ranked(
      sorted, rank_of_hit, rank_of, sc.per_group, k, group_size, [](std::size_t, std::uint32_t g) { return g; }, out);
}

void collapse_keys(const std::vector<Scored>& ranked, const std::int64_t* keys, std::size_t k, std::size_t group_size,
                   GroupedSlots& out) {
  out.clear();
  const std::size_t n = ranked.size();
  detail::GroupingScratch& sc = search_scratch().grouping;
  // Dense ordinals of the keys met: positions ordered by (key, position), numbered per key.
  std::vector<std::pair<std::int64_t, std::uint32_t>>& by_key = sc.keyed;
  by_key.resize(n);
  for (std::size_t i = 0; i < n; ++i) by_key[i] = {keys[i], static_cast<std::uint32_t>(i)};
  std::sort(by_key.begin(), by_key.end());
  std::vector<std::uint32_t>& rank_of_hit = sc.per_hit;
  rank_of_hit.resize(n);
  std::uint32_t ordinals = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (j > 0 && by_key[j].first != by_key[j - 1].first) ++ordinals;
    rank_of_hit[by_key[j].second] = ordinals;
  }
  sc.marks.begin(n == 0 ? 0 : ordinals + 1);
  collapse_ranked(
      ranked, rank_of_hit, sc.marks, sc.per_group, k, group_size,
      [](std::size_t i, std::uint32_t) { return static_cast<std::uint32_t>(i); }, out);
}

std::size_t count_groups(const std::vector<Scored>& hits, const GroupOrdinals& groups, std::size_t k) {
  detail::DenseMarks& seen = search_scratch().grouping.marks;
  seen.begin(groups.size());
  std::size_t n = 0;
  for (const Scored& s : hits) {
    const std::uint32_t g = groups.of_slot(s.slot);
    if (g == GroupOrdinals::kNone || seen.marked(g)) continue;
    seen.mark(g, 0);
    if (++n >= k) break;
  }
  return n;
}

void collapse_exact(const std::vector<Slot>& rows, const std::vector<float>& dist, const GroupOrdinals& groups,
                    std::size_t k, std::size_t group_size, GroupedSlots& out) {
  out.clear();
  // Best distance per group in one pass over dense ordinals, then the k best groups.
  const std::size_t ng = groups.size();
  detail::GroupingScratch& sc = search_scratch().grouping;
  std::vector<Scored>& best_of = sc.best_of;
  std::vector<std::pair<Scored, std::uint32_t>>& ranked = sc.ranked;
  detail::DenseMarks& rank_of = sc.marks;
  std::vector<std::pair<std::uint32_t, Scored>>& members = sc.members;
  best_of.assign(ng, Scored{std::numeric_limits<float>::infinity(), kNoSlot});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint32_t g = groups.of_slot(rows[i]);
    if (g == GroupOrdinals::kNone) continue;
    const Scored s{dist[i], rows[i]};
    if (s < best_of[g]) best_of[g] = s;
  }
  ranked.clear();
  for (std::uint32_t g = 0; g < ng; ++g) {
    if (best_of[g].slot != kNoSlot) ranked.push_back({best_of[g], g});
  }
  const auto by_best = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (ranked.size() > k) {
    std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(k), ranked.end(), by_best);
    ranked.resize(k);
  }
  std::sort(ranked.begin(), ranked.end(), by_best);
  rank_of.begin(ng);
  for (std::size_t r = 0; r < ranked.size(); ++r) {
    out.ordinals.push_back(ranked[r].second);
    rank_of.mark(ranked[r].second, static_cast<std::uint32_t>(r));
  }
  // Every part of a kept group, ordered by (group rank, distance), then cut into groups.
  members.clear();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint32_t g = groups.of_slot(rows[i]);
    if (g == GroupOrdinals::kNone || !rank_of.marked(g)) continue;
    members.push_back({rank_of.value(g), Scored{dist[i], rows[i]}});
  }
  std::sort(members.begin(), members.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first < b.first : a.second < b.second; });
  out.best_end.resize(ranked.size());
  out.parts_end.resize(ranked.size());
  out.parts.reserve(members.size());
  std::size_t i = 0;
  for (std::uint32_t r = 0; r < ranked.size(); ++r) {
    std::size_t taken = 0;
    for (; i < members.size() && members[i].first == r; ++i, ++taken) {
      if (taken < group_size) out.best.push_back(members[i].second);
      out.parts.push_back(members[i].second.slot);
    }
    out.best_end[r] = static_cast<std::uint32_t>(out.best.size());
    out.parts_end[r] = static_cast<std::uint32_t>(out.parts.size());
  }
}

}  // namespace kbcore
