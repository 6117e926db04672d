#include "bm25_index.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  if (global != nullptr) {
    search_exhaustive(ids, n, avgdl, allowed, top);
    return top.take_sorted();
  }
  search_pruned(scoring(avgdl), ids, n, allowed, top);
  return top.take_sorted();
}

const Bm25Index::Scoring& Bm25Index::scoring(float avgdl) const {
  std::lock_guard<std::mutex> lock(norm_mutex_);
  if (norm_version_ == version_ && scoring_.begin.size() == postings_.size() + 1) return scoring_;
  const float k1 = params_.k1, b = params_.b;
  std::vector<float> norm(doc_len_.size());
  for (std::size_t s = 0; s < doc_len_.size(); ++s) {
    norm[s] = k1 * (1.0f - b + b * static_cast<float>(doc_len_[s]) / avgdl);
  }
  Scoring& out = scoring_;
  out.begin.assign(postings_.size() + 1, 0);
  out.max_weight.assign(postings_.size(), 0.0f);
  out.slot.clear();
  out.weight.clear();
  out.slot.reserve(live_postings_);
  out.weight.reserve(live_postings_);
  std::vector<std::pair<Slot, float>> run;  // one term's run, when it needs sorting
  for (std::size_t t = 0; t < postings_.size(); ++t) {
    const std::size_t first = out.slot.size();
    bool ascending = true;
    float top = 0.0f;
    for (const Posting& p : postings_[t]) {
      if (p.gen != gen_[p.slot]) continue;  // a cleared or rewritten row's old posting
      const auto tf = static_cast<float>(p.tf);
      const float w = tf * (k1 + 1.0f) / (tf + norm[p.slot]);
      if (out.slot.size() > first && p.slot < out.slot.back()) ascending = false;
      out.slot.push_back(p.slot);
      out.weight.push_back(w);
      top = std::max(top, w);
    }
    if (!ascending) {
      // Postings are appended in order of writing, and a write may reuse a lower, freed slot.
      run.clear();
      for (std::size_t i = first; i < out.slot.size(); ++i) run.emplace_back(out.slot[i], out.weight[i]);
      std::sort(run.begin(), run.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      for (std::size_t i = 0; i < run.size(); ++i) {
        out.slot[first + i] = run[i].first;
        out.weight[first + i] = run[i].second;
      }
    }
    out.max_weight[t] = top;
    out.begin[t + 1] = out.slot.size();
  }
  norm_version_ = version_;
  return scoring_;
}

namespace {

// One query term of a pruned search: its run of the scoring layout and a cursor over it.
struct TermCursor {
  const Slot* slot;     // the run's slots, ascending
  const float* weight;  // their weights
  std::size_t pos;      // the cursor (lookups move it forward only)
  std::size_t end;
  float idf;
  float bound;          // idf * the run's largest weight: no posting of the term contributes more
  std::uint32_t order;  // the term's place in the summation order (ascending term id)
};

// The first position in [pos, end) whose slot is >= d (slots ascending): galloping from pos,
// then a binary search, so that skipping far ahead costs O(log distance).
std::size_t seek(const Slot* slot, std::size_t pos, std::size_t end, Slot d) {
  if (pos >= end || slot[pos] >= d) return pos;
  std::size_t lo = pos;  // slot[lo] < d
  std::size_t step = 1;
  std::size_t hi = pos + 1;
  while (hi < end && slot[hi] < d) {
    lo = hi;
    step *= 2;
    hi = lo + step;
  }
  hi = std::min(hi, end);
  return static_cast<std::size_t>(std::lower_bound(slot + lo + 1, slot + hi, d) - slot);
}

// Queries with more distinct terms are scored exhaustively (a kept row's contributions are
// put in summation order by a sort of up to this many).
constexpr std::size_t kPrunedTerms = 64;

// One contribution of a term to a candidate row, in the candidate's list (newest first).
struct Contribution {
  float value;
  std::uint32_t order;  // the term's place in the summation order
  std::uint32_t next;   // the candidate's previous contribution, kNone at its first
};
// A row met by a pruned search that may still reach the top k.
struct Candidate {
  double partial;  // its contributions so far, summed
  Slot slot;
  std::uint32_t head;  // its newest contribution
  bool live;           // false once dropped
};
constexpr std::uint32_t kNone = 0xFFFFFFFFu;  // cell_of: a row not met yet
constexpr std::uint32_t kDead = 0xFFFFFFFEu;  // cell_of: a row met that cannot reach the top k

// Buckets of the histogram of candidates' partial scores (a lower bound of the k-th best).
constexpr std::size_t kBuckets = 256;

// The per-thread buffers of a pruned search, reused so that a search allocates nothing in
// steady state. Between searches `cell_of` is all kNone.
struct PrunedScratch {
  std::vector<std::uint32_t> cell_of;  // per slot: its candidate's index, kNone or kDead
  std::vector<Candidate> cells;
  std::vector<Slot> dead;  // the rows marked kDead
  std::vector<Contribution> contrib;
  std::vector<std::uint32_t> kept;                   // candidates still in the running
  std::vector<std::pair<std::uint32_t, float>> sum;  // one candidate's contributions, sorted
  std::vector<TermCursor> terms;
  std::vector<double> rest;         // rest[i]: the bounds of terms[i..m) summed; rest[m] = 0
  std::vector<std::uint32_t> hist;  // candidates per bucket of partial score
};

// Out of line on purpose, as search_scratch() (search_scratch.h): inlined into the search, GCC
// re-resolves the thread_local (a __tls_get_addr call in a shared library) at nearly every use.
#if defined(_MSC_VER)
__declspec(noinline)
#else
__attribute__((noinline))
#endif
    PrunedScratch& pruned_scratch() {
  thread_local PrunedScratch scratch;
  return scratch;
}

// Every posting of every term in `terms` (in summation order) added up per row, the rows in
// `allowed` (if given) offered to `top`: the exhaustive scoring that the pruned search is
// exact against. O(postings of the terms).
void score_every_posting(const std::vector<TermCursor>& terms, std::size_t slots, const Bitmap* allowed, TopK& top) {
  SearchScratch& scratch = search_scratch();
  std::vector<float>& acc = scratch.bm25_acc;
  std::vector<Slot>& rows = scratch.bm25_touched;
  if (acc.size() < slots) acc.resize(slots, 0.0f);
  rows.clear();
  for (const TermCursor& c : terms) {
    for (std::size_t p = c.pos; p < c.end; ++p) {
      const Slot d = c.slot[p];
      if (acc[d] == 0.0f) rows.push_back(d);  // contributions are > 0
      acc[d] += c.idf * c.weight[p];
    }
  }
  for (const Slot d : rows) {
    if (allowed == nullptr || allowed->test(d)) top.push(-acc[d], d);
    acc[d] = 0.0f;
  }
}

}  // namespace

void Bm25Index::search_pruned(const Scoring& sc, const std::vector<std::pair<std::uint32_t, double>>& ids, double n,
                              const Bitmap* allowed, TopK& top) const {
  // Term at a time with MaxScore's bounds (Turtle & Flood 1995; the "quit / continue" strategy
  // of Moffat & Zobel 1996, made exact). The terms are taken by decreasing bound (the most one
  // posting can contribute: rare terms first). Each term's postings add to per-row candidates
  // until the bounds of the terms left sum below the k-th best candidate's partial score: a row
  // met in none of the terms so far can no longer reach the top k. The rest (the long lists of
  // frequent terms) then only add to the candidates that can still make it, by a scan of the
  // term's postings or, when the candidates are few against them, by skipping ahead to each;
  // after each term the candidates that can no longer make it are dropped. Exact: a row is
  // dropped only when a bound of its score is strictly below a lower bound of the k-th best
  // score, and a row kept gets the sum an exhaustive scoring computes (its terms' float
  // contributions added in ascending term id order), so the rows, scores and order are bit for
  // bit those of scoring every posting (score_every_posting).
  const std::size_t m = ids.size();
  if (m == 0) return;
  PrunedScratch& s = pruned_scratch();
  std::vector<TermCursor>& terms = s.terms;
  terms.clear();
  for (std::size_t i = 0; i < m; ++i) {
    const auto [term, df] = ids[i];
    const auto idf = static_cast<float>(std::log(1.0 + (n - df + 0.5) / (df + 0.5)));
    terms.push_back({sc.slot.data(), sc.weight.data(), sc.begin[term], sc.begin[term + 1], idf,
                     idf * sc.max_weight[term], static_cast<std::uint32_t>(i)});
  }
  const std::size_t k = top.capacity();
  std::size_t postings = 0;
  for (const TermCursor& c : terms) postings += c.end - c.pos;
  // Contributions are numbered in 32 bits (kNone aside).
  if (m > kPrunedTerms || k == 0 || postings >= kDead) {
    score_every_posting(terms, doc_len_.size(), allowed, top);
    return;
  }
  std::sort(terms.begin(), terms.end(), [](const TermCursor& a, const TermCursor& b) {
    return a.bound > b.bound || (a.bound == b.bound && a.order < b.order);
  });
  s.rest.assign(m + 1, 0.0);
  for (std::size_t i = m; i-- > 0;) s.rest[i] = s.rest[i + 1] + terms[i].bound;
  // Bounds and partial scores are summed in double. A float sum of m non-negative terms is
  // within (m - 1) units in the last place of a float of their exact sum (Higham, "Accuracy and
  // Stability of Numerical Algorithms", 2002, section 4.2): with twice that margin on each
  // side, a row whose bound is below the k-th best partial score scores strictly below the
  // k-th best.
  const double slack = static_cast<double>(m + 1) * 1.2e-7;
  const double up = 1.0 + slack, down = 1.0 - slack;
  // The histogram of the candidates' partial scores, in kBuckets buckets of `width` over
  // [0, rest[0]]: counting from the top, the bucket where k candidates are reached has a low
  // edge that k candidates' partial scores (lower bounds of their scores) reach.
  const double width = s.rest[0] / static_cast<double>(kBuckets);
  const double per = static_cast<double>(kBuckets) / s.rest[0];
  s.hist.assign(kBuckets, 0);
  std::uint32_t* hist = s.hist.data();
  const auto bucket = [per](double x) { return std::min(kBuckets - 1, static_cast<std::size_t>(x * per)); };
  const auto kth_bound = [&] {
    std::size_t count = 0;
    for (std::size_t b = kBuckets; b-- > 0;) {
      count += hist[b];
      if (count >= k) return static_cast<double>(b) * width * (1.0 - 1e-12);
    }
    return -std::numeric_limits<double>::infinity();
  };
  if (s.cell_of.size() < doc_len_.size()) s.cell_of.resize(doc_len_.size(), kNone);
  std::uint32_t* cell_of = s.cell_of.data();
  std::vector<Candidate>& cells = s.cells;
  cells.clear();
  s.dead.clear();
  s.contrib.clear();
  // Puts cell_of back to all kNone on every way out (an allocation may throw midway).
  struct Reset {
    PrunedScratch& s;
    ~Reset() {
      for (const Candidate& c : s.cells) s.cell_of[c.slot] = kNone;
      for (const Slot d : s.dead) s.cell_of[d] = kNone;
    }
  } reset{s};
  // Adds contribution v of the term in summation place `order` to candidate `cell`.
  const auto add = [&](std::uint32_t cell, float v, std::uint32_t order) {
    Candidate& c = cells[cell];
    s.contrib.push_back({v, order, c.head});
    c.head = static_cast<std::uint32_t>(s.contrib.size() - 1);
    const std::size_t from = bucket(c.partial);
    c.partial += v;
    const std::size_t to = bucket(c.partial);
    if (from != to) {
      --hist[from];
      ++hist[to];
    }
  };
  double bar = -std::numeric_limits<double>::infinity();  // k candidates' partial scores reach it
  std::size_t t = 0;
  // 1. Terms whose postings may still bring a new row into the top k: every posting. A row
  //    first met at term t scores at most its contribution there plus rest[t + 1]: below the
  //    bar, it is marked dead rather than made a candidate.
  for (; t < m; ++t) {
    if (cells.size() >= k) {
      bar = kth_bound();
      if (s.rest[t] * up < bar * down) break;
    }
    const TermCursor& c = terms[t];
    const double after = s.rest[t + 1];
    for (std::size_t p = c.pos; p < c.end; ++p) {
      const Slot d = c.slot[p];
      const float v = c.idf * c.weight[p];
      std::uint32_t cell = cell_of[d];
      if (cell == kDead) continue;
      if (cell == kNone) {
        if ((allowed != nullptr && !allowed->test(d)) || (v + after) * up < bar * down) {
          cell_of[d] = kDead;
          s.dead.push_back(d);
          continue;
        }
        cell = cell_of[d] = static_cast<std::uint32_t>(cells.size());
        cells.push_back({0.0, d, kNone, true});
        ++hist[0];
      }
      add(cell, v, c.order);
      if ((p & 511) == 511 && cells.size() >= k) bar = kth_bound();
    }
  }
  std::vector<std::uint32_t>& kept = s.kept;
  kept.clear();
  for (std::uint32_t cell = 0; cell < cells.size(); ++cell) {
    if (t == m || (cells[cell].partial + s.rest[t]) * up >= bar * down) {
      kept.push_back(cell);
    } else {
      cells[cell].live = false;
    }
  }
  // 2. The other terms, added to the candidates that can still reach the top k: by a scan of
  //    the term's postings, or by skipping ahead to each candidate when they are few.
  bool by_slot = false;  // kept is in slot order (skipping ahead needs it)
  for (; t < m && !kept.empty(); ++t) {
    TermCursor& c = terms[t];
    if (c.end - c.pos <= 8 * kept.size()) {
      for (std::size_t p = c.pos; p < c.end; ++p) {
        const std::uint32_t cell = cell_of[c.slot[p]];
        if (cell < kDead && cells[cell].live) add(cell, c.idf * c.weight[p], c.order);
      }
    } else {
      if (!by_slot) {
        std::sort(kept.begin(), kept.end(),
                  [&](std::uint32_t a, std::uint32_t b) { return cells[a].slot < cells[b].slot; });
        by_slot = true;
      }
      for (const std::uint32_t cell : kept) {
        const Slot d = cells[cell].slot;
        c.pos = seek(c.slot, c.pos, c.end, d);
        if (c.pos == c.end) break;
        if (c.slot[c.pos] == d) add(cell, c.idf * c.weight[c.pos], c.order);
      }
    }
    if (kept.size() > k) {
      bar = std::max(bar, kth_bound());
      const double rest = s.rest[t + 1];
      std::size_t out = 0;
      for (const std::uint32_t cell : kept) {
        if ((cells[cell].partial + rest) * up < bar * down) {
          cells[cell].live = false;
        } else {
          kept[out++] = cell;
        }
      }
      kept.resize(out);
    }
  }
  // 3. The exact score of each candidate kept: its contributions in summation order.
  for (const std::uint32_t cell : kept) {
    s.sum.clear();
    for (std::uint32_t e = cells[cell].head; e != kNone; e = s.contrib[e].next) {
      s.sum.emplace_back(s.contrib[e].order, s.contrib[e].value);
    }
    std::sort(s.sum.begin(), s.sum.end());
    float score = 0.0f;
    for (const auto& [order, v] : s.sum) score += v;
    top.push(-score, cells[cell].slot);
  }
}

void Bm25Index::search_exhaustive(const std::vector<std::pair<std::uint32_t, double>>& ids, double n, float avgdl,
                                  const Bitmap* allowed, TopK& top) const {
  const float k1 = params_.k1, b = params_.b;
  SearchScratch& scratch = search_scratch();
  std::vector<float>& acc = scratch.bm25_acc;
  std::vector<Slot>& touched = scratch.bm25_touched;
  if (acc.size() < doc_len_.size()) acc.resize(doc_len_.size(), 0.0f);
  touched.clear();
  for (const auto& [term, df] : ids) {
    const auto idf = static_cast<float>(std::log(1.0 + (n - df + 0.5) / (df + 0.5)));
    const std::uint32_t* gen = gen_.data();
    // The weight expression of scoring(), with the global avgdl: the values are identical to
    // those of one index holding every row.
    for (const Posting& p : postings_[term]) {
      // A cleared or rewritten row has a newer generation than its old postings.
      if (p.gen != gen[p.slot]) continue;
      if (allowed != nullptr && !allowed->test(p.slot)) continue;
      const auto tf = static_cast<float>(p.tf);
      const float norm = k1 * (1.0f - b + b * static_cast<float>(doc_len_[p.slot]) / avgdl);
      const float weight = tf * (k1 + 1.0f) / (tf + norm);
      if (acc[p.slot] == 0.0f) touched.push_back(p.slot);
      acc[p.slot] += idf * weight;
    }
  }
  for (Slot s : touched) {
    top.push(-acc[s], s);
    acc[s] = 0.0f;
  }
}

std::size_t Bm25Index::memory_bytes() const {
  // A deferred build may be filling the arrays on another searching thread: wait for it.
  std::unique_lock<std::mutex> lock(build_mutex_, std::defer_lock);
  if (!built_.load(std::memory_order_acquire)) lock.lock();
  std::size_t b = terms_.memory_bytes();
  for (const auto& p : postings_) b += p.capacity() * sizeof(Posting) + sizeof(p);
  for (const auto& d : doc_terms_) b += d.capacity() * 8 + sizeof(d);
  b += doc_len_.capacity() * 4 + gen_.capacity() * 4 + has_.capacity() + df_.capacity() * 4;
  std::lock_guard<std::mutex> scoring_lock(norm_mutex_);  // a search may be rebuilding the layout
  return b + scoring_.begin.capacity() * 8 + scoring_.slot.capacity() * sizeof(Slot) + scoring_.weight.capacity() * 4 +
         scoring_.max_weight.capacity() * 4;
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
  skim(r, store);
  BinaryReader section = r.section(begin, r.position());
  // The build must use exactly the bytes the load's payload checksum covered. A block-
  // checksummed file keeps its blocks' hashes: the build re-hashes the blocks under the section
  // and compares (BinaryReader::blocks_unchanged), so the load reads the section only to skim
  // it. A checksum64 file has none: the section's own checksum is taken now, kept in memory
  // only (XXH3 in 4 MiB blocks on this thread, issue 28).
  std::optional<std::uint64_t> sum;
  if (!r.block_checksummed()) sum = block_checksum(section.here(), section.remaining(), 1);
  deferred_ = std::make_unique<Deferred>(Deferred{std::move(section), store.slot_count(), sum});
  built_.store(false, std::memory_order_release);
}

void Bm25Index::skim(BinaryReader& r, const VectorStore& store) {
  Bm25Params params;
  params.k1 = r.f32();
  params.b = r.f32();
  if (!(params.k1 >= 0) || !std::isfinite(params.k1) || !(params.b >= 0 && params.b <= 1)) {
    r.fail("invalid BM25 parameters");
  }
  const std::uint64_t nterms = r.u64();
  r.require(nterms, 8);
  for (std::uint64_t i = 0; i < nterms; ++i) {
    const std::uint64_t len = r.u64();
    r.skip(len, 1);
  }
  const std::size_t slots = store.slot_count();
  const std::uint64_t docs = r.u64();
  r.require(docs, 16);
  std::int64_t last = -1;
  for (std::uint64_t d = 0; d < docs; ++d) {
    const Slot s = r.u32();
    r.u32();  // the length, checked against the terms by the build
    const std::uint64_t nt = r.u64();
    if (s >= slots || !store.is_live(s) || static_cast<std::int64_t>(s) <= last) {
      r.fail("BM25 row for a missing, repeated or out-of-order slot");
    }
    last = s;
    r.skip(nt, 8);
  }
  params_ = params;
  n_docs_ = static_cast<std::size_t>(docs);
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
  const bool same = deferred_->sum ? block_checksum(r.here(), r.remaining(), 1) == *deferred_->sum
                                   : r.blocks_unchanged().value_or(false);
  if (!same) {
    r.fail("BM25 section changed since the file was loaded (checksum mismatch)");
  }
  try {
    // The checks the load left (terms UTF-8 and distinct, term lists, lengths, every term
    // used), counting each term's rows, then the build, which reserves the postings by them.
    std::vector<std::uint32_t> df;
    BinaryReader check = r;
    self->parse(check, nullptr, deferred_->slots, false, df);
    check.expect_end();
    self->parse(r, nullptr, deferred_->slots, true, df);
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
