// The search executors of Index: k-NN search (exact, unfiltered graph, and the filtered
// strategies of search_plan.h), grouped search and BM25 text search. They share the query
// prologue (prepare_queries), the exact completion with rows not linked yet (merge_pending)
// and the gathering of the rows an exact scan reads (candidate_rows).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>

#include "errors.h"
#include "flat_index.h"
#include "hnsw_codes.h"
#include "index.h"
#include "parallel.h"
#include "search_scratch.h"
#include "vector_checks.h"

namespace kbcore {
namespace {

// The rows passing `filter` as a filtered search first needs them: the list of passing rows
// when few pass, else the bitmap, or for a simple leaf only its count and a per-slot
// predicate (the form the strategy needs is derived once it is known).
FilterMatches match_for_search(const FilterNode& filter, const MetadataStore& meta, const VectorStore& store) {
  const auto rows_up_to = static_cast<std::size_t>(kRowsListFraction * static_cast<double>(store.size()));
  return match_filter(filter, meta, store.live_bitmap(), rows_up_to, store.size() == store.slot_count(),
                      /*allow_predicate=*/true);
}

void pad(std::int64_t* ids, float* dist, std::size_t from, std::size_t k) {
  for (std::size_t j = from; j < k; ++j) {
    ids[j] = -1;
    dist[j] = std::numeric_limits<float>::infinity();
  }
}

// Merges two ascending result lists into the k best.
std::vector<Scored> merge_topk(std::vector<Scored> a, const std::vector<Scored>& b, std::size_t k) {
  if (b.empty()) return a;
  std::vector<Scored> out;
  out.reserve(std::min(k, a.size() + b.size()));
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  if (out.size() > k) out.resize(k);
  return out;
}

}  // namespace

Strategy Index::choose_strategy(std::size_t passing, std::size_t live, std::size_t ef) const {
  return kbcore::choose_strategy(graph_ != nullptr, passing, live, ef, evals_.per_ef());
}

std::vector<float> Index::prepare_queries(const float* queries, std::size_t nq, std::size_t k,
                                          const FilterNode* filter) const {
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
  check_max_ef("k", k);
  if (filter != nullptr) validate_filter(*filter);
  const std::size_t dim = config_.dim;
  std::vector<float> prepared(nq * dim);
  for (std::size_t i = 0; i < nq; ++i) {
    float* out = prepared.data() + i * dim;
    std::memcpy(out, queries + i * dim, dim * sizeof(float));
    if (!all_finite(out, dim)) throw InvalidArgument("query contains NaN or infinity");
    if (config_.metric == Metric::kCosine && !normalise(out, dim)) {
      throw InvalidArgument("query is all zeros and has no direction under the cosine metric");
    }
  }
  return prepared;
}

template <typename Accept>
std::vector<Scored> Index::merge_pending(std::vector<Scored> res, const float* q, const Accept& accept,
                                         std::size_t keep) const {
  const std::vector<Slot>& pending = graph_->pending();
  if (pending.empty()) return res;
  std::vector<Slot> passing;
  passing.reserve(pending.size());
  for (Slot s : pending) {
    if (accept(s)) passing.push_back(s);
  }
  const std::size_t take = std::min(keep, passing.size());
  return merge_topk(std::move(res), scan_slots(store_, config_.metric, q, passing, take), keep);
}

std::vector<Slot> Index::candidate_rows(const Bitmap* allowed, std::size_t passing) const {
  std::vector<Slot> rows;
  rows.reserve(passing);
  (allowed != nullptr ? *allowed : store_.live_bitmap()).for_each([&](Slot s) { rows.push_back(s); });
  return rows;
}

void Index::search(const float* queries, std::size_t nq, const SearchParams& p, std::int64_t* out_ids,
                   float* out_dist) const {
  const std::size_t width = p.k;  // of the caller's rows of results, padded past the hits
  const std::vector<float> prepared = prepare_queries(queries, nq, width, p.filter);
  check_max_ef("ef", p.ef);
  const std::size_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(mutex_);
  const auto write = [&](std::size_t qi, const std::vector<Scored>& res) {
    std::int64_t* ids = out_ids + qi * width;
    float* dist = out_dist + qi * width;
    const std::size_t m = std::min(width, res.size());
    for (std::size_t j = 0; j < m; ++j) {
      ids[j] = store_.id_of(res[j].slot);
      dist[j] = res[j].dist;
    }
    pad(ids, dist, m, width);
  };
  if (store_.size() == 0) {
    for (std::size_t qi = 0; qi < nq; ++qi) pad(out_ids + qi * width, out_dist + qi * width, 0, width);
    return;
  }
  // No search finds more rows than exist: k and ef beyond the row count change no answer, and
  // bounding them here bounds every buffer below (heaps, candidate lists, re-rank depth) by
  // the rows, whatever the caller asked (docs/index.md, "Limits").
  const std::size_t k = std::min(width, store_.size());
  const std::size_t ef = std::min(p.ef == 0 ? config_.ef_search : p.ef, store_.size());
  if (p.filter != nullptr) {
    FilterMatches matches = match_for_search(*p.filter, meta_, store_);
    const std::size_t passing = matches.count;
    const Strategy strategy = !graph_                      ? Strategy::kExact
                              : p.force != Strategy::kAuto ? p.force
                                                           : choose_strategy(passing, store_.size(), std::max(ef, k));
    // The graph traversals test the bitmap, or the walk the leaf's predicate (it tests only the
    // nodes it admits: at 50 % passing, building the bitmap cost a third of a walk); the exact
    // scan reads the list of passing rows.
    const bool by_predicate = strategy == Strategy::kFilteredWalk && matches.has_predicate;
    if (strategy != Strategy::kExact && !by_predicate) matches.ensure_bitmap();
    const Bitmap& allowed = matches.bitmap;
    const SlotPredicate& predicate = matches.predicate;
    const auto admits = [&](Slot s) { return by_predicate ? predicate(s) : allowed.test(s); };
    std::once_flag rows_once;
    const auto passing_rows = [&]() -> const std::vector<Slot>& {
      std::call_once(rows_once, [&] { matches.ensure_rows(); });
      return matches.rows;
    };
    const double sel = static_cast<double>(passing) / static_cast<double>(std::max<std::size_t>(store_.size(), 1));
    // The exact answer over the passing rows: on codes with an exact re-rank when quantized.
    const CodesRef codes = search_codes();
    const std::size_t depth = std::min(rerank_depth(ef, k), store_.size());
    // RaBitQ's scan re-ranks whatever its bound cannot rule out unless a depth is configured.
    const std::size_t scan_depth = codes.rabitq != nullptr && config_.rerank == 0 ? 0 : depth;
    const auto exact = [&](const float* q, const std::vector<Slot>& rows) {
      return codes ? codes.visit([&](const auto& c) {
        return scan_slots_codes(store_, c, config_.metric, q, rows, k, scan_depth);
      })
                   : scan_slots(store_, config_.metric, q, rows, k);
    };
    // A graph answer is completed with the exact scan of rows not linked yet; a traversal
    // that could not reach k passing rows is replaced by the exact answer.
    const auto finish_graph = [&](std::size_t qi, const float* q, std::vector<Scored> res) {
      res = merge_pending(std::move(res), q, admits, k);
      if (res.size() >= std::min(k, passing)) {
        write(qi, res);
      } else {
        write(qi, exact(q, passing_rows()));
      }
    };
    parallel_for(nq, p.threads, [&](std::size_t qi, std::size_t) {
      const float* q = prepared.data() + qi * dim;
      if (strategy == Strategy::kTwoHop) {
        // Per query: where the passing rows are scarce around the query itself (the filter
        // is anti-correlated with it), a filtered walk must cross long failing stretches and
        // loses recall; the exact scan is used instead. The cost model chose the graph, so
        // this is the exception, measured per query in O(M^2).
        // On codes when quantized: the descent then reads no float32 row.
        const auto local = [&] {
          return codes ? codes.visit(
                             [&](const auto& c) { return HnswCodeSearch::local_selectivity(*graph_, c, q, allowed); })
                       : graph_->local_selectivity(q, allowed);
        };
        if (p.force == Strategy::kAuto && local() < kLocalSelectivityRatio * sel) {
          write(qi, exact(q, passing_rows()));
          return;
        }
        std::vector<Scored> res;
        if (codes) {
          res = codes.visit([&](const auto& c) {
            return HnswCodeSearch::search_expanding(*graph_, c, q, std::max(ef, k), &allowed,
                                                    [](const std::vector<Scored>&) { return true; });
          });
          if (res.size() > k) res.resize(k);
        } else {
          res = graph_->search_filtered(q, k, ef, allowed);
        }
        finish_graph(qi, q, std::move(res));
        return;
      }
      if (strategy == Strategy::kFilteredWalk) {
        finish_graph(qi, q,
                     codes ? codes.visit([&](const auto& c) {
                       return HnswCodeSearch::search(*graph_, c, q, k, ef, depth, admits);
                     })
                           : graph_->search_with(q, k, ef, admits));
        return;
      }
      write(qi, exact(q, passing_rows()));
    });
    return;
  }
  if (graph_) {
    std::atomic<std::uint64_t> evals{0};
    const CodesRef codes = search_codes();
    const std::size_t depth = std::min(rerank_depth(ef, k), store_.size());
    parallel_for(nq, p.threads, [&](std::size_t qi, std::size_t) {
      std::size_t e = 0;
      const float* q = prepared.data() + qi * dim;
      std::vector<Scored> res = codes ? codes.visit([&](const auto& c) {
        return HnswCodeSearch::search(*graph_, c, q, k, ef, depth, AcceptAll{}, &e);
      })
                                      : graph_->search_with(q, k, ef, AcceptAll{}, &e);
      // Rows whose graph insertion is deferred are scanned exactly.
      write(qi, merge_pending(std::move(res), q, AcceptAll{}, k));
      evals.fetch_add(e, std::memory_order_relaxed);
    });
    evals_.record(evals.load(), nq, std::max(ef, k));
    return;
  }
  // Exact: each worker scans for a contiguous group of queries so that row blocks are shared.
  const std::size_t workers = resolve_threads(p.threads, nq);
  const std::size_t per = (nq + workers - 1) / workers;
  parallel_for(workers, workers, [&](std::size_t w, std::size_t) {
    const std::size_t begin = w * per;
    const std::size_t end = std::min(nq, begin + per);
    if (begin >= end) return;
    auto res = flat_search(store_, config_.metric, prepared.data() + begin * dim, end - begin, k, AcceptAll{});
    for (std::size_t i = 0; i < res.size(); ++i) write(begin + i, res[i]);
  });
}

std::vector<Index::GroupPage> Index::search_groups(const float* queries, std::size_t nq, const GroupParams& p) const {
  const std::size_t k = p.k;
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
  if (p.group_size == 0) throw InvalidArgument("group_size must be positive, got 0");
  const std::vector<float> prepared = prepare_queries(queries, nq, k, p.filter);
  check_max_ef("ef", p.ef);
  const std::size_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<GroupPage> out(nq);
  if (store_.size() == 0) return out;
  const Field* field = meta_.field(p.group_by);
  if (field == nullptr || field->present_count() == 0) {
    throw InvalidArgument("group_by field '" + p.group_by + "' is not present in any stored row");
  }
  const GroupOrdinals& field_groups = GroupOrdinals::of(*field);
  // Bounded by the rows (k * group_size may overflow): search_expanding would cut it there.
  const std::size_t rows_cap = std::max<std::size_t>(store_.size(), 1);
  const std::size_t per_page = std::min(k, rows_cap) * std::min(p.group_size, rows_cap);
  const std::size_t ef = std::min(std::max(p.ef == 0 ? config_.ef_search : p.ef, per_page), rows_cap);

  Bitmap allowed;
  std::size_t passing = store_.size();
  if (p.filter != nullptr) {
    allowed = evaluate_filter(*p.filter, meta_, store_.live_bitmap());
    passing = allowed.count();
  }
  const Bitmap* allowed_or_all = p.filter != nullptr ? &allowed : nullptr;
  Strategy strategy = Strategy::kExact;
  if (graph_) {
    strategy = p.force != Strategy::kAuto ? p.force
               : p.filter != nullptr      ? choose_strategy(passing, store_.size(), ef)
                                          : Strategy::kTwoHop;
    // Grouped search has one traversal (search_expanding), which scores passing rows only.
    if (strategy == Strategy::kFilteredWalk) strategy = Strategy::kTwoHop;
  }
  // Slots to ids and group ordinals to keys are copied out under the lock (page_of; the
  // caller builds its objects after the lock is released).
  // The rows of the exact path, gathered once: up front for the exact strategy, on the first
  // query that needs them for the graph (its fallback).
  std::vector<Slot> rows;
  std::once_flag rows_once;
  const auto all_rows = [&]() -> const std::vector<Slot>& {
    std::call_once(rows_once, [&] { rows = candidate_rows(allowed_or_all, passing); });
    return rows;
  };
  if (strategy == Strategy::kExact) all_rows();
  const CodesRef codes = search_codes();
  parallel_for(nq, p.threads, [&](std::size_t qi, std::size_t) {
    const float* q = prepared.data() + qi * dim;
    GroupedSlots& groups = search_scratch().groups;  // per thread, reused across queries
    if (strategy == Strategy::kTwoHop) {
      // The candidate list in any order: counting distinct groups needs no sort.
      const auto enough = [&](const std::vector<Scored>& hits) { return count_groups(hits, field_groups, k) >= k; };
      std::vector<Scored> res = codes ? codes.visit([&](const auto& c) {
        return HnswCodeSearch::search_expanding(*graph_, c, q, ef, allowed_or_all, enough);
      })
                                      : graph_->search_expanding(q, ef, allowed_or_all, enough);
      const auto admits = [&](Slot s) { return allowed_or_all == nullptr || allowed_or_all->test(s); };
      res = merge_pending(std::move(res), q, admits, std::numeric_limits<std::size_t>::max());
      collapse_sorted(res, field_groups, k, p.group_size, groups);
      if (groups.size() >= k) {
        page_of(groups, field_groups, out[qi]);
        return;
      }
      // The traversal ran out of reachable candidates before k groups: never return a short
      // page when more groups may exist; answer this query exactly instead.
    }
    const std::vector<Slot>& scan = all_rows();
    std::vector<float> d(scan.size());
    score_slots(store_, config_.metric, q, scan.data(), scan.size(), d.data());
    collapse_exact(scan, d, field_groups, k, p.group_size, groups);
    page_of(groups, field_groups, out[qi]);
  });
  return out;
}

std::vector<std::pair<std::int64_t, float>> Index::search_text(const std::string& query, std::size_t k,
                                                               const FilterNode* filter, const Bm25Stats* stats) const {
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
  check_max_ef("k", k);
  if (filter != nullptr) validate_filter(*filter);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  Bitmap allowed;
  if (filter != nullptr) allowed = evaluate_filter(*filter, meta_, store_.live_bitmap());
  const std::vector<Scored> res = text_.search(query, k, filter != nullptr ? &allowed : nullptr, stats);
  std::vector<std::pair<std::int64_t, float>> out;
  out.reserve(res.size());
  for (const Scored& s : res) out.emplace_back(store_.id_of(s.slot), -s.dist);
  return out;
}

std::size_t Index::count(const FilterNode& filter) const {
  validate_filter(filter);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  // The very evaluation a filtered search runs, so that timing count() times a search's filter.
  return match_for_search(filter, meta_, store_).count;
}

}  // namespace kbcore
