#include "hybrid_search.h"

#include <cmath>
#include <string>
#include <utility>

#include "errors.h"
#include "multi_search.h"

namespace kbcore {

HybridRrf search_hybrid_rrf(const Index& index, const float* query, const std::string& text, std::size_t k,
                            std::size_t ef, const FilterNode* filter, double rrf_k, ThreadPool& pool,
                            std::size_t threads) {
  // Every argument is checked before a leg starts: a failure never leaves one leg running.
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
  check_max_ef("k", k);
  if (ef != 0) check_max_ef("ef", ef);
  if (!(rrf_k >= 0.0) || !std::isfinite(rrf_k)) {
    throw InvalidArgument("rrf k must be a finite number >= 0, got " + std::to_string(rrf_k));
  }
  SearchParams params;
  params.k = k;
  params.ef = ef;
  params.threads = 1;
  params.filter = filter;
  std::vector<std::int64_t> ids(k, -1);
  std::vector<float> dist(k, 0.0F);
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
          index.search(query, 1, params, ids.data(), dist.data());
        }
      },
      threads == 0 ? pool_threads(2, pool) : threads);
  HybridRrf out;
  for (const std::int64_t id : ids) out.vector_hits += id >= 0 ? 1 : 0;
  out.text_hits = matches.size();
  std::vector<std::int64_t> text_ids(matches.size());
  std::vector<float> text_scores(matches.size());
  for (std::size_t i = 0; i < matches.size(); ++i) {
    text_ids[i] = matches[i].first;
    text_scores[i] = matches[i].second;
  }
  out.fused = rrf_fuse(ids.data(), dist.data(), k, text_ids.data(), text_scores.data(), matches.size(), rrf_k);
  return out;
}

}  // namespace kbcore
