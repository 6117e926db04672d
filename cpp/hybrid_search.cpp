#include "hybrid_search.h"

#include <cmath>
#include <string>
#include <utility>

#include "errors.h"
#include "multi_search.h"

namespace kbcore {

HybridLegs search_hybrid_legs(const Index& index, const float* query, const std::string& text, std::size_t k,
                              std::size_t ef, const FilterNode* filter, ThreadPool& pool, std::size_t threads) {
  // Every argument is checked before a leg starts: a failure never leaves one leg running.
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
  check_max_ef("k", k);
  if (ef != 0) check_max_ef("ef", ef);
  SearchParams params;
  params.k = k;
  params.ef = ef;
  params.threads = 1;
  params.filter = filter;
  HybridLegs out;
  out.ids.assign(k, -1);
  out.distances.assign(k, 0.0F);
  std::vector<std::pair<std::int64_t, float>> matches;
  // Item 0, the longer BM25 leg, is the caller's own first claim; a worker that wakes in time
  // takes item 1, the vector leg, and otherwise the caller runs it after BM25 (never a wait
  // for a busy pool).
  pool.run(
      2,
      [&](std::size_t item) {
        if (item == 0) {
          matches = index.search_text(text, k, filter);
        } else {
          index.search(query, 1, params, out.ids.data(), out.distances.data());
        }
      },
      threads == 0 ? pool_threads(2, pool) : threads);
  out.text_ids.resize(matches.size());
  out.text_scores.resize(matches.size());
  for (std::size_t i = 0; i < matches.size(); ++i) {
    out.text_ids[i] = matches[i].first;
    out.text_scores[i] = matches[i].second;
  }
  return out;
}

HybridRrf search_hybrid_rrf(const Index& index, const float* query, const std::string& text, std::size_t k,
                            std::size_t ef, const FilterNode* filter, double rrf_k, ThreadPool& pool,
                            std::size_t threads) {
  if (!(rrf_k >= 0.0) || !std::isfinite(rrf_k)) {
    throw InvalidArgument("rrf k must be a finite number >= 0, got " + std::to_string(rrf_k));
  }
  const HybridLegs legs = search_hybrid_legs(index, query, text, k, ef, filter, pool, threads);
  HybridRrf out;
  for (const std::int64_t id : legs.ids) out.vector_hits += id >= 0 ? 1 : 0;
  out.text_hits = legs.text_ids.size();
  out.fused = rrf_fuse(legs.ids.data(), legs.distances.data(), k, legs.text_ids.data(), legs.text_scores.data(),
                       legs.text_ids.size(), rrf_k);
  return out;
}

}  // namespace kbcore
