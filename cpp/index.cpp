#include "index.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>
#include <unordered_set>

#include "binary_io.h"
#include "errors.h"
#include "flat_index.h"
#include "hnsw_sq8.h"
#include "parallel.h"

namespace kbcore {
namespace {

// A query whose two-hop neighbourhood passes less than this fraction of the global
// selectivity is answered by the exact scan (see Index::search).
constexpr double kLocalSelectivityRatio = 0.8;

constexpr char kMagic[8] = {'K', 'B', 'C', 'O', 'R', 'E', 'I', 'X'};

bool all_finite(const float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return false;
  }
  return true;
}

// Divides by the L2 norm in place; returns false for a zero vector.
bool normalise(float* v, std::size_t dim) {
  double s = 0;
  for (std::size_t i = 0; i < dim; ++i) s += static_cast<double>(v[i]) * v[i];
  if (s <= 0 || !std::isfinite(s)) return false;
  const float inv = static_cast<float>(1.0 / std::sqrt(s));
  for (std::size_t i = 0; i < dim; ++i) v[i] *= inv;
  return true;
}

// The factor normalise() scales by; nullopt for a zero vector.
std::optional<float> inverse_norm(const float* v, std::size_t dim) {
  double s = 0;
  for (std::size_t i = 0; i < dim; ++i) s += static_cast<double>(v[i]) * v[i];
  if (s <= 0 || !std::isfinite(s)) return std::nullopt;
  return static_cast<float>(1.0 / std::sqrt(s));
}

// Below this passing fraction a filtered search always scans the passing rows exactly (the
// floor of choose_strategy), so the evaluation hands over their ascending list at once.
constexpr double kRowsListFraction = 0.15;

// The rows passing `filter` as a filtered search first needs them: the list of passing rows
// when few pass, else the bitmap (the other form is derived once the strategy is known).
FilterMatches match_for_search(const FilterNode& filter, const MetadataStore& meta, const VectorStore& store) {
  const auto rows_up_to = static_cast<std::size_t>(kRowsListFraction * static_cast<double>(store.size()));
  return match_filter(filter, meta, store.live_bitmap(), rows_up_to, store.size() == store.slot_count());
}

void pad(std::int64_t* ids, float* dist, std::size_t from, std::size_t k) {
  for (std::size_t j = from; j < k; ++j) {
    ids[j] = -1;
    dist[j] = std::numeric_limits<float>::infinity();
  }
}

}  // namespace

Metric parse_metric(const std::string& name) {
  if (name == "cosine") return Metric::kCosine;
  if (name == "ip") return Metric::kIp;
  if (name == "l2") return Metric::kL2;
  throw InvalidArgument("unknown metric '" + name + "'; expected 'cosine', 'ip' or 'l2'");
}
std::string metric_name(Metric m) {
  switch (m) {
    case Metric::kCosine:
      return "cosine";
    case Metric::kIp:
      return "ip";
    default:
      return "l2";
  }
}
IndexKind parse_kind(const std::string& name) {
  if (name == "hnsw") return IndexKind::kHnsw;
  if (name == "flat") return IndexKind::kFlat;
  throw InvalidArgument("unknown index kind '" + name + "'; expected 'hnsw' or 'flat'");
}
std::string kind_name(IndexKind k) { return k == IndexKind::kHnsw ? "hnsw" : "flat"; }
Quantization parse_quantization(const std::string& name) {
  if (name == "none") return Quantization::kNone;
  if (name == "sq8") return Quantization::kSq8;
  throw InvalidArgument("unknown quantization '" + name + "'; expected None or 'sq8'");
}
std::string quantization_name(Quantization q) { return q == Quantization::kSq8 ? "sq8" : "none"; }

