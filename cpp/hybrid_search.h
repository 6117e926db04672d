#pragma once
// A hybrid search's two legs in one native call: the BM25 leg on the calling thread while the
// vector leg runs on a worker of the search pool, then reciprocal rank fusion. The legs are
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

/// The fused list of one hybrid query and how many hits each leg had (a leg with fewer hits
/// than k returned every match).
struct HybridRrf {
  std::vector<Fused> fused;     // best first (rrf_fuse's order and scores)
  std::size_t vector_hits = 0;  // vector leg ids that are not padding (<= k)
  std::size_t text_hits = 0;    // BM25 leg rows returned (<= k)
};

/// Both legs of one hybrid query over `k` candidates each, under the same `filter` (null:
/// none): Index::search of `query` (index.dim() floats, HNSW candidate list `ef`, 0 = the
/// index's) and Index::search_text of `text`, run concurrently on `pool` (at most `threads`
/// threads, the caller included; 0 = search_many's rule: the idle hardware threads under the
/// default pool size; 1 = one after the other on the caller), then rrf_fuse(.., rrf_k).
/// Throws what those calls throw (InvalidArgument for k = 0, k or ef above the cap, a bad
/// filter or query, a bad rrf_k) before anything is fused. Shared locks only; thread-safe.
HybridRrf search_hybrid_rrf(const Index& index, const float* query, const std::string& text, std::size_t k,
                            std::size_t ef, const FilterNode* filter, double rrf_k, ThreadPool& pool,
                            std::size_t threads = 0);

}  // namespace kbcore
