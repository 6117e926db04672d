#include "bm25_index.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "binary_io.h"
#include "errors.h"
#include "parallel.h"
#include "search_scratch.h"
#include "tokenizer.h"

namespace kbcore {
namespace {

// A little-endian u32 (one load on little-endian hosts).
inline std::uint32_t le32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

}  // namespace

Bm25Index::Bm25Index(Bm25Params params) : params_(params) {
  if (!(params.k1 >= 0) || !(params.b >= 0 && params.b <= 1)) {
    throw InvalidArgument("BM25 needs k1 >= 0 and 0 <= b <= 1");
  }
}

void Bm25Index::grow(std::size_t n) {
  ensure_built();
  resize_slots(n);
}

void Bm25Index::resize_slots(std::size_t n) {
  if (doc_len_.size() >= n) return;
  doc_terms_.resize(n);
  doc_len_.resize(n, 0);
  gen_.resize(n, 0);
  has_.resize(n, 0);
}

std::uint32_t Bm25Index::term_id(std::string_view t) {
  const auto [id, added] = terms_.intern(t);
  if (added) {
    df_.push_back(0);
    postings_.emplace_back();
  }
  return id;
}

void Bm25Index::clear(Slot s) {
  ensure_built();
  if (s >= has_.size() || !has_[s]) return;
  for (const auto& [term, tf] : doc_terms_[s]) --df_[term];
  stale_postings_ += doc_terms_[s].size();
  live_postings_ -= doc_terms_[s].size();
  total_len_ -= doc_len_[s];
  --n_docs_;
  doc_terms_[s].clear();
  doc_terms_[s].shrink_to_fit();
  doc_len_[s] = 0;
  has_[s] = 0;
  ++version_;
  // Stale postings are told apart by generation; compact before a generation could wrap.
  if (++gen_[s] == 0xFFFFFFFFu || (stale_postings_ > 1024 && stale_postings_ > live_postings_)) compact();
}

namespace {

// One worker's share of Bm25Batch construction: its rows' (local term, tf) pairs against a
// worker-local vocabulary.
struct BatchWorker {
  StringTable vocab;
  TokenBuffer tokens;
  std::vector<std::uint32_t> local;                            // local term id per token
  std::vector<std::uint32_t> seen;                             // per local term: last row + 1
  std::vector<std::uint32_t> count;                            // per local term: tf in that row
  std::vector<std::pair<std::uint32_t, std::uint32_t>> pairs;  // (local term, tf), row after row
};

}  // namespace

Bm25Batch::Bm25Batch(const std::vector<std::optional<std::string>>& texts, std::size_t threads) {
  const std::size_t n = texts.size();
  if (n >= kNoSlot) throw InvalidArgument("too many rows in one text batch");
  has_text_.assign(n, 0);
  row_len_.assign(n, 0);
  row_terms_.assign(n, 0);
  if (n == 0) {
    term_begin_.assign(1, 0);
    return;
  }
  // 1. In parallel: tokenize each row and count its distinct terms against the worker's own
  //    vocabulary (no shared state, no per-token allocation).
  const std::size_t workers = resolve_threads(threads, n);
  std::vector<BatchWorker> work(workers);
  std::vector<std::uint32_t> row_worker(n, 0);
  std::vector<std::uint64_t> row_first(n, 0);  // index of the row's first pair in its worker's list
  parallel_for(
      n, workers,
      [&](std::size_t i, std::size_t w) {
        if (!texts[i]) return;
        BatchWorker& bw = work[w];
        tokenize_into(*texts[i], /*for_query=*/false, bw.tokens);
        const std::size_t len = bw.tokens.size();
        bw.local.resize(len);
        for (std::size_t j = 0; j < len; ++j) bw.local[j] = bw.vocab.intern(bw.tokens[j]).first;
        if (bw.seen.size() < bw.vocab.size()) {
          bw.seen.resize(bw.vocab.size() * 2, 0);
          bw.count.resize(bw.vocab.size() * 2, 0);
        }
        const auto stamp = static_cast<std::uint32_t>(i + 1);
        const std::size_t first = bw.pairs.size();
        for (std::size_t j = 0; j < len; ++j) {
          const std::uint32_t t = bw.local[j];
          if (bw.seen[t] != stamp) {
            bw.seen[t] = stamp;
            bw.count[t] = 0;
            bw.pairs.emplace_back(t, 0);
          }
          ++bw.count[t];
        }
        for (std::size_t p = first; p < bw.pairs.size(); ++p) bw.pairs[p].second = bw.count[bw.pairs[p].first];
        has_text_[i] = 1;
        row_len_[i] = len;
        row_terms_[i] = static_cast<std::uint32_t>(bw.pairs.size() - first);
        row_worker[i] = static_cast<std::uint32_t>(w);
        row_first[i] = first;
      },
      64);

  // 2. Row by row: map the workers' local terms to batch terms, numbering new terms in order
  //    of first appearance (within a row, by term bytes), and count each term's rows.
  constexpr std::uint32_t kUnmapped = 0xFFFFFFFFu;
  std::vector<std::vector<std::uint32_t>> remap(workers);
  std::size_t largest = 0;
  for (std::size_t w = 0; w < workers; ++w) {
    remap[w].assign(work[w].vocab.size(), kUnmapped);
    largest = std::max(largest, work[w].vocab.size());
  }
  terms_.reserve(largest);
  std::vector<std::uint32_t> df;
  std::vector<std::uint32_t> fresh;
  std::size_t postings = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!has_text_[i]) continue;
    BatchWorker& bw = work[row_worker[i]];
    std::vector<std::uint32_t>& map = remap[row_worker[i]];
    auto* pairs = bw.pairs.data() + row_first[i];
    const std::size_t m = row_terms_[i];
    fresh.clear();
    for (std::size_t p = 0; p < m; ++p) {
      if (map[pairs[p].first] == kUnmapped) fresh.push_back(pairs[p].first);
    }
    if (!fresh.empty()) {
      std::sort(fresh.begin(), fresh.end(),
                [&](std::uint32_t a, std::uint32_t b) { return bw.vocab.str(a) < bw.vocab.str(b); });
      for (const std::uint32_t t : fresh) {
        map[t] = terms_.intern(bw.vocab.str(t)).first;
        if (df.size() < terms_.size()) df.push_back(0);
      }
    }
    for (std::size_t p = 0; p < m; ++p) {
      pairs[p].first = map[pairs[p].first];  // now a batch term
      ++df[pairs[p].first];
    }
    postings += m;
  }

  // 3. Transpose into per-term postings, rows ascending within each term.
  term_begin_.assign(terms_.size() + 1, 0);
  for (std::size_t t = 0; t < terms_.size(); ++t) term_begin_[t + 1] = term_begin_[t] + df[t];
  post_row_.resize(postings);
  post_tf_.resize(postings);
  std::vector<std::uint64_t> fill(term_begin_.begin(), term_begin_.end() - 1);
  for (std::size_t i = 0; i < n; ++i) {
    if (!has_text_[i]) continue;
    const auto* pairs = work[row_worker[i]].pairs.data() + row_first[i];
    for (std::size_t p = 0; p < row_terms_[i]; ++p) {
      const std::uint64_t at = fill[pairs[p].first]++;
      post_row_[at] = static_cast<std::uint32_t>(i);
      post_tf_[at] = pairs[p].second;
    }
  }
}