Index::Index(const IndexConfig& config) : config_(config), store_(config.dim) {
  if (config.dim == 0 || config.dim > 65536) {
    throw InvalidArgument("dimension must be in [1, 65536], got " + std::to_string(config.dim));
  }
  if (config.ef_search == 0) throw InvalidArgument("ef must be positive");
  if (config.kind == IndexKind::kHnsw) graph_ = std::make_unique<HnswIndex>(store_, config.metric, config.hnsw);
  if (config.quantization != Quantization::kNone) {
    if (config.kind != IndexKind::kHnsw) {
      throw InvalidArgument("quantization applies to kind 'hnsw' only (a flat index scans float32 rows exactly)");
    }
    codes_ = std::make_unique<Sq8Codes>(config.dim, config.metric);
  }
  if (config.rerank > (1u << 30)) throw InvalidArgument("rerank must be at most 2^30");
  if (config.vectors_on_disk) {
    if (!codes_) {
      throw InvalidArgument("vectors='disk' needs quantization='sq8' (a float32 graph reads every row it visits)");
    }
    store_.use_disk_rows();
  }
}

Index::~Index() = default;

void Index::set_ef_search(std::size_t ef) {
  if (ef == 0) throw InvalidArgument("ef must be positive, got 0");
  std::unique_lock<std::shared_mutex> lock(mutex_);
  config_.ef_search = ef;
}

void Index::add(const float* vectors, const std::int64_t* ids, std::size_t n, std::size_t threads,
                const std::vector<ColumnInput>& columns, const std::vector<std::optional<std::string>>* texts,
                bool defer_graph) {
  if (n == 0) return;
  if (texts != nullptr && texts->size() != n) {
    throw InvalidArgument("got " + std::to_string(n) + " vectors but " + std::to_string(texts->size()) + " texts");
  }
  MetadataStore::validate(columns, n);
  const std::size_t dim = config_.dim;
  // Validate everything before the first change so that a bad batch changes nothing. The rows
  // are not copied here: allocate() copies each one into the store and cosine rows are scaled
  // there by the inverse norm computed now (the same arithmetic as normalising a copy).
  const bool cosine = config_.metric == Metric::kCosine;
  std::vector<float> inv_norm(cosine ? n : 0);
  std::vector<std::uint8_t> bad(n, 0);  // 1: NaN or infinity, 2: zero vector under cosine
  parallel_for(n, threads, [&](std::size_t i, std::size_t) {
    const float* row = vectors + i * dim;
    if (!all_finite(row, dim)) {
      bad[i] = 1;
    } else if (cosine) {
      const std::optional<float> inv = inverse_norm(row, dim);
      if (inv) inv_norm[i] = *inv;
      else bad[i] = 2;
    }
  }, 256);
  for (std::size_t i = 0; i < n; ++i) {
    if (bad[i] == 1) {
      throw InvalidArgument("vector at row " + std::to_string(i) + " (id " + std::to_string(ids[i]) +
                            ") contains NaN or infinity");
    }
    if (bad[i] == 2) {
      throw InvalidArgument("vector at row " + std::to_string(i) + " (id " + std::to_string(ids[i]) +
                            ") is all zeros and has no direction under the cosine metric");
    }
  }
  {
    std::unordered_set<std::int64_t> seen;
    seen.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (ids[i] == -1) {
        throw InvalidArgument("id -1 (row " + std::to_string(i) + ") is reserved: search pads missing results with -1");
      }
      if (!seen.insert(ids[i]).second) {
        throw InvalidArgument("duplicate id " + std::to_string(ids[i]) + " in one add() batch (row " +
                              std::to_string(i) + "); each id may appear once per batch");
      }
    }
  }
  // Tokenize and count the texts for the BM25 leg (in parallel, against a batch vocabulary)
  // before taking the write lock; under it only the batch's distinct terms are looked up.
  std::optional<Bm25Batch> text_batch;
  if (texts != nullptr) text_batch.emplace(*texts, threads);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  // Upsert: ids already present are removed (with graph repair) and inserted anew.
  std::vector<Slot> replaced;
  for (std::size_t i = 0; i < n; ++i) {
    if (auto s = store_.slot_of(ids[i])) replaced.push_back(*s);
  }
  if (!replaced.empty()) remove_locked(replaced, threads);
  store_.reserve_more(n);
  std::vector<Slot> slots(n);
  for (std::size_t i = 0; i < n; ++i) {
    slots[i] = store_.allocate(ids[i], vectors + i * dim);
    if (cosine) {
      float* row = store_.mutable_vector(slots[i]);
      const float inv = inv_norm[i];
      for (std::size_t j = 0; j < dim; ++j) row[j] *= inv;
    }
  }
  meta_.grow(store_.slot_count());
  meta_.assign(slots, columns);
  text_.grow(store_.slot_count());
  if (text_batch) text_.set_batch(*text_batch, slots, threads);
  if (codes_) update_codes_locked(slots, threads);
  if (graph_) {
    if (defer_graph) {
      graph_->add_pending(slots);
    } else {
      graph_->insert_batch(slots, threads);
    }
  }
  store_.release_resident_rows();
}

