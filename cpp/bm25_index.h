#pragma once
// A BM25 inverted index over the text of rows, kept in step with the vectors (same slots),
// for hybrid search. Scoring is Okapi BM25 with Lucene's idf, ln(1 + (N - df + 0.5) / (df + 0.5)),
// and term weight tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)) (Robertson & Zaragoza 2009).
//
// Deletes are lazy: a posting whose slot was cleared or reused (generation mismatch) is skipped
// and the postings are rebuilt from the per-row term lists once stale entries reach half.
// Thread-safety as for the owning Index: search is const and concurrent; set/clear exclusive.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "binary_io.h"
#include "bitmap.h"
#include "graph_reorder.h"
#include "string_dict.h"
#include "topk.h"
#include "vector_store.h"

namespace kbcore {

struct Bm25Params {
  float k1 = 1.2f;
  float b = 0.75f;
};

/// The texts of one add() batch, tokenized and counted against a batch-local vocabulary and
/// transposed into per-term postings of batch rows, ready for Bm25Index::set_batch. Built
/// without touching an index, so callers build it before taking their write lock; set_batch
/// then does O(distinct terms of the batch) vocabulary lookups instead of one per (row, term).
class Bm25Batch {
 public:
  /// Tokenizes texts[i] (nullopt = row without text) on `threads` threads (0 = all cores).
  /// O(total text bytes).
  Bm25Batch(const std::vector<std::optional<std::string>>& texts, std::size_t threads);
  /// Rows of the batch (with or without text).
  std::size_t rows() const { return has_text_.size(); }
  /// Distinct terms of the batch.
  std::size_t terms() const { return terms_.size(); }

 private:
  friend class Bm25Index;
  // Term ids in order of first appearance: by row, then by term bytes within a row. This is
  // the order in which a row-by-row insertion of sorted terms meets them, so new index term
  // ids come out exactly as if the rows were set one at a time.
  StringTable terms_;
  std::vector<std::uint64_t> term_begin_;  // postings of term t: [term_begin_[t], term_begin_[t + 1])
  std::vector<std::uint32_t> post_row_;    // batch row of each posting, ascending per term
  std::vector<std::uint32_t> post_tf_;     // term frequency of each posting
  std::vector<std::uint32_t> row_terms_;   // distinct terms per row
  std::vector<std::uint64_t> row_len_;     // tokens per row
  std::vector<std::uint8_t> has_text_;     // 1 if the row has text (possibly empty)
};

/// The corpus statistics a BM25 score depends on, for the terms of one query. Summed over
/// several indexes (the shards of one corpus), they let each index score its rows exactly as
/// one index over all the rows would (Bm25Index::search with `global`).
struct Bm25Stats {
  std::uint64_t documents = 0;     // rows with text
  std::uint64_t total_length = 0;  // tokens over those rows
  std::vector<std::string> terms;  // distinct query terms, ascending by bytes
  std::vector<std::uint64_t> df;   // per term: rows containing it
};

class Bm25Index {
 public:
  explicit Bm25Index(Bm25Params params = {});
  const Bm25Params& params() const { return params_; }
  /// Grows per-slot arrays to n slots.
  void grow(std::size_t n);
  /// Gives row i of `batch` (if it has text) to slots[i], as giving the rows one at a time would; the
  /// slots must be distinct. O(distinct batch terms + postings of the batch), on up to two
  /// of `threads` threads (0 = all cores).
  void set_batch(const Bm25Batch& batch, const std::vector<Slot>& slots, std::size_t threads);
  /// Removes slot s's text. O(terms of s).
  void clear(Slot s);
  bool has_text(Slot s) const {
    ensure_built();
    return s < doc_len_.size() && has_[s];
  }
  /// Rows with text.
  std::size_t documents() const { return n_docs_; }
  /// This index's statistics for the distinct terms of `query` (df 0 for an unknown term).
  /// O(query terms).
  Bm25Stats stats(std::string_view query) const;
  /// The k best rows for `query` by BM25 score (descending; Scored.dist holds -score), among
  /// `allowed` when given. Rows that match no query term are not returned. Exact top k with
  /// dynamic pruning (MaxScore): the same rows, scores and order as scoring every posting, in
  /// O(postings of the query terms) at worst and usually far fewer. Thread-safe against other
  /// searches. With `global` (statistics summed over every index of a sharded corpus, see
  /// stats()), N, avgdl and df come from it instead of this index and every posting is scored;
  /// throws InvalidArgument if it lacks a query term this index holds or counts fewer rows
  /// than this index has.
  std::vector<Scored> search(std::string_view query, std::size_t k, const Bitmap* allowed,
                             const Bm25Stats* global = nullptr) const;
  /// Moves the text of old slot p.new_to_old[i] to slot i (graph_reorder.h) and rebuilds the
  /// postings in the new slot order (as a compaction does). O(slots + postings).
  void permute_slots(const SlotPermutation& p);
  std::size_t memory_bytes() const;
  void save(BinaryWriter& w) const;
  /// Reads the section save() wrote and builds the postings. O(postings).
  void load(BinaryReader& r, const VectorStore& store);
  /// Reads the section save() wrote, checking at once its parameters, its extent and its rows'
  /// slots (live, ascending), and keeps its bytes' checksum; the rest of load()'s checks (terms
  /// UTF-8 and distinct, term lists, lengths) and the vocabulary and postings wait until a call
  /// first needs them (search, stats, save, writes), which then throws FormatError for a bad
  /// section, before it answers or changes anything: opening an index for vector search pays
  /// for neither. documents() is known at once. Keeps the file's mapping alive until then (a
  /// file read into the heap, on a platform without mmap, is loaded at once). O(terms + rows).
  void load_deferred(BinaryReader& r, const VectorStore& store);
  /// Checks and builds a section load_deferred() read, once (FormatError if it fails a check or
  /// its bytes changed since; nothing otherwise). Index's writers call it before their first
  /// change, so that a bad section changes nothing. Thread-safe against searches.
  void ensure_built() const;

