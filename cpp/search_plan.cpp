#include "search_plan.h"

#include <algorithm>

namespace kbcore {

void EvalStats::record(std::uint64_t evals, std::size_t nq, std::size_t ef) {
  if (nq == 0 || ef == 0) return;
  const double per_ef = static_cast<double>(evals) / static_cast<double>(nq * ef);
  const double w = std::min(1.0, 0.05 * static_cast<double>(nq));
  x1024_.store(static_cast<std::uint64_t>((this->per_ef() * (1 - w) + per_ef * w) * 1024.0), std::memory_order_relaxed);
}

Strategy choose_strategy(bool has_graph, std::size_t passing, std::size_t live, std::size_t ef, double evals_per_ef) {
  if (!has_graph || passing == 0) return Strategy::kExact;
  // Exact: one sequential distance per passing row. Two-hop: the measured distance evaluations
  // of an unfiltered search at this ef, each about kRandomAccess times dearer than a sequential
  // one (a cache miss per node), plus the reading of link lists of failing neighbours, which
  // grows as 1/selectivity. Below kMinGraphSelectivity two-hop expansion no longer keeps
  // recall@10 >= 0.95 at M = 16 when the passing rows sit in clusters away from the query, so
  // the exact scan is used; at that selectivity both strategies ran at the same speed, so the
  // floor costs nothing. The constants were fitted on 19k and 100k x 384 vectors
  // (benches/bench_filter.py; the figures are in benches/README.md).
  constexpr double kRandomAccess = 8.0;
  constexpr double kHopCost = 0.02;
  constexpr double kMinGraphSelectivity = kRowsListFraction;
  // From this selectivity up, the plain walk replaces the two-hop traversal: it reaches
  // recall@10 >= 0.95 at a lower ef than the two-hop traversal when most neighbours pass, at
  // the same cost per ef. A walk's node costs about half a two-hop node (no second-hop link
  // reads), hence the smaller per-evaluation factor.
  constexpr double kWalkSelectivity = 0.3;
  constexpr double kWalkRandomAccess = 4.0;
  const double sel = static_cast<double>(passing) / static_cast<double>(std::max<std::size_t>(live, 1));
  if (sel < kMinGraphSelectivity) return Strategy::kExact;
  const double evals = evals_per_ef * static_cast<double>(ef);
  if (sel >= kWalkSelectivity) {
    // The plain walk meets about ef / sel nodes to admit ef passing ones, each scored once.
    const double walk = evals / sel * kWalkRandomAccess;
    return static_cast<double>(passing) <= walk ? Strategy::kExact : Strategy::kFilteredWalk;
  }
  const double graph = evals * kRandomAccess * (1.0 + kHopCost / sel);
  return static_cast<double>(passing) <= graph ? Strategy::kExact : Strategy::kTwoHop;
}

}  // namespace kbcore
