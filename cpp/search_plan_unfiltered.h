#pragma once
// Planning of an unfiltered k-NN search on a graph index: the graph walk, or the exact scan of
// every row when the walk would score a large share of them anyway (small graphs, and nearly
// orthogonal vectors such as the hashing embedder's, where the walk finds no short path).
#include <cstddef>

namespace kbcore {

/// Cost of a walk's distance evaluation (a cache miss per node, link reads, visited set and
/// heaps) in rows of sequential scan. Measured at ef 64 on 1k-19k x 384 rows
/// (benches/bench_unfiltered_plan.py, figures in docs/index.md): 2.3 on float32 rows that fit in
/// L2, falling to 1.2-2.0 once they do not (the scan then streams from L3), and 2.3-3.1 on sq8
/// codes. A lower value than most, so that the scan is chosen only where it wins.
inline constexpr double kWalkEvalCost = 1.5;

/// Distance evaluations per unit of ef the plan assumes for a walk: a fixed figure (EvalStats'
/// value before any walk is measured), not the index's running average, so that the plan, and
/// with it the answer, depends only on the rows, the configuration and the query: the same
/// after a save and load, in any process, whatever was searched before.
inline constexpr double kPlanEvalsPerEf = 12.0;
/// Whether an unfiltered search over `live` rows at this ef (max(ef, k)) is cheaper as the exact
/// scan of every row than as a graph walk that makes `evals_per_ef` * ef distance evaluations
/// (kPlanEvalsPerEf in the search). O(1).
bool scan_beats_walk(std::size_t live, std::size_t ef, double evals_per_ef);

}  // namespace kbcore
