#include "search_plan_unfiltered.h"

namespace kbcore {

bool scan_beats_walk(std::size_t live, std::size_t ef, double evals_per_ef) {
  // The scan reads each row once, in order; the walk's evaluations are each kWalkEvalCost rows
  // of scan. The scan's answer is exact, so choosing it never lowers recall.
  const double walk = evals_per_ef * static_cast<double>(ef) * kWalkEvalCost;
  return static_cast<double>(live) <= walk;
}

}  // namespace kbcore