void Bm25Index::set_batch(const Bm25Batch& batch, const std::vector<Slot>& slots, std::size_t threads) {
  const std::size_t n = batch.rows();
  if (slots.size() != n) {
    throw InvalidArgument("got " + std::to_string(slots.size()) + " slots for a text batch of " + std::to_string(n) +
                          " rows");
  }
  ensure_built();
  if (n == 0) return;
  grow(static_cast<std::size_t>(*std::max_element(slots.begin(), slots.end())) + 1);
  // Drop the rows' old text first: clear() may compact, which renumbers terms.
  for (std::size_t i = 0; i < n; ++i) {
    if (batch.has_text_[i]) clear(slots[i]);
  }
  const std::size_t nterms = batch.terms();
  // Terms new to the index get ids in the batch's order, as row-by-row insertion would.
  std::vector<std::uint32_t> id(nterms);
  for (std::size_t t = 0; t < nterms; ++t) id[t] = term_id(batch.terms_.str(static_cast<std::uint32_t>(t)));
  for (std::size_t i = 0; i < n; ++i) {
    if (!batch.has_text_[i]) continue;
    doc_len_[slots[i]] = static_cast<std::uint32_t>(batch.row_len_[i]);
    total_len_ += batch.row_len_[i];
    has_[slots[i]] = 1;
    ++n_docs_;
    live_postings_ += batch.row_terms_[i];
  }
  // Visiting terms by ascending index id appends to each row's term list in sorted order.
  std::vector<std::uint32_t> order(nterms);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return id[a] < id[b]; });
  // Two independent tasks (the caller holds the index's write lock): the per-term postings
  // and df, and the per-row term lists. They write disjoint state.
  parallel_for(2, threads, [&](std::size_t task, std::size_t) {
    if (task == 0) {
      for (const std::uint32_t t : order) {
        const std::uint32_t term = id[t];
        const std::uint64_t begin = batch.term_begin_[t], end = batch.term_begin_[t + 1];
        df_[term] += static_cast<std::uint32_t>(end - begin);
        std::vector<Posting>& plist = postings_[term];
        const std::size_t need = plist.size() + (end - begin);
        if (plist.capacity() < need) plist.reserve(std::max(need, plist.capacity() * 2));
        for (std::uint64_t p = begin; p < end; ++p) {
          const Slot s = slots[batch.post_row_[p]];
          plist.push_back({s, batch.post_tf_[p], gen_[s]});
        }
      }
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!batch.has_text_[i]) continue;
      doc_terms_[slots[i]].clear();
      doc_terms_[slots[i]].reserve(batch.row_terms_[i]);
    }
    for (const std::uint32_t t : order) {
      const std::uint32_t term = id[t];
      for (std::uint64_t p = batch.term_begin_[t]; p < batch.term_begin_[t + 1]; ++p) {
        doc_terms_[slots[batch.post_row_[p]]].emplace_back(term, batch.post_tf_[p]);
      }
    }
  });
  ++version_;
}

