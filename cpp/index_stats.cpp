// Index::search_stats: the debug statistics of the graph walk (hops and distances scored per
// query), for the analysis of graph quality and locality (docs/graph-quality.md). Kept apart
// from index_search.cpp so that the counting instantiation of the walk is the only one here.
#include <algorithm>
#include <shared_mutex>
#include <type_traits>

#include "errors.h"
#include "hnsw_codes.h"
#include "index.h"

namespace kbcore {

void Index::search_stats(const float* queries, std::size_t nq, std::size_t k, std::size_t ef, std::uint64_t* out_hops,
                         std::uint64_t* out_upper_hops, std::uint64_t* out_scored) const {
  if (!graph_) throw InvalidArgument("search_stats needs an hnsw index: a flat index walks no graph");
  const std::vector<float> prepared = prepare_queries(queries, nq, k, nullptr);
  check_max_ef("ef", ef);
  const std::size_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::fill(out_hops, out_hops + nq, 0);
  std::fill(out_upper_hops, out_upper_hops + nq, 0);
  std::fill(out_scored, out_scored + nq, 0);
  if (store_.size() == 0) return;
  // The bounds of search(): the same k, ef and re-rank depth, so the walk is the same.
  const std::size_t kk = std::min(k, store_.size());
  const std::size_t e = std::min(ef == 0 ? config_.ef_search : ef, store_.size());
  const std::size_t depth = std::min(rerank_depth(e, kk), store_.size());
  const CodeStore* codes = search_codes();
  for (std::size_t qi = 0; qi < nq; ++qi) {
    const float* q = prepared.data() + qi * dim;
    WalkStats st;
    if (codes != nullptr) {
      std::visit([&](const auto& c) { HnswCodeSearch::search_counted(*graph_, c, q, kk, e, depth, st); }, *codes);
    } else {
      graph_->search_counted(q, kk, e, st);
    }
    out_hops[qi] = st.hops;
    out_upper_hops[qi] = st.upper_hops;
    out_scored[qi] = st.scored;
  }
}

}  // namespace kbcore
