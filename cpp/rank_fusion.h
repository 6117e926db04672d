#pragma once
// Reciprocal rank fusion (Cormack, Clarke & Buettcher, SIGIR 2009) of the two legs of a
// hybrid search, natively: the twin of kbcore.fusion.rrf followed by normalize_rrf for two
// unweighted legs, so that the engine fuses a query's candidates in one call.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kbcore {

/// One id of a fused list and its score.
struct Fused {
  std::int64_t id;
  double score;
};

/// Fuses a distance leg (ids_a with dist_a, smaller is better) and a score leg (ids_b with
/// score_b, larger is better), each ranked by its key and equal keys by id ascending; ids < 0
/// (a search's padding) are skipped, and an id repeated in a leg counts at its first place
/// only (ranks count distinct ids). An id scores the sum over the legs holding it of
/// 1 / (k + rank), rank its 1-based place there, divided by the largest possible score
/// 2 / (k + 1) and capped at 1. Returns every id once, by score descending, then best rank
/// over the legs, then id ascending. These are exactly the values and order of
/// fusion.rrf([leg_a, leg_b], k) then normalize_rrf(.., 2, k) on the same legs. Throws
/// InvalidArgument unless k is finite and >= 0. O((na + nb) log(na + nb)); thread-safe.
std::vector<Fused> rrf_fuse(const std::int64_t* ids_a, const float* dist_a, std::size_t na, const std::int64_t* ids_b,
                            const float* score_b, std::size_t nb, double k);

}  // namespace kbcore