 private:
  struct Posting {
    Slot slot;
    std::uint32_t tf;
    std::uint32_t gen;  // generation of the slot's text when the posting was written
  };
  std::uint32_t term_id(std::string_view t);
  void compact();
  void resize_slots(std::size_t n);  // grow() without building a deferred section first
  // Reads the section at r. With `build`, fills the vocabulary, postings and per-slot arrays
  // (grown to `slots`); without, only checks it. With `store` (a load, not a deferred build:
  // that one's slots were checked at load) checks the slots against it and sets params_ and
  // n_docs_, which a deferred build leaves for concurrent readers.
  // `df`: filled with each term's row count by a check; read by a build (if sized) to reserve.
  void parse(BinaryReader& r, const VectorStore* store, std::size_t slots, bool build, std::vector<std::uint32_t>& df);
  // load_deferred()'s pass over the section: its parameters, its extent (every count against
  // the bytes left) and each row's slot, setting params_ and n_docs_. O(terms + rows).
  void skim(BinaryReader& r, const VectorStore& store);

  // A section read by load_deferred and not yet built: its bytes, the slot count then and, in
  // a file without block hashes (checksum64), the bytes' block_checksum (one thread).
  struct Deferred {
    BinaryReader reader;
    std::size_t slots;
    std::optional<std::uint64_t> sum;
  };
  mutable std::unique_ptr<Deferred> deferred_;
  mutable std::atomic<bool> built_{true};
  mutable std::mutex build_mutex_;

  Bm25Params params_;
  StringTable terms_;                           // the vocabulary: term string <-> term id
  std::vector<std::uint32_t> df_;               // live rows containing each term
  std::vector<std::vector<Posting>> postings_;  // per term
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> doc_terms_;  // per slot: (term, tf)
  std::vector<std::uint32_t> doc_len_;                                           // tokens per slot
  std::vector<std::uint32_t> gen_;  // per slot; a compaction runs before it can wrap
  // The postings as a search without global statistics reads them, for the corpus state
  // `norm_version_` (built lazily at the first search after a write, under norm_mutex_): per
  // term one contiguous run of its live postings, ascending by slot, each with its term weight
  // tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)) (it depends on avgdl, hence the
  // cache), and the run's largest weight, the bound that dynamic pruning needs.
  struct Scoring {
    std::vector<std::uint64_t> begin;  // term t's run: [begin[t], begin[t + 1]); size terms + 1
    std::vector<Slot> slot;            // per posting, ascending within a run
    std::vector<float> weight;         // per posting
    std::vector<float> max_weight;     // per term: the largest weight of its run (0 if empty)
  };
  // The scoring layout of the current corpus state, built first if stale. avgdl as search()
  // computes it for this index's own statistics.
  const Scoring& scoring(float avgdl) const;
  // The pruned scoring of search() over the layout `sc` (see its comment in the .cpp).
  void search_pruned(const Scoring& sc, const std::vector<std::pair<std::uint32_t, double>>& ids, double n,
                     const Bitmap* allowed, TopK& top) const;
  // The exhaustive term-at-a-time scoring of search() under global statistics: every posting
  // of every query term, summed per slot in ascending term id order.
  void search_exhaustive(const std::vector<std::pair<std::uint32_t, double>>& ids, double n, float avgdl,
                         const Bitmap* allowed, TopK& top) const;
  mutable Scoring scoring_;
  mutable std::uint64_t norm_version_ = ~std::uint64_t{0};
  mutable std::mutex norm_mutex_;
  std::uint64_t version_ = 0;      // bumped by every set / clear
  std::vector<std::uint8_t> has_;  // per slot: 1 if it has text
  std::size_t n_docs_ = 0;
  std::uint64_t total_len_ = 0;
  std::size_t live_postings_ = 0;
  std::size_t stale_postings_ = 0;
};

}  // namespace kbcore