void Index::train_codes_locked(std::size_t threads) {
  // A sample of at most kSample live rows, evenly spread over the slots, trains the ranges.
  constexpr std::size_t kSample = 16384;
  const std::size_t dim = config_.dim;
  std::vector<Slot> live;
  live.reserve(store_.size());
  store_.live_bitmap().for_each([&](Slot s) { live.push_back(s); });
  if (live.empty()) throw InvalidArgument("cannot train the quantizer of an empty index");
  const std::size_t n = std::min(kSample, live.size());
  std::vector<float> sample(n * dim);
  for (std::size_t i = 0; i < n; ++i) {
    const Slot s = live[i * live.size() / n];
    std::memcpy(sample.data() + i * dim, store_.vector(s), dim * sizeof(float));
  }
  codes_->train(sample.data(), n, n);
  codes_->resize(store_.slot_count());
  parallel_for(live.size(), threads, [&](std::size_t i, std::size_t) {
    codes_->encode(live[i], store_.vector(live[i]));
  }, 256);
}

void Index::update_codes_locked(const std::vector<Slot>& slots, std::size_t threads) {
  if (!codes_->trained()) {
    if (store_.size() >= kSq8TrainRows) train_codes_locked(threads);
    return;
  }
  codes_->resize(store_.slot_count());
  parallel_for(slots.size(), threads, [&](std::size_t i, std::size_t) {
    codes_->encode(slots[i], store_.vector(slots[i]));
  }, 256);
}

bool Index::quantizer_trained() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return search_codes() != nullptr;
}

void Index::retrain_quantizer(std::size_t threads) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!codes_) throw InvalidArgument("this index has no quantization to retrain");
  train_codes_locked(threads);
  store_.release_resident_rows();
}

std::size_t Index::build_graph(std::size_t max_rows, std::size_t threads) {
  if (!graph_) return 0;
  std::unique_lock<std::shared_mutex> lock(mutex_);
  const std::size_t left = graph_->build_pending(max_rows, threads);
  store_.release_resident_rows();
  return left;
}

std::size_t Index::pending_rows() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return graph_ ? graph_->pending().size() : 0;
}

