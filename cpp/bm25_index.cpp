#include "bm25_index.h"

#include <algorithm>
#include <cmath>

#include "binary_io.h"
#include "errors.h"
#include "tokenizer.h"

namespace kbcore {

Bm25Index::Bm25Index(Bm25Params params) : params_(params) {
  if (!(params.k1 >= 0) || !(params.b >= 0 && params.b <= 1)) {
    throw InvalidArgument("BM25 needs k1 >= 0 and 0 <= b <= 1");
  }
}

void Bm25Index::grow(std::size_t n) {
  if (doc_len_.size() >= n) return;
  doc_terms_.resize(n);
  doc_len_.resize(n, 0);
  gen_.resize(n, 0);
  has_.resize(n, 0);
}

std::uint32_t Bm25Index::term_id(const std::string& t) {
  const auto it = term_ids_.find(t);
  if (it != term_ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(terms_.size());
  terms_.push_back(t);
  df_.push_back(0);
  postings_.emplace_back();
  term_ids_.emplace(t, id);
  return id;
}

void Bm25Index::clear(Slot s) {
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

void Bm25Index::set(Slot s, std::string_view text) { set_tokens(s, tokenize(text)); }

std::vector<std::pair<std::string, std::uint32_t>> Bm25Index::count_tokens(std::vector<std::string> tokens) {
  std::sort(tokens.begin(), tokens.end());
  std::vector<std::pair<std::string, std::uint32_t>> out;
  for (std::size_t i = 0; i < tokens.size();) {
    std::size_t j = i;
    while (j < tokens.size() && tokens[j] == tokens[i]) ++j;
    out.emplace_back(std::move(tokens[i]), static_cast<std::uint32_t>(j - i));
    i = j;
  }
  return out;
}

void Bm25Index::set_tokens(Slot s, const std::vector<std::string>& tokens) {
  set_counted(s, count_tokens(tokens), tokens.size());
}

void Bm25Index::set_counted(Slot s, const std::vector<std::pair<std::string, std::uint32_t>>& counts,
                            std::size_t length) {
  grow(static_cast<std::size_t>(s) + 1);
  clear(s);
  auto& terms = doc_terms_[s];
  terms.clear();
  terms.reserve(counts.size());
  for (const auto& [token, count] : counts) terms.emplace_back(term_id(token), count);
  std::sort(terms.begin(), terms.end());
  for (const auto& [term, count] : terms) {
    ++df_[term];
    postings_[term].push_back({s, count, gen_[s]});
  }
  live_postings_ += terms.size();
  ++version_;
  doc_len_[s] = static_cast<std::uint32_t>(length);
  total_len_ += length;
  has_[s] = 1;
  ++n_docs_;
}

void Bm25Index::compact() {
  // Drop terms no row uses any more and renumber the rest, so the vocabulary shrinks too.
  std::vector<std::uint32_t> remap(terms_.size(), 0xFFFFFFFFu);
  std::vector<std::string> terms;
  std::vector<std::uint32_t> df;
  for (std::size_t t = 0; t < terms_.size(); ++t) {
    if (df_[t] == 0) continue;
    remap[t] = static_cast<std::uint32_t>(terms.size());
    terms.push_back(std::move(terms_[t]));
    df.push_back(df_[t]);
  }
  term_ids_.clear();
  for (std::size_t t = 0; t < terms.size(); ++t) term_ids_.emplace(terms[t], static_cast<std::uint32_t>(t));
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

std::vector<Scored> Bm25Index::search(std::string_view query, std::size_t k, const Bitmap* allowed) const {
  TopK top(std::min(k, n_docs_));
  if (n_docs_ == 0 || k == 0) return top.take_sorted();
  std::vector<std::uint32_t> ids;
  for (const auto& t : tokenize(query, /*for_query=*/true)) {
    const auto it = term_ids_.find(t);
    if (it != term_ids_.end() && df_[it->second] > 0) ids.push_back(it->second);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const double n = static_cast<double>(n_docs_);
  const float avgdl = static_cast<float>(static_cast<double>(total_len_) / n);
  const float k1 = params_.k1, b = params_.b;
  {
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
  thread_local std::vector<float> acc;
  thread_local std::vector<Slot> touched;
  if (acc.size() < doc_len_.size()) acc.resize(doc_len_.size(), 0.0f);
  touched.clear();
  for (std::uint32_t term : ids) {
    const double df = df_[term];
    const auto idf = static_cast<float>(std::log(1.0 + (n - df + 0.5) / (df + 0.5)));
    const std::vector<Posting>& plist = postings_[term];
    const float* w = weights_[term].data();
    const std::uint32_t* gen = gen_.data();
    for (std::size_t i = 0; i < plist.size(); ++i) {
      const Posting& p = plist[i];
      // A cleared or rewritten row has a newer generation than its old postings.
      if (p.gen != gen[p.slot]) continue;
      if (allowed != nullptr && !allowed->test(p.slot)) continue;
      if (acc[p.slot] == 0.0f) touched.push_back(p.slot);
      acc[p.slot] += idf * w[i];
    }
  }
  for (Slot s : touched) {
    top.push(-acc[s], s);
    acc[s] = 0.0f;
  }
  return top.take_sorted();
}

std::size_t Bm25Index::memory_bytes() const {
  std::size_t b = 0;
  for (const auto& t : terms_) b += 2 * (t.capacity() + sizeof(std::string)) + 4 * sizeof(void*);
  for (const auto& p : postings_) b += p.capacity() * sizeof(Posting) + sizeof(p);
  for (const auto& d : doc_terms_) b += d.capacity() * 8 + sizeof(d);
  return b + doc_len_.capacity() * 4 + gen_.capacity() * 4 + has_.capacity() + df_.capacity() * 4 +
         [&] {
           std::size_t w = 0;
           for (const auto& v : weights_) w += v.capacity() * 4;
           return w;
         }();
}

// Persisted as the term strings in use, then per slot with text: slot, length, (term, tf) pairs.
// Postings, df and lengths are rebuilt on load.
void Bm25Index::save(BinaryWriter& w) const {
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
    w.u64(terms_[t].size());
    w.array(reinterpret_cast<const std::uint8_t*>(terms_[t].data()), terms_[t].size());
  }
  w.u64(n_docs_);
  for (std::size_t s = 0; s < doc_terms_.size(); ++s) {
    if (!has_[s]) continue;
    w.u32(static_cast<std::uint32_t>(s));
    w.u32(doc_len_[s]);
    w.u64(doc_terms_[s].size());
    // Renumbering keeps the order of term ids, so each list stays sorted.
    for (const auto& [term, tf] : doc_terms_[s]) {
      w.u32(remap[term]);
      w.u32(tf);
    }
  }
}

void Bm25Index::load(BinaryReader& r, const VectorStore& store) {
  params_.k1 = r.f32();
  params_.b = r.f32();
  if (!(params_.k1 >= 0) || !(params_.b >= 0 && params_.b <= 1)) r.fail("invalid BM25 parameters");
  const std::uint64_t nterms = r.u64();
  r.require(nterms, 8);
  for (std::uint64_t i = 0; i < nterms; ++i) {
    const std::uint64_t len = r.u64();
    std::vector<std::uint8_t> bytes;
    r.array(bytes, len);
    const std::string t(bytes.begin(), bytes.end());
    if (term_ids_.count(t)) r.fail("repeated BM25 term");
    term_id(t);
  }
  grow(store.slot_count());
  const std::uint64_t docs = r.u64();
  r.require(docs, 16);
  for (std::uint64_t d = 0; d < docs; ++d) {
    const Slot s = r.u32();
    const std::uint32_t len = r.u32();
    const std::uint64_t nt = r.u64();
    if (s >= store.slot_count() || !store.is_live(s) || has_[s]) r.fail("BM25 row for a missing or repeated slot");
    r.require(nt, 8);
    auto& terms = doc_terms_[s];
    std::uint64_t sum = 0;
    for (std::uint64_t j = 0; j < nt; ++j) {
      const std::uint32_t term = r.u32();
      const std::uint32_t tf = r.u32();
      if (term >= terms_.size() || tf == 0 || (!terms.empty() && terms.back().first >= term)) {
        r.fail("invalid BM25 term list");
      }
      terms.emplace_back(term, tf);
      sum += tf;
    }
    if (sum != len) r.fail("BM25 document length disagrees with its terms");
    for (const auto& [term, tf] : terms) {
      ++df_[term];
      postings_[term].push_back({s, tf, gen_[s]});
    }
    live_postings_ += terms.size();
    doc_len_[s] = len;
    total_len_ += len;
    has_[s] = 1;
    ++n_docs_;
  }
}

}  // namespace kbcore
