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
#include <type_traits>

#include "errors.h"
#include "flat_index.h"
#include "hnsw_codes.h"
#include "index.h"
#include "parallel.h"
#include "search_plan_unfiltered.h"
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

// The executors of a search plan: the same operations on the float32 rows and on codes, so
// that the planner (Index::search, Index::search_groups) is written once for both. Each is a
// thin adapter over graph_search.h's walk (HnswIndex's float32 searches, HnswCodeSearch).
//   walk:      descent and level-0 search admitting `accept`, ascending, at most k
//   expanding: the expanding (with `allowed`, two-hop) walk, every result kept, ascending
//   exact:     the exact scan
struct RowExecutor {
  const HnswIndex* graph;  // null for a flat index (exact only)
  const VectorStore& store;
  Metric metric;

  template <typename Accept>
  std::vector<Scored> walk(const float* q, std::size_t k, std::size_t ef, const Accept& accept,
                           std::size_t* evals = nullptr) const {
    return graph->search_with(q, k, ef, accept, evals);
  }
  template <typename Enough>
  std::vector<Scored> expanding(const float* q, std::size_t ef, const Bitmap* allowed, Enough enough) const {
    return graph->search_expanding(q, ef, allowed, enough);
  }
  std::vector<Scored> exact(const float* q, const std::vector<Slot>& rows, std::size_t k) const {
    return scan_slots(store, metric, q, rows, k);
  }
};

template <typename Codes>
struct CodeExecutor {
  const HnswIndex* graph;
  const Codes& codes;
  const VectorStore& store;
  Metric metric;
  std::size_t depth;       // re-rank depth of the walk
  std::size_t scan_depth;  // and of the exact scan (0: whatever an error bound keeps)

  template <typename Accept>
  std::vector<Scored> walk(const float* q, std::size_t k, std::size_t ef, const Accept& accept,
                           std::size_t* evals = nullptr) const {
    return HnswCodeSearch::search(*graph, codes, q, k, ef, depth, accept, evals);
  }
  template <typename Enough>
  std::vector<Scored> expanding(const float* q, std::size_t ef, const Bitmap* allowed, Enough enough) const {
    return HnswCodeSearch::search_expanding(*graph, codes, q, ef, allowed, enough);
  }
  std::vector<Scored> exact(const float* q, const std::vector<Slot>& rows, std::size_t k) const {
    return scan_slots_codes(store, codes, metric, q, rows, k, scan_depth);
  }
};

/// Runs run(executor): a CodeExecutor of the type `codes` holds when set, else a RowExecutor.
template <typename Run>
void with_executor(const CodeStore* codes, const HnswIndex* graph, const VectorStore& store, Metric metric,
                   std::size_t depth, std::size_t scan_depth, const Run& run) {
  if (codes != nullptr) {
    std::visit(
        [&](const auto& c) {
          run(CodeExecutor<std::decay_t<decltype(c)>>{graph, c, store, metric, depth, scan_depth});
        },
        *codes);
  } else {
    run(RowExecutor{graph, store, metric});
  }
}

// Sets this thread's near-probe floor for one filtered walk (GraphSearch::layer0) and reads
// its verdict.
class NearProbeScope {
 public:
  explicit NearProbeScope(double floor) : s_(search_scratch()) {
    s_.near_probe_floor = floor;
    s_.near_probe_failed = false;
  }
  ~NearProbeScope() {
    s_.near_probe_floor = 0.0;
    s_.near_probe_failed = false;
  }
  NearProbeScope(const NearProbeScope&) = delete;
  NearProbeScope& operator=(const NearProbeScope&) = delete;
  bool failed() const { return s_.near_probe_failed; }