namespace {
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

void Index::remove_locked(const std::vector<Slot>& slots, std::size_t threads) {
  if (graph_) graph_->remove_batch(slots, threads);
  for (Slot s : slots) {
    meta_.clear(s);
    text_.clear(s);
    store_.release(s);
  }
}

void Index::remove(const std::int64_t* ids, std::size_t n, std::size_t threads) {
  if (n == 0) return;
  std::unique_lock<std::shared_mutex> lock(mutex_);
  std::vector<Slot> slots;
  slots.reserve(n);
  std::unordered_set<std::int64_t> seen;
  for (std::size_t i = 0; i < n; ++i) {
    const auto s = store_.slot_of(ids[i]);
    if (!s) throw NotFound("id " + std::to_string(ids[i]) + " is not in the index; nothing was removed");
    if (!seen.insert(ids[i]).second) {
      throw InvalidArgument("duplicate id " + std::to_string(ids[i]) + " in one remove() call");
    }
    slots.push_back(*s);
  }
  remove_locked(slots, threads);
  store_.release_resident_rows();
}

void Index::prepare_query(const float* q, float* out) const {
  std::memcpy(out, q, config_.dim * sizeof(float));
  if (!all_finite(out, config_.dim)) throw InvalidArgument("query contains NaN or infinity");
  if (config_.metric == Metric::kCosine && !normalise(out, config_.dim)) {
    throw InvalidArgument("query is all zeros and has no direction under the cosine metric");
  }
}

Index::Strategy Index::choose_strategy(std::size_t passing, std::size_t live, std::size_t ef) const {
  if (!graph_ || passing == 0) return Strategy::kExact;
  // Exact: one sequential distance per passing row. Graph: the measured distance evaluations
  // of an unfiltered search at this ef, each about kRandomAccess times dearer than a sequential
  // one (a cache miss per node), plus the reading of link lists of failing neighbours, which
  // grows as 1/selectivity. Below kMinGraphSelectivity two-hop expansion no longer keeps
  // recall@10 >= 0.95 at M = 16 when the passing rows sit in clusters away from the query
  // (measured: 0.84 at 10% on 100k), so the exact scan is used; at 10% on 100k x 384 both
  // strategies ran at the same speed, so the floor costs nothing there. Constants were
  // fitted on 19k and 100k x 384 vectors (benches/bench_filter.py).
  constexpr double kRandomAccess = 8.0;
  constexpr double kHopCost = 0.02;
  constexpr double kMinGraphSelectivity = 0.15;
  // From this selectivity up, the plain walk (kWalk) replaces the two-hop traversal: measured
  // on SciFact at 30% and 50%, it reaches recall@10 >= 0.95 at ef 16 where the two-hop
  // traversal needs ef 24, at the same cost per ef. A walk's node costs about half a two-hop
  // node (no second-hop link reads), hence the smaller per-evaluation factor.
  constexpr double kWalkSelectivity = 0.3;
  constexpr double kWalkRandomAccess = 4.0;
  const double sel = static_cast<double>(passing) / static_cast<double>(std::max<std::size_t>(live, 1));
  if (sel < kMinGraphSelectivity) return Strategy::kExact;
  const double evals = static_cast<double>(evals_per_ef_x1024_.load(std::memory_order_relaxed)) / 1024.0 *
                       static_cast<double>(ef);
  if (sel >= kWalkSelectivity) {
    // The plain walk meets about ef / sel nodes to admit ef passing ones, each scored once;
    // it scores failing nodes too, but needs no two-hop link reads and reaches a given
    // recall at a lower ef than the two-hop traversal when most neighbours pass.
    const double walk = evals / sel * kWalkRandomAccess;
    return static_cast<double>(passing) <= walk ? Strategy::kExact : Strategy::kWalk;
  }
  const double graph = evals * kRandomAccess * (1.0 + kHopCost / sel);
  return static_cast<double>(passing) <= graph ? Strategy::kExact : Strategy::kGraph;
}

void Index::search(const float* queries, std::size_t nq, std::size_t k, std::size_t ef,
                   std::size_t threads, std::int64_t* out_ids, float* out_dist,
                   const FilterNode* filter, Strategy force) const {
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
  if (filter != nullptr) validate_filter(*filter);
  const std::size_t dim = config_.dim;
  std::vector<float> prepared(nq * dim);
  for (std::size_t i = 0; i < nq; ++i) prepare_query(queries + i * dim, prepared.data() + i * dim);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (ef == 0) ef = config_.ef_search;
  const auto write = [&](std::size_t qi, const std::vector<Scored>& res) {
    std::int64_t* ids = out_ids + qi * k;
    float* dist = out_dist + qi * k;
    const std::size_t m = std::min(k, res.size());
    for (std::size_t j = 0; j < m; ++j) {
      ids[j] = store_.id_of(res[j].slot);
      dist[j] = res[j].dist;
    }
    pad(ids, dist, m, k);
  };
  if (store_.size() == 0) {
    for (std::size_t qi = 0; qi < nq; ++qi) pad(out_ids + qi * k, out_dist + qi * k, 0, k);
    return;
  }
  if (filter != nullptr) {
    FilterMatches matches = match_for_search(*filter, meta_, store_);
    const std::size_t passing = matches.count;
    const Strategy strategy = !graph_ ? Strategy::kExact
                              : force != Strategy::kAuto ? force
                                                         : choose_strategy(passing, store_.size(), std::max(ef, k));
    // The graph traversals test the bitmap; the exact scan reads the ascending list of passing rows.
    if (strategy != Strategy::kExact) matches.ensure_bitmap();
    const Bitmap& allowed = matches.bitmap;
    std::once_flag rows_once;
    const auto passing_rows = [&]() -> const std::vector<Slot>& {
      std::call_once(rows_once, [&] { matches.ensure_rows(); });
      return matches.rows;
    };
    const double sel = static_cast<double>(passing) / static_cast<double>(std::max<std::size_t>(store_.size(), 1));
    // The exact answer over the passing rows: on codes with an exact re-rank when quantized.
    const Sq8Codes* codes = search_codes();
    const auto exact = [&](const float* q, const std::vector<Slot>& rows) {
      return codes ? scan_slots_sq8(store_, *codes, config_.metric, q, rows, k, rerank_depth(ef, k))
                   : scan_slots(store_, config_.metric, q, rows, k);
    };
    // A graph answer is completed with the exact scan of rows not linked yet; a traversal
    // that could not reach k passing rows is replaced by the exact answer.
    const auto finish_graph = [&](std::size_t qi, const float* q, std::vector<Scored> res) {
      if (!graph_->pending().empty()) {
        std::vector<Slot> fresh;
        for (Slot s : graph_->pending()) {
          if (allowed.test(s)) fresh.push_back(s);
        }
        res = merge_topk(std::move(res), scan_slots(store_, config_.metric, q, fresh, k), k);
      }
      if (res.size() >= std::min(k, passing)) {
        write(qi, res);
      } else {
        write(qi, exact(q, passing_rows()));
      }
    };
    parallel_for(nq, threads, [&](std::size_t qi, std::size_t) {
      const float* q = prepared.data() + qi * dim;
      if (strategy == Strategy::kGraph) {
        // Per query: where the passing rows are scarce around the query itself (the filter
        // is anti-correlated with it), a filtered walk must cross long failing stretches and
        // loses recall; the exact scan is used instead. The cost model chose the graph, so
        // this is the exception, measured per query in O(M^2).
        if (force == Strategy::kAuto && graph_->local_selectivity(q, allowed) < kLocalSelectivityRatio * sel) {
          write(qi, exact(q, passing_rows()));
          return;
        }
        std::vector<Scored> res;
        if (codes) {
          res = HnswSq8Search::search_expanding(*graph_, *codes, q, std::max(ef, k), &allowed,
                                                [](const std::vector<Scored>&) { return true; });
          if (res.size() > k) res.resize(k);
        } else {
          res = graph_->search_filtered(q, k, ef, allowed);
        }
        finish_graph(qi, q, std::move(res));
        return;
      }
      if (strategy == Strategy::kWalk) {
        const auto accept = [&allowed](Slot s) { return allowed.test(s); };
        finish_graph(qi, q, codes ? HnswSq8Search::search(*graph_, *codes, q, k, ef, rerank_depth(ef, k), accept)
                                  : graph_->search_with(q, k, ef, accept));
        return;
      }
      write(qi, exact(q, passing_rows()));
    });
    return;
  }
  if (graph_) {
    std::atomic<std::uint64_t> evals{0};
    const Sq8Codes* codes = search_codes();
    parallel_for(nq, threads, [&](std::size_t qi, std::size_t) {
      std::size_t e = 0;
      const float* q = prepared.data() + qi * dim;
      std::vector<Scored> res =
          codes ? HnswSq8Search::search(*graph_, *codes, q, k, ef, rerank_depth(ef, k), AcceptAll{}, &e)
                : graph_->search_with(q, k, ef, AcceptAll{}, &e);
      // Rows whose graph insertion is deferred are scanned exactly.
      if (!graph_->pending().empty()) {
        res = merge_topk(std::move(res), scan_slots(store_, config_.metric, q, graph_->pending(), k), k);
      }
      write(qi, res);
      evals.fetch_add(e, std::memory_order_relaxed);
    });
    // Exponential average of evaluations per unit of ef, for the filtered cost model.
    const double per_ef = static_cast<double>(evals.load()) / static_cast<double>(nq * std::max(ef, k));
    const double old = static_cast<double>(evals_per_ef_x1024_.load(std::memory_order_relaxed)) / 1024.0;
    const double w = std::min(1.0, 0.05 * static_cast<double>(nq));
    evals_per_ef_x1024_.store(static_cast<std::uint64_t>((old * (1 - w) + per_ef * w) * 1024.0),
                              std::memory_order_relaxed);
    return;
  }
  // Exact: each worker scans for a contiguous group of queries so that row blocks are shared.
  const std::size_t workers = resolve_threads(threads, nq);
  const std::size_t per = (nq + workers - 1) / workers;
  parallel_for(workers, workers, [&](std::size_t w, std::size_t) {
    const std::size_t begin = w * per;
    const std::size_t end = std::min(nq, begin + per);
    if (begin >= end) return;
    auto res = flat_search(store_, config_.metric, prepared.data() + begin * dim, end - begin, k, AcceptAll{});
    for (std::size_t i = 0; i < res.size(); ++i) write(begin + i, res[i]);
  });
}

std::vector<Index::GroupPage> Index::search_groups(
    const float* queries, std::size_t nq, std::size_t k, const std::string& group_by, std::size_t group_size,
    std::size_t ef, std::size_t threads, const FilterNode* filter, Strategy force) const {
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
  if (group_size == 0) throw InvalidArgument("group_size must be positive, got 0");
  if (filter != nullptr) validate_filter(*filter);
  const std::size_t dim = config_.dim;
  std::vector<float> prepared(nq * dim);
  for (std::size_t i = 0; i < nq; ++i) prepare_query(queries + i * dim, prepared.data() + i * dim);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<GroupPage> out(nq);
  if (store_.size() == 0) return out;
  const Field* field = meta_.field(group_by);
  if (field == nullptr || field->present == 0) {
    throw InvalidArgument("group_by field '" + group_by + "' is not present in any stored row");
  }
  field->ensure_index();
  if (ef == 0) ef = config_.ef_search;
  ef = std::max(ef, k * group_size);

  Bitmap allowed;
  std::size_t passing = store_.size();
  if (filter != nullptr) {
    allowed = evaluate_filter(*filter, meta_, store_.live_bitmap());
    passing = allowed.count();
  }
  Strategy strategy = Strategy::kExact;
  if (graph_) {
    strategy = force != Strategy::kAuto ? force
               : filter != nullptr      ? choose_strategy(passing, store_.size(), ef)
                                        : Strategy::kGraph;
    // Grouped search has one traversal (search_expanding), which scores passing rows only.
    if (strategy == Strategy::kWalk) strategy = Strategy::kGraph;
  }
  std::vector<Slot> rows;
  if (strategy == Strategy::kExact) {
    rows.reserve(passing);
    if (filter != nullptr) {
      allowed.for_each([&](Slot s) { rows.push_back(s); });
    } else {
      store_.live_bitmap().for_each([&](Slot s) { rows.push_back(s); });
    }
  }
  // Slots to ids and group ordinals to keys, copied out under the lock (the caller builds
  // its objects after the lock is released).
  const auto convert = [&](const GroupedSlots& groups, GroupPage& page) {
    const std::size_t ng = groups.size();
    page.key_kinds.resize(ng);
    page.key_ints.resize(ng);
    page.key_str_end.resize(ng);
    page.best_end.assign(groups.best_end.begin(), groups.best_end.end());
    page.parts_end.assign(groups.parts_end.begin(), groups.parts_end.end());
    for (std::size_t g = 0; g < ng; ++g) {
      const auto& key = field->group_keys[groups.ordinals[g]];
      page.key_kinds[g] = static_cast<ValueKind>(key.first);
      if (page.key_kinds[g] == ValueKind::kInt) {
        page.key_ints[g] = key.second;
      } else {
        page.key_ints[g] = 0;
        page.key_chars += meta_.dict().str(static_cast<std::uint32_t>(key.second));
      }
      page.key_str_end[g] = page.key_chars.size();
    }
    page.ids.resize(groups.best.size());
    page.distances.resize(groups.best.size());
    for (std::size_t i = 0; i < groups.best.size(); ++i) {
      page.ids[i] = store_.id_of(groups.best[i].slot);
      page.distances[i] = groups.best[i].dist;
    }
    page.part_ids.resize(groups.parts.size());
    for (std::size_t i = 0; i < groups.parts.size(); ++i) page.part_ids[i] = store_.id_of(groups.parts[i]);
  };
  std::once_flag rows_once;
  const auto all_rows = [&]() -> const std::vector<Slot>& {
    std::call_once(rows_once, [&] {
      if (!rows.empty()) return;
      rows.reserve(passing);
      if (filter != nullptr) {
        allowed.for_each([&](Slot s) { rows.push_back(s); });
      } else {
        store_.live_bitmap().for_each([&](Slot s) { rows.push_back(s); });
      }
    });
    return rows;
  };
  const Sq8Codes* codes = search_codes();
  parallel_for(nq, threads, [&](std::size_t qi, std::size_t) {
    const float* q = prepared.data() + qi * dim;
    thread_local GroupedSlots tls_groups;  // per-thread scratch, reused across queries
    GroupedSlots& groups = tls_groups;
    if (strategy == Strategy::kGraph) {
      // The candidate list in any order: counting distinct groups needs no sort.
      const auto enough = [&](const std::vector<Scored>& hits) { return count_groups(hits, *field, k) >= k; };
      const Bitmap* pass = filter != nullptr ? &allowed : nullptr;
      std::vector<Scored> res = codes ? HnswSq8Search::search_expanding(*graph_, *codes, q, ef, pass, enough)
                                      : graph_->search_expanding(q, ef, pass, enough);
      if (!graph_->pending().empty()) {
        std::vector<Slot> fresh;
        for (Slot s : graph_->pending()) {
          if (filter == nullptr || allowed.test(s)) fresh.push_back(s);
        }
        res = merge_topk(std::move(res), scan_slots(store_, config_.metric, q, fresh, fresh.size()),
                         res.size() + fresh.size());
      }
      collapse_sorted(res, *field, k, group_size, groups);
      if (groups.size() >= k) {
        convert(groups, out[qi]);
        return;
      }
      // The traversal ran out of reachable candidates before k groups: never return a short
      // page when more groups may exist; answer this query exactly instead.
    }
    const std::vector<Slot>& scan = strategy == Strategy::kGraph ? all_rows() : rows;
    std::vector<float> d(scan.size());
    score_slots(store_, config_.metric, q, scan.data(), scan.size(), d.data());
    collapse_exact(scan, d, *field, k, group_size, groups);
    convert(groups, out[qi]);
  });
  return out;
}

std::vector<std::pair<std::int64_t, float>> Index::search_text(const std::string& query, std::size_t k,
                                                               const FilterNode* filter,
                                                               const Bm25Stats* stats) const {
  if (k == 0) throw InvalidArgument("k must be positive, got 0");
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

Bm25Stats Index::text_stats(const std::string& query) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return text_.stats(query);
}

std::size_t Index::text_documents() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return text_.documents();
}

