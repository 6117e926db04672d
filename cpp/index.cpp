#include "index.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "errors.h"
#include "hnsw_codes.h"
#include "parallel.h"
#include "vector_checks.h"

namespace kbcore {

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

void check_max_ef(const char* what, std::size_t value) {
  if (value > kMaxEf) {
    throw InvalidArgument(std::string(what) + " must be at most 2^30 = " + std::to_string(kMaxEf) + ", got " +
                          std::to_string(value));
  }
}

Index::Index(const IndexConfig& config) : config_(config), store_(config.dim) {
  if (config.dim == 0 || config.dim > kMaxDim) {
    throw InvalidArgument("dimension must be in [1, " + std::to_string(kMaxDim) + "], got " +
                          std::to_string(config.dim));
  }
  if (config.ef_search == 0 || config.ef_search > kMaxEf) {
    throw InvalidArgument("ef must be in [1, 2^30 = " + std::to_string(kMaxEf) + "], got " +
                          std::to_string(config.ef_search));
  }
  if (config.kind == IndexKind::kHnsw) graph_ = std::make_unique<HnswIndex>(store_, config.metric, config.hnsw);
  if (config.quantization != "none") {
    if (!is_code_type(config.quantization)) {
      throw InvalidArgument("unknown quantization '" + config.quantization + "'; expected None or one of " +
                            code_type_names());
    }
    if (config.kind != IndexKind::kHnsw) {
      throw InvalidArgument("quantization applies to kind 'hnsw' only (a flat index scans float32 rows exactly)");
    }
    config_.code_params = resolve_code_params(config.quantization, config.code_params);
    codes_ = std::make_unique<CodeStore>(
        make_code_store(config.quantization, config.dim, config.metric, config.hnsw.seed, config_.code_params));
  } else if (!config.code_params.empty()) {
    throw InvalidArgument(config.code_params.front().first + " applies to a quantized index only");
  }
  check_max_ef("rerank", config.rerank);
  if (config.vectors_on_disk) {
    if (!quantized()) {
      throw InvalidArgument(
          "vectors='disk' needs quantization='sq8' or 'rabitq' (a float32 graph reads every row it visits)");
    }
    store_.use_disk_rows();
  }
}

Index::~Index() = default;

void Index::set_ef_search(std::size_t ef) {
  if (ef == 0 || ef > kMaxEf) {
    throw InvalidArgument("ef must be in [1, 2^30 = " + std::to_string(kMaxEf) + "], got " + std::to_string(ef));
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  config_.ef_search = ef;
}

void Index::set_rerank(std::size_t rerank) {
  if (rerank > kMaxEf) {
    throw InvalidArgument("rerank must be in [0, 2^30 = " + std::to_string(kMaxEf) + "], got " +
                          std::to_string(rerank));
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!codes_) throw InvalidArgument("rerank applies to a quantized index (quantization='sq8' or 'rabitq')");
  config_.rerank = rerank;
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
  parallel_for(
      n, threads,
      [&](std::size_t i, std::size_t) {
        const float* row = vectors + i * dim;
        if (!all_finite(row, dim)) {
          bad[i] = 1;
        } else if (cosine) {
          const std::optional<float> inv = inverse_norm(row, dim);
          if (inv)
            inv_norm[i] = *inv;
          else
            bad[i] = 2;
        }
      },
      256);
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
  ++writes_;
  text_.ensure_built();  // a loaded BM25 section that fails its deferred checks changes nothing
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
  if (quantized()) update_codes_locked(slots, threads);
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
  std::visit(
      [&](auto& codes) {
        codes.train(sample.data(), n, n);
        codes.resize(store_.slot_count());
        parallel_for(
            live.size(), threads, [&](std::size_t i, std::size_t) { codes.encode(live[i], store_.vector(live[i])); },
            256);
      },
      *codes_);
}

void Index::update_codes_locked(const std::vector<Slot>& slots, std::size_t threads) {
  if (!codes_trained()) {
    if (store_.size() >= train_rows()) train_codes_locked(threads);
    return;
  }
  std::visit(
      [&](auto& codes) {
        codes.resize(store_.slot_count());
        parallel_for(
            slots.size(), threads, [&](std::size_t i, std::size_t) { codes.encode(slots[i], store_.vector(slots[i])); },
            256);
      },
      *codes_);
}

bool Index::quantizer_trained() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return codes_trained();
}

void Index::retrain_quantizer(std::size_t threads) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  ++writes_;
  if (!quantized()) throw InvalidArgument("this index has no quantization to retrain");
  train_codes_locked(threads);
  store_.release_resident_rows();
}

std::size_t Index::build_graph(std::size_t max_rows, std::size_t threads) {
  if (!graph_) return 0;
  std::unique_lock<std::shared_mutex> lock(mutex_);
  ++writes_;
  const std::size_t left = graph_->build_pending(max_rows, threads);
  store_.release_resident_rows();
  return left;
}

std::size_t Index::pending_rows() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return graph_ ? graph_->pending().size() : 0;
}
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
  ++writes_;
  text_.ensure_built();  // as in add()
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

Bm25Stats Index::text_stats(const std::string& query) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return text_.stats(query);
}

std::size_t Index::text_documents() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return text_.documents();
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
  return store_.memory_bytes() + (graph_ ? graph_->memory_bytes() : 0) + meta_.memory_bytes() + text_.memory_bytes() +
         (codes_ ? std::visit([](const auto& c) { return c.memory_bytes(); }, *codes_) : 0);
}

}  // namespace kbcore