 private:
  SearchScratch& s_;
};

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
  // The plan: a strategy (exact scan, graph walk, two-hop walk; for filtered searches chosen
  // by the cost model of search_plan.h) run by one executor, on codes when the index is
  // quantized and trained, else on the float32 rows.
  const CodeStore* codes = search_codes();
  const std::size_t depth = std::min(rerank_depth(ef, k), store_.size());
  // A bounded type's scan (RaBitQ) re-ranks whatever its bound cannot rule out unless a depth
  // is configured.
  const bool bounded =
      codes != nullptr &&
      std::visit([](const auto& c) { return CodeTraits<std::decay_t<decltype(c)>>::kBounded; }, *codes);
  const std::size_t scan_depth = bounded && config_.rerank == 0 ? 0 : depth;
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
    // A forced strategy runs as asked: no near probe.
    const double near_floor = p.force == Strategy::kAuto ? kNearProbeRatio * sel : 0.0;
    const double two_hop_floor = p.force == Strategy::kAuto ? kTwoHopProbeRatio * sel : 0.0;
    with_executor(codes, graph_.get(), store_, config_.metric, depth, scan_depth, [&](const auto& ex) {
      // A graph answer is completed with the exact scan of rows not linked yet; a traversal
      // that could not reach k passing rows is replaced by the exact answer.
      const auto finish_graph = [&](std::size_t qi, const float* q, std::vector<Scored> res) {
        res = merge_pending(std::move(res), q, admits, k);
        if (res.size() >= std::min(k, passing)) {
          write(qi, res);
        } else {
          write(qi, ex.exact(q, passing_rows(), k));
        }
      };
      parallel_for(nq, p.threads, [&](std::size_t qi, std::size_t) {
        const float* q = prepared.data() + qi * dim;
        if (strategy == Strategy::kTwoHop) {
          // Per query: where the query's nearest rows pass far less than `sel` (the filter is
          // anti-correlated with it), the nearest passing rows lie in regions a traversal that
          // scores passing rows only does not reach from the query, and it settles on far
          // ones; the exact scan answers instead. The traversal's near probe measures this
          // after its descent (GraphSearch::expanding), on codes when quantized.
          const NearProbeScope probe(two_hop_floor);
          std::vector<Scored> res =
              ex.expanding(q, std::max(ef, k), &allowed, [](const std::vector<Scored>&) { return true; });
          if (probe.failed()) {
            write(qi, ex.exact(q, passing_rows(), k));
            return;
          }
          if (res.size() > k) res.resize(k);
          finish_graph(qi, q, std::move(res));
          return;
        }
        if (strategy == Strategy::kFilteredWalk) {
          // Per query, as for the two-hop traversal: where the walk's first nodes, the rows
          // nearest the query, pass far less than `sel`, the nearest passing rows lie away from
          // the query and the walk does not reach them; the exact scan answers instead.
          const NearProbeScope probe(near_floor);
          std::vector<Scored> res = ex.walk(q, k, ef, admits);
          if (probe.failed()) {
            write(qi, ex.exact(q, passing_rows(), k));
            return;
          }
          finish_graph(qi, q, std::move(res));
          return;
        }
        write(qi, ex.exact(q, passing_rows(), k));
      });
    });
    return;
  }
  // Unfiltered: the graph walk, unless scanning every row costs less (search_plan_unfiltered.h);
  // `force` picks either (kExact the scan, any graph strategy the walk).
  const bool walk =
      graph_ && (p.force != Strategy::kAuto ? p.force != Strategy::kExact
                                            : !scan_beats_walk(store_.size(), std::max(ef, k), kPlanEvalsPerEf));
  if (walk) {
    std::atomic<std::uint64_t> evals{0};
    with_executor(codes, graph_.get(), store_, config_.metric, depth, scan_depth, [&](const auto& ex) {
      parallel_for(nq, p.threads, [&](std::size_t qi, std::size_t) {
        std::size_t e = 0;
        const float* q = prepared.data() + qi * dim;
        // Rows whose graph insertion is deferred are scanned exactly.
        write(qi, merge_pending(ex.walk(q, k, ef, AcceptAll{}, &e), q, AcceptAll{}, k));
        evals.fetch_add(e, std::memory_order_relaxed);
      });
    });
    evals_.record(evals.load(), nq, std::max(ef, k));
    return;
  }
  if (codes != nullptr) {
    // A quantized graph index scans its codes, as the filtered exact strategy does.
    const std::vector<Slot> rows = candidate_rows(nullptr, store_.size());
    with_executor(codes, graph_.get(), store_, config_.metric, depth, scan_depth, [&](const auto& ex) {
      parallel_for(nq, p.threads,
                   [&](std::size_t qi, std::size_t) { write(qi, ex.exact(prepared.data() + qi * dim, rows, k)); });
    });
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
  // The graph strategy runs on codes when quantized; the exact one scores the float32 rows,
  // quantized or not: grouping every passing row needs every row's exact distance (a scan of
  // codes would re-rank only the best few, and a page may need rows from anywhere).
  with_executor(search_codes(), graph_.get(), store_, config_.metric, 0, 0, [&](const auto& ex) {
    parallel_for(nq, p.threads, [&](std::size_t qi, std::size_t) {
      const float* q = prepared.data() + qi * dim;
      GroupedSlots& groups = search_scratch().groups;  // per thread, reused across queries
      if (strategy == Strategy::kTwoHop) {
        // The candidate list in any order: counting distinct groups needs no sort.
        const auto enough = [&](const std::vector<Scored>& hits) { return count_groups(hits, field_groups, k) >= k; };
        std::vector<Scored> res = ex.expanding(q, ef, allowed_or_all, enough);
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
