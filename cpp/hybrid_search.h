#pragma once
// A hybrid search's two legs in one native call: the BM25 leg on the calling thread while the
// vector leg runs on a worker of the search pool (and, for RRF, the fusion). The legs are
// the very searches Index::search_text and Index::search run (same hits, same values), so the
// fused list is that of fusing their answers (rank_fusion.h); only the wall time changes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "index.h"
#include "rank_fusion.h"
#include "thread_pool.h"

namespace kbcore {

/// The two legs of one hybrid query, as Index::search and Index::search_text return them.
struct HybridLegs {
  std::vector<std::int64_t> ids;       // k vector-leg ids, ascending distance, padded with -1
  std::vector<float> distances;        // their distances (padding: Index::search's value)
  std::vector<std::int64_t> text_ids;  // up to k BM25 rows, score descending
  std::vector<float> text_scores;      // their BM25 scores
};

/// Both legs of one hybrid query over `k` candidates each, under the same `filter` (null:
/// none): Index::search of `query` (index.dim() floats, HNSW candidate list `ef`, 0 = the
/// index's) and Index::search_text of `text`, run concurrently on `pool` (at most `threads`
/// threads, the caller included; 0 = search_many's rule: the idle hardware threads under the
/// default pool size; 1 = one after the other on the caller). Throws what those calls throw
/// (InvalidArgument for k = 0, k or ef above the cap, a bad filter or query); k and ef are
/// checked before either leg starts. Shared locks only; thread-safe.
HybridLegs search_hybrid_legs(const Index& index, const float* query, const std::string& text, std::size_t k,
                              std::size_t ef, const FilterNode* filter, ThreadPool& pool, std::size_t threads = 0);

/// The fused list of one hybrid query and how many hits each leg had (a leg with fewer hits
/// than k returned every match).
struct HybridRrf {
  std::vector<Fused> fused;     // best first (rrf_fuse's order and scores)
  std::size_t vector_hits = 0;  // vector leg ids that are not padding (<= k)
  std::size_t text_hits = 0;    // BM25 leg rows returned (<= k)
};

/// search_hybrid_legs, then rrf_fuse(.., rrf_k) of the two legs. Throws InvalidArgument for a
/// bad rrf_k (before any search) and what search_hybrid_legs throws. Thread-safe.
HybridRrf search_hybrid_rrf(const Index& index, const float* query, const std::string& text, std::size_t k,
                            std::size_t ef, const FilterNode* filter, double rrf_k, ThreadPool& pool,
                            std::size_t threads = 0);

}  // namespace kbcore