std::size_t Index::count(const FilterNode& filter) const {
  validate_filter(filter);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  // The very evaluation a filtered search runs, so that timing count() times a search's filter.
  return match_for_search(filter, meta_, store_).count;
}

std::vector<std::vector<std::pair<std::string, Value>>> Index::get_metadata(const std::int64_t* ids,
                                                                            std::size_t n) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<std::vector<std::pair<std::string, Value>>> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto s = store_.slot_of(ids[i]);
    if (!s) throw NotFound("id " + std::to_string(ids[i]) + " is not in the index");
    out.push_back(meta_.row(*s));
  }
  return out;
}

std::size_t Index::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return store_.size();
}

bool Index::contains(std::int64_t id) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return store_.slot_of(id).has_value();
}

void Index::get_vectors(const std::int64_t* ids, std::size_t n, float* out) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  for (std::size_t i = 0; i < n; ++i) {
    const auto s = store_.slot_of(ids[i]);
    if (!s) throw NotFound("id " + std::to_string(ids[i]) + " is not in the index");
    std::memcpy(out + i * config_.dim, store_.vector(*s), config_.dim * sizeof(float));
  }
}

std::vector<std::int64_t> Index::ids() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return store_.ids();
}

std::size_t Index::memory_bytes() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return store_.memory_bytes() + (graph_ ? graph_->memory_bytes() : 0) + meta_.memory_bytes() +
         text_.memory_bytes() + (codes_ ? codes_->memory_bytes() : 0);
}

