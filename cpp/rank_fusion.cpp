#include "rank_fusion.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "errors.h"

namespace kbcore {
namespace {

struct Keyed {
  float key;  // ascending is better
  std::int64_t id;
};

// A leg's ids in rank order: padding dropped, by key, equal keys by id. A search returns its
// leg sorted by key already, so only a leg with equal neighbours is sorted (stably, as
// numpy's lexsort in the Python fusion path).
void ranked(const std::int64_t* ids, const float* keys, std::size_t n, bool larger_better, std::vector<Keyed>& out) {
  out.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (ids[i] >= 0) out.push_back({larger_better ? -keys[i] : keys[i], ids[i]});
  }
  bool ties = false;
  for (std::size_t i = 1; i < out.size() && !ties; ++i) ties = out[i].key == out[i - 1].key;
  if (ties) {
    std::stable_sort(out.begin(), out.end(),
                     [](const Keyed& a, const Keyed& b) { return a.key < b.key || (a.key == b.key && a.id < b.id); });
  }
}

struct Entry {
  std::int64_t id;
  std::uint32_t leg;   // 0 or 1
  std::uint32_t rank;  // 1-based, among the leg's distinct ids
  std::uint32_t at;    // the entry's place in its leg (first occurrence wins)
};

}  // namespace

std::vector<Fused> rrf_fuse(const std::int64_t* ids_a, const float* dist_a, std::size_t na, const std::int64_t* ids_b,
                            const float* score_b, std::size_t nb, double k) {
  if (!(k >= 0.0) || !std::isfinite(k)) {
    throw InvalidArgument("rrf k must be a finite number >= 0, got " + std::to_string(k));
  }
  std::vector<Keyed> leg;
  std::vector<Entry> entries;
  entries.reserve(na + nb);
  ranked(ids_a, dist_a, na, false, leg);
  for (std::size_t i = 0; i < leg.size(); ++i) {
    entries.push_back({leg[i].id, 0, 0, static_cast<std::uint32_t>(i)});
  }
  ranked(ids_b, score_b, nb, true, leg);
  for (std::size_t i = 0; i < leg.size(); ++i) {
    entries.push_back({leg[i].id, 1, 0, static_cast<std::uint32_t>(i)});
  }
  // Group by id; within an id its legs in order and each leg's first occurrence first.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.id < b.id || (a.id == b.id && (a.leg < b.leg || (a.leg == b.leg && a.at < b.at)));
  });
  // A repeat of an id within a leg does not count, nor push the ids after it down: mark the
  // repeats, then (only if there are any) number each leg's remaining entries in leg order.
  std::vector<std::uint8_t> repeat(entries.size(), 0);
  bool repeats = false;
  for (std::size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].id == entries[i - 1].id && entries[i].leg == entries[i - 1].leg) {
      repeat[i] = 1;
      repeats = true;
    }
  }
  if (!repeats) {
    for (Entry& e : entries) e.rank = e.at + 1;
  } else {
    for (std::uint32_t l = 0; l < 2; ++l) {
      const std::size_t n = l == 0 ? na : nb;
      std::vector<std::uint8_t> dropped(n, 0);
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (entries[i].leg == l && repeat[i] != 0) dropped[entries[i].at] = 1;
      }
      std::vector<std::uint32_t> rank_at(n, 0);  // leg place -> rank
      std::uint32_t r = 0;
      for (std::size_t at = 0; at < n; ++at) rank_at[at] = dropped[at] != 0 ? 0 : ++r;
      for (Entry& e : entries) {
        if (e.leg == l) e.rank = rank_at[e.at];
      }
    }
  }
  // One fused entry per id: the leg-a term first, then the leg-b term (two terms add exactly
  // in either order).
  struct Acc {
    std::int64_t id;
    double score;
    std::uint32_t best;
  };
  std::vector<Acc> acc;
  acc.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (repeat[i] != 0) continue;
    const double c = 1.0 / (k + static_cast<double>(e.rank));
    if (!acc.empty() && acc.back().id == e.id) {
      acc.back().score += c;
      acc.back().best = std::min(acc.back().best, e.rank);
    } else {
      acc.push_back({e.id, c, e.rank});
    }
  }
  std::sort(acc.begin(), acc.end(), [](const Acc& a, const Acc& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.best != b.best) return a.best < b.best;
    return a.id < b.id;
  });
  const double top = 2.0 / (k + 1.0);
  std::vector<Fused> out;
  out.reserve(acc.size());
  for (const Acc& a : acc) out.push_back({a.id, std::min(1.0, a.score / top)});
  return out;
}

}  // namespace kbcore