void Bm25Index::compact() {
  // Drop terms no row uses any more and renumber the rest, so the vocabulary shrinks too.
  std::vector<std::uint32_t> remap(terms_.size(), 0xFFFFFFFFu);
  StringTable terms;
  std::vector<std::uint32_t> df;
  for (std::size_t t = 0; t < terms_.size(); ++t) {
    if (df_[t] == 0) continue;
    remap[t] = terms.intern(terms_.str(static_cast<std::uint32_t>(t))).first;
    df.push_back(df_[t]);
  }
  terms_ = std::move(terms);
  df_ = std::move(df);
  postings_.assign(terms_.size(), {});
  for (std::size_t s = 0; s < doc_terms_.size(); ++s) {
    gen_[s] = 0;
    if (!has_[s]) continue;
    for (auto& [term, count] : doc_terms_[s]) {
      term = remap[term];
      postings_[term].push_back({static_cast<Slot>(s), count, 0});
    }
  }
  stale_postings_ = 0;
}

namespace {

// The distinct query tokens of `query`, ascending by bytes.
std::vector<std::string> query_terms(std::string_view query) {
  TokenBuffer tokens;
  tokenize_into(query, /*for_query=*/true, tokens);
  std::vector<std::string> out;
  out.reserve(tokens.size());
  for (std::size_t j = 0; j < tokens.size(); ++j) out.emplace_back(tokens[j]);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

Bm25Stats Bm25Index::stats(std::string_view query) const {
  ensure_built();
  Bm25Stats out;
  out.documents = n_docs_;
  out.total_length = total_len_;
  out.terms = query_terms(query);
  out.df.reserve(out.terms.size());
  for (const std::string& t : out.terms) {
    const auto id = terms_.find(t);
    out.df.push_back(id ? df_[*id] : 0);
  }
  return out;
}

std::vector<Scored> Bm25Index::search(std::string_view query, std::size_t k, const Bitmap* allowed,
                                      const Bm25Stats* global) const {
  ensure_built();
  if (global != nullptr) {
    if (global->df.size() != global->terms.size()) {
      throw InvalidArgument("BM25 statistics have " + std::to_string(global->terms.size()) + " terms but " +
                            std::to_string(global->df.size()) + " document frequencies");
    }
    if (global->documents < n_docs_ || global->total_length < total_len_) {
      throw InvalidArgument("BM25 statistics count fewer rows or tokens than this index holds");
    }
  }
  TopK top(std::min(k, n_docs_));
  if (n_docs_ == 0 || k == 0) return top.take_sorted();
  // (term id, the df its idf uses), one per distinct query term this index holds.
  std::vector<std::pair<std::uint32_t, double>> ids;
  for (const std::string& t : query_terms(query)) {
    const auto id = terms_.find(t);
    if (!id || df_[*id] == 0) continue;
    double df = df_[*id];
    if (global != nullptr) {
      const auto at = std::lower_bound(global->terms.begin(), global->terms.end(), t);
      const std::size_t i = static_cast<std::size_t>(at - global->terms.begin());
      if (at == global->terms.end() || *at != t || global->df[i] < df_[*id]) {
        throw InvalidArgument("BM25 statistics lack (or undercount) the query term '" + t + "'");
      }
      df = static_cast<double>(global->df[i]);
    }
    ids.emplace_back(*id, df);
  }
  // Ascending term id: the order in which scores are summed.
  std::sort(ids.begin(), ids.end());
  const double n = static_cast<double>(global != nullptr ? global->documents : n_docs_);
  const std::uint64_t total = global != nullptr ? global->total_length : total_len_;
  const float avgdl = static_cast<float>(static_cast<double>(total) / n);
  const float k1 = params_.k1, b = params_.b;
  if (global == nullptr) {
    // Term weights depend on avgdl, so they are cached per corpus state.
    std::lock_guard<std::mutex> lock(norm_mutex_);
    if (norm_version_ != version_ || weights_.size() != postings_.size()) {
      std::vector<float> norm(doc_len_.size());
      for (std::size_t s = 0; s < doc_len_.size(); ++s) {
        norm[s] = k1 * (1.0f - b + b * static_cast<float>(doc_len_[s]) / avgdl);
      }
      weights_.resize(postings_.size());
      for (std::size_t t = 0; t < postings_.size(); ++t) {
        auto& w = weights_[t];
        w.resize(postings_[t].size());
        for (std::size_t i = 0; i < w.size(); ++i) {
          const auto tf = static_cast<float>(postings_[t][i].tf);
          w[i] = tf * (k1 + 1.0f) / (tf + norm[postings_[t][i].slot]);
        }
      }
      norm_version_ = version_;
    }
  }
  SearchScratch& scratch = search_scratch();
  std::vector<float>& acc = scratch.bm25_acc;
  std::vector<Slot>& touched = scratch.bm25_touched;
  if (acc.size() < doc_len_.size()) acc.resize(doc_len_.size(), 0.0f);
  touched.clear();
  for (const auto& [term, df] : ids) {
    const auto idf = static_cast<float>(std::log(1.0 + (n - df + 0.5) / (df + 0.5)));
    const std::vector<Posting>& plist = postings_[term];
    const std::uint32_t* gen = gen_.data();
    // With global statistics the cached weights (local avgdl) do not apply: the same
    // expression is evaluated per posting with the global avgdl, so the values are identical
    // to those of one index holding every row.
    const float* w = global == nullptr ? weights_[term].data() : nullptr;
    for (std::size_t i = 0; i < plist.size(); ++i) {
      const Posting& p = plist[i];
      // A cleared or rewritten row has a newer generation than its old postings.
      if (p.gen != gen[p.slot]) continue;
      if (allowed != nullptr && !allowed->test(p.slot)) continue;
      float weight;
      if (w != nullptr) {
        weight = w[i];
      } else {
        const auto tf = static_cast<float>(p.tf);
        const float norm = k1 * (1.0f - b + b * static_cast<float>(doc_len_[p.slot]) / avgdl);
        weight = tf * (k1 + 1.0f) / (tf + norm);
      }
      if (acc[p.slot] == 0.0f) touched.push_back(p.slot);
      acc[p.slot] += idf * weight;
    }
  }
  for (Slot s : touched) {
    top.push(-acc[s], s);
    acc[s] = 0.0f;
  }
  return top.take_sorted();
}

std::size_t Bm25Index::memory_bytes() const {
  // A deferred build may be filling the arrays on another searching thread: wait for it.
  std::unique_lock<std::mutex> lock(build_mutex_, std::defer_lock);
  if (!built_.load(std::memory_order_acquire)) lock.lock();
  std::size_t b = terms_.memory_bytes();
  for (const auto& p : postings_) b += p.capacity() * sizeof(Posting) + sizeof(p);
  for (const auto& d : doc_terms_) b += d.capacity() * 8 + sizeof(d);
  return b + doc_len_.capacity() * 4 + gen_.capacity() * 4 + has_.capacity() + df_.capacity() * 4 + [&] {
    std::size_t w = 0;
    for (const auto& v : weights_) w += v.capacity() * 4;
    return w;
  }();
}

// Persisted as the term strings in use, then per slot with text: slot, length, (term, tf) pairs.
// Postings, df and lengths are rebuilt on load.
void Bm25Index::save(BinaryWriter& w) const {
  ensure_built();
  w.f32(params_.k1);
  w.f32(params_.b);
  std::vector<std::uint32_t> remap(terms_.size(), 0xFFFFFFFFu);
  std::uint64_t used = 0;
  for (std::size_t t = 0; t < terms_.size(); ++t) {
    if (df_[t] > 0) remap[t] = static_cast<std::uint32_t>(used++);
  }
  w.u64(used);
  for (std::size_t t = 0; t < terms_.size(); ++t) {
    if (df_[t] == 0) continue;
    const std::string_view term = terms_.str(static_cast<std::uint32_t>(t));
    w.u64(term.size());
    w.array(reinterpret_cast<const std::uint8_t*>(term.data()), term.size());
  }
  w.u64(n_docs_);
  std::vector<std::uint32_t> pairs;  // one row's (term, tf) list, written in one call
  for (std::size_t s = 0; s < doc_terms_.size(); ++s) {
    if (!has_[s]) continue;
    w.u32(static_cast<std::uint32_t>(s));
    w.u32(doc_len_[s]);
    w.u64(doc_terms_[s].size());
    // Renumbering keeps the order of term ids, so each list stays sorted.
    pairs.clear();
    for (const auto& [term, tf] : doc_terms_[s]) {
      pairs.push_back(remap[term]);
      pairs.push_back(tf);
    }
    w.array(pairs.data(), pairs.size());
  }
}

void Bm25Index::load(BinaryReader& r, const VectorStore& store) {
  std::vector<std::uint32_t> df;
  parse(r, &store, store.slot_count(), true, df);
}

void Bm25Index::load_deferred(BinaryReader& r, const VectorStore& store) {
  if (!r.bytes()->mapped()) {
    load(r, store);
    return;
  }
  const std::size_t begin = r.position();
  std::vector<std::uint32_t> df;
  parse(r, &store, store.slot_count(), false, df);
  BinaryReader section = r.section(begin, r.position());
  // The section's own checksum, so that the build uses exactly the bytes checked here.
  const std::uint64_t sum = checksum64(section.here(), section.remaining());
  deferred_ = std::make_unique<Deferred>(Deferred{std::move(section), store.slot_count(), sum, std::move(df)});
  built_.store(false, std::memory_order_release);
}

void Bm25Index::ensure_built() const {
  if (built_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(build_mutex_);
  if (built_.load(std::memory_order_relaxed)) return;
  // The only writes a const call makes to this index, serialised by build_mutex_ and published
  // by built_; writers hold the owning Index's exclusive lock and so never race with them.
  auto* self = const_cast<Bm25Index*>(this);
  BinaryReader r = deferred_->reader;
  // The bytes are a mapping of a file that kbcore replaces only by rename, but another program
  // could have rewritten it in place since the load: the build reads only the bytes checked then.
  if (checksum64(r.here(), r.remaining()) != deferred_->sum) {
    r.fail("BM25 section changed since the file was loaded (checksum mismatch)");
  }
  try {
    self->parse(r, nullptr, deferred_->slots, true, deferred_->df);
    r.expect_end();
  } catch (...) {
    self->terms_.clear();
    self->df_.clear();
    self->postings_.clear();
    self->doc_terms_.clear();
    self->doc_len_.clear();
    self->gen_.clear();
    self->has_.clear();
    self->total_len_ = 0;
    self->live_postings_ = 0;
    throw;
  }
  deferred_.reset();
  built_.store(true, std::memory_order_release);
}

void Bm25Index::parse(BinaryReader& r, const VectorStore* store, std::size_t slots, bool build,
                      std::vector<std::uint32_t>& df) {
  Bm25Params params;
  params.k1 = r.f32();
  params.b = r.f32();
  if (!(params.k1 >= 0) || !std::isfinite(params.k1) || !(params.b >= 0 && params.b <= 1)) {
    r.fail("invalid BM25 parameters");
  }
  if (store != nullptr) params_ = params;  // a deferred build leaves them: params() may be reading
  const std::uint64_t nterms = r.u64();
  r.require(nterms, 8);
  // Without `build`, the terms are checked as views of the file's bytes (no copy).
  std::unordered_set<std::string_view> seen;
  if (!build) seen.reserve(nterms);
  for (std::uint64_t i = 0; i < nterms; ++i) {
    const std::uint64_t len = r.u64();
    r.require(len, 1);
    const std::string_view t(reinterpret_cast<const char*>(r.here()), len);
    r.skip(len, 1);
    // Terms come back to Python as str (text_stats): invalid UTF-8 is refused here. add()
    // cannot store one: the tokenizer emits only well-formed code points (tokenizer.h).
    if (!is_valid_utf8(t)) r.fail("BM25 term is not valid UTF-8");
    if (build) {
      if (terms_.find(t)) r.fail("repeated BM25 term");
      term_id(t);
    } else if (!seen.insert(t).second) {
      r.fail("repeated BM25 term");
    }
  }
  if (build) {
    resize_slots(slots);
    // Each term's posting list at its final size at once (df counted by the check).
    if (df.size() == nterms) {
      for (std::size_t t = 0; t < nterms; ++t) postings_[t].reserve(df[t]);
    }
  } else {
    df.assign(nterms, 0);
  }
  const std::uint64_t docs = r.u64();
  r.require(docs, 16);
  std::int64_t last = -1;  // save() writes rows by ascending slot, each once
  for (std::uint64_t d = 0; d < docs; ++d) {
    const Slot s = r.u32();
    const std::uint32_t len = r.u32();
    const std::uint64_t nt = r.u64();
    if (s >= slots || (store != nullptr && !store->is_live(s)) || static_cast<std::int64_t>(s) <= last) {
      r.fail("BM25 row for a missing, repeated or out-of-order slot");
    }
    last = s;
    r.require(nt, 8);
    const unsigned char* pairs = r.here();  // nt (term, tf) pairs of u32, bounds checked above
    r.skip(nt, 8);
    std::uint64_t sum = 0;
    std::int64_t prev = -1;
    auto* terms = build ? &doc_terms_[s] : nullptr;
    if (terms != nullptr) terms->reserve(nt);
    for (std::uint64_t j = 0; j < nt; ++j) {
      const std::uint32_t term = le32(pairs + 8 * j);
      const std::uint32_t tf = le32(pairs + 8 * j + 4);
      if (term >= nterms || tf == 0 || static_cast<std::int64_t>(term) <= prev) r.fail("invalid BM25 term list");
      prev = term;
      sum += tf;
      if (terms != nullptr) {
        terms->emplace_back(term, tf);
      } else {
        ++df[term];
      }
    }
    if (sum != len) r.fail("BM25 document length disagrees with its terms");
    if (!build) continue;
    for (const auto& [term, tf] : *terms) {
      ++df_[term];
      postings_[term].push_back({s, tf, gen_[s]});
    }
    live_postings_ += terms->size();
    doc_len_[s] = len;
    total_len_ += len;
    has_[s] = 1;
  }
  // save() writes only the terms some row uses.
  for (std::size_t t = 0; t < nterms; ++t) {
    if ((build ? df_[t] : df[t]) == 0) r.fail("BM25 term used by no row");
  }
  // A deferred build leaves the count the check set: documents() may be reading it meanwhile.
  if (store != nullptr) n_docs_ = static_cast<std::size_t>(docs);
}

}  // namespace kbcore