void Index::save(const std::string& path) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  BinaryWriter w(path, kMagic, codes_ ? kFormatVersionQuantized : kFormatVersion);
  w.u64(config_.dim);
  w.u8(static_cast<std::uint8_t>(config_.metric));
  w.u8(static_cast<std::uint8_t>(config_.kind));
  w.u64(config_.ef_search);
  w.u64(config_.hnsw.M);
  w.u64(config_.hnsw.ef_construction);
  w.u64(config_.hnsw.seed);
  const std::size_t slots = store_.slot_count();
  w.u64(slots);
  w.array(store_.slot_ids().data(), slots);
  w.array(store_.live_flags().data(), slots);
  w.array(store_.data(), slots * config_.dim);
  if (graph_) graph_->save(w);
  meta_.save(w, store_);
  text_.save(w);
  if (codes_) {
    // Version 2 only: the quantization section (kind, re-rank depth, quantizer and codes).
    w.u8(static_cast<std::uint8_t>(config_.quantization));
    w.u64(config_.rerank);
    codes_->save(w);
  }
  w.commit();
  store_.release_resident_rows();
}

std::unique_ptr<Index> Index::load(const std::string& path, bool vectors_on_disk) {
  BinaryReader r(path, kMagic, kFormatVersionQuantized);
  IndexConfig c;
  c.dim = r.u64();
  const std::uint8_t metric = r.u8();
  const std::uint8_t kind = r.u8();
  c.ef_search = r.u64();
  c.hnsw.M = r.u64();
  c.hnsw.ef_construction = r.u64();
  c.hnsw.seed = r.u64();
  if (c.dim == 0 || c.dim > 65536) r.fail("invalid dimension " + std::to_string(c.dim));
  if (metric > 2) r.fail("invalid metric code " + std::to_string(metric));
  if (kind > 1) r.fail("invalid index kind code " + std::to_string(kind));
  if (c.ef_search == 0 || c.hnsw.M < 2 || c.hnsw.M > 256 || c.hnsw.ef_construction == 0 ||
      c.ef_search > (1u << 30) || c.hnsw.ef_construction > (1u << 30)) {
    r.fail("invalid index parameters");
  }
  c.metric = static_cast<Metric>(metric);
  c.kind = static_cast<IndexKind>(kind);
  const std::uint64_t slots = r.u64();
  // Bound the counts by the bytes present before allocating for them.
  r.require(slots, sizeof(std::int64_t) + 1 + c.dim * sizeof(float));
  std::vector<std::int64_t> ids;
  r.array(ids, slots);
  std::vector<std::uint8_t> live;
  r.array(live, slots);
  AlignedVector<float> data(slots * c.dim);
  r.array_into(data.data(), data.size());
  auto index = std::make_unique<Index>(c);
  if (vectors_on_disk) {
    // Known only once the trailing section is read: rows go to the file now, and the load
    // fails below unless the file is quantized.
    if (c.kind != IndexKind::kHnsw) throw InvalidArgument("vectors='disk' needs quantization='sq8'");
    index->store_.use_disk_rows();
    index->config_.vectors_on_disk = true;
  }
  try {
    index->store_.restore(std::move(ids), std::move(live), std::move(data));
  } catch (const FormatError& e) {
    r.fail(e.what());
  }
  if (index->graph_) {
    index->graph_->grow();
    index->graph_->load(r);
  }
  index->meta_.load(r, index->store_);
  index->text_.load(r, index->store_);
  if (r.version() >= kFormatVersionQuantized) {
    const std::uint8_t q = r.u8();
    const std::uint64_t rerank = r.u64();
    if (q != static_cast<std::uint8_t>(Quantization::kSq8)) r.fail("invalid quantization code " + std::to_string(q));
    if (!index->graph_) r.fail("quantization section in a flat index");
    if (rerank > (1u << 30)) r.fail("invalid re-rank depth " + std::to_string(rerank));
    index->config_.quantization = Quantization::kSq8;
    index->config_.rerank = rerank;
    index->codes_ = std::make_unique<Sq8Codes>(c.dim, c.metric);
    index->codes_->load(r);
    if (index->codes_->trained() ? index->codes_->slot_count() != slots : index->store_.size() >= kSq8TrainRows) {
      r.fail("sq8 section: code count does not match the rows");
    }
  }
  r.expect_end();
  if (vectors_on_disk && !index->codes_) {
    throw InvalidArgument("vectors='disk' needs a quantized index file (quantization='sq8')");
  }
  return index;
}

}  // namespace kbcore
