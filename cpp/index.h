#pragma once
// The index a user holds: a VectorStore plus, for kind hnsw, an HnswIndex over it, behind one
// reader/writer lock. This is the C++ API the Python binding wraps one-to-one.
//
// Thread-safety: const methods (search, contains, get_vectors, save, ...) take a shared lock
// and may run concurrently from any number of threads; add and remove take the exclusive lock,
// so they wait for running searches and block new ones until they finish.
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "bm25_index.h"
#include "code_types.h"
#include "distance.h"
#include "filter_expr.h"
#include "grouping.h"
#include "hnsw_index.h"
#include "metadata_store.h"
#include "search_plan.h"
#include "vector_store.h"

namespace kbcore {

/// hnsw: approximate graph search; flat: exact scan.
enum class IndexKind : std::uint8_t { kHnsw = 0, kFlat = 1 };

/// The largest dimension an index accepts (checked by the constructor and by load).
inline constexpr std::size_t kMaxDim = 65536;

/// Throws InvalidArgument naming `what` ("k", "ef", ...) if value exceeds kMaxEf (hnsw_index.h).
void check_max_ef(const char* what, std::size_t value);

struct IndexConfig {
  std::size_t dim = 0;
  Metric metric = Metric::kCosine;
  IndexKind kind = IndexKind::kHnsw;
  HnswParams hnsw;
  std::size_t ef_search = 64;  ///< default level-0 candidate list size of search()
  /// "none": the graph is searched on the float32 rows; else the name of a code type
  /// (code_types.h: "sq8", "rabitq") the graph is searched on, the best candidates then
  /// re-ranked exactly from the float32 rows (hnsw kind only).
  std::string quantization = "none";
  /// The code type's parameters by name (e.g. RaBitQ's "bits"); the constructor checks them
  /// and completes them with the type's defaults.
  CodeParamValues code_params;
  /// Candidates re-ranked exactly per query of a quantized search; 0 = the default of the
  /// code type (CodeTraits::default_rerank).
  std::size_t rerank = 0;
  /// Float32 rows in a memory-mapped temporary file, dropped from the resident set after
  /// every change (quantized indexes only: the re-rank is then the only reader of rows).
  bool vectors_on_disk = false;
};

/// Parses "cosine" | "ip" | "l2"; throws InvalidArgument otherwise.
Metric parse_metric(const std::string& name);
std::string metric_name(Metric m);
/// Parses "hnsw" | "flat"; throws InvalidArgument otherwise.
IndexKind parse_kind(const std::string& name);
std::string kind_name(IndexKind k);

class Index {
 public:
  explicit Index(const IndexConfig& config);
  ~Index();
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  const IndexConfig& config() const { return config_; }
  std::size_t dim() const { return config_.dim; }
  /// Default ef for search (settable; must be positive).
  std::size_t ef_search() const { return config_.ef_search; }
  void set_ef_search(std::size_t ef);
  /// Sets the exact re-rank depth of a quantized index (0: the code type's default).
  void set_rerank(std::size_t rerank);

  /// Adds n rows (row-major n x dim) under ids; an id already present is replaced (upsert).
  /// Validates all input before changing anything: finite values, unique ids in the batch,
  /// non-zero vectors for cosine. Exclusive lock. O(n log N) graph work on `threads` threads.
  /// `columns` (optional) are the rows' metadata (docs/filter-ir.md); a replaced id gets
  /// exactly the new metadata.
  /// `texts` (optional, n entries; nullopt = no text) feed the BM25 index for hybrid search.
  /// With `defer_graph` (hnsw only), the rows are stored and searchable at once (scanned
  /// exactly) but linked into the graph only by build_graph(); the exclusive lock is then
  /// held only while the rows are copied, not for the graph work.
  void add(const float* vectors, const std::int64_t* ids, std::size_t n, std::size_t threads,
           const std::vector<ColumnInput>& columns = {}, const std::vector<std::optional<std::string>>* texts = nullptr,
           bool defer_graph = false);
  /// Links up to max_rows rows added with defer_graph into the graph (exclusive lock for that
  /// batch only); returns how many rows are still waiting. O(max_rows * log n) graph work.
  std::size_t build_graph(std::size_t max_rows, std::size_t threads);
  /// Rows stored but not yet linked into the graph (0 for flat).
  std::size_t pending_rows() const;
  /// Removes ids; throws NotFound (and removes nothing) if any id is absent or repeated.
  void remove(const std::int64_t* ids, std::size_t n, std::size_t threads);
  /// The strategies of a filtered search (search_plan.h).
  using Strategy = kbcore::Strategy;
  /// params.k nearest per query into caller buffers [nq x k], ascending; padded with -1 /
  /// +inf. Shared lock; batches use params.threads threads (0 = all cores). With
  /// params.filter, results are restricted to rows whose metadata passes it: it is evaluated
  /// once per call, then each query runs an exact scan of the passing rows or a filtered
  /// graph traversal, whichever the cost model (search_plan.h) predicts is cheaper, unless
  /// params.force names one. If at least k rows pass, k results come back. Throws
  /// InvalidArgument for k = 0, an invalid filter, or a NaN / infinite (or, for cosine, zero)
  /// query.
  void search(const float* queries, std::size_t nq, const SearchParams& params, std::int64_t* out_ids,
              float* out_dist) const;
  /// The groups of one query of a grouped search, best first, flattened (a few arrays per
  /// query instead of a few per group). Group g has key key_kinds[g] (kInt: key_ints[g];
  /// kStr: key_chars[key_str_begin(g), key_str_end[g])), its best hits ids/distances
  /// [best_begin(g), best_end[g]) ascending, and every part met part_ids [parts_begin(g),
  /// parts_end[g]) ascending by distance; the best hits are a prefix of the parts.
  struct GroupPage {
    std::vector<ValueKind> key_kinds;      // one per group: kInt or kStr
    std::vector<std::int64_t> key_ints;    // one per group (0 for str keys)
    std::vector<std::size_t> key_str_end;  // one per group: end of its str key in key_chars
    std::string key_chars;                 // the str keys, concatenated (UTF-8)
    std::vector<std::uint32_t> best_end;   // one per group: end of its hits in ids/distances
    std::vector<std::int64_t> ids;
    std::vector<float> distances;
    std::vector<std::uint32_t> parts_end;  // one per group: end of its parts in part_ids
    std::vector<std::int64_t> part_ids;

    std::size_t size() const { return key_kinds.size(); }
    std::size_t key_str_begin(std::size_t g) const { return g == 0 ? 0 : key_str_end[g - 1]; }
    std::size_t best_begin(std::size_t g) const { return g == 0 ? 0 : best_end[g - 1]; }
    std::size_t parts_begin(std::size_t g) const { return g == 0 ? 0 : parts_end[g - 1]; }
  };
  /// Up to params.k groups per query, grouped by the int or str metadata field params.group_by and ordered
  /// by best distance. The graph search keeps doubling its candidate list until k distinct
  /// groups are found or the (filtered) index is exhausted; the exact path (flat kind or few
  /// passing rows) groups every passing row. Rows without a group value are never returned.
  /// Throws InvalidArgument if no stored row has the field. Shared lock.
  std::vector<GroupPage> search_groups(const float* queries, std::size_t nq, const GroupParams& params) const;
  /// Collapses a ranked list (best first; `values` ride along, e.g. fused scores) by the int or
  /// str metadata field group_by: the first `limit` groups to appear, each with its first
  /// group_size hits and every part among the list, as one GroupPage (`distances` holds the
  /// given values). Rows without a group value are skipped. Throws NotFound for an id not in
  /// the index, InvalidArgument for a repeated id, group_size 0, or a field no stored row has
  /// (n > 0). Shared lock; O(n log n) (grouping.h: the rule search_groups collapses with).
  GroupPage collapse(const std::int64_t* ids, const float* values, std::size_t n, const std::string& group_by,
                     std::size_t group_size, std::size_t limit) const;
  /// BM25 full-text search over the rows' texts: up to k (id, score) pairs per query, score
  /// descending; rows matching no query term are not returned. `stats` (summed text_stats()
  /// of every shard of a corpus) makes the scores those of one index over all shards' rows.
  /// Shared lock.
  std::vector<std::pair<std::int64_t, float>> search_text(const std::string& query, std::size_t k,
                                                          const FilterNode* filter = nullptr,
                                                          const Bm25Stats* stats = nullptr) const;
  /// This index's BM25 statistics for the terms of `query` (see Bm25Stats). Shared lock.
  Bm25Stats text_stats(const std::string& query) const;
  /// Rows with text in the BM25 index.
  std::size_t text_documents() const;
  /// Number of live rows that pass `filter`.
  std::size_t count(const FilterNode& filter) const;
  /// Metadata of each id (fields without a value omitted); throws NotFound on an unknown id.
  std::vector<std::vector<std::pair<std::string, Value>>> get_metadata(const std::int64_t* ids, std::size_t n) const;

  std::size_t size() const;
  bool contains(std::int64_t id) const;
  /// Copies stored rows of ids into out [n x dim]; throws NotFound on an unknown id.
  void get_vectors(const std::int64_t* ids, std::size_t n, float* out) const;
  std::vector<std::int64_t> ids() const;
  /// Approximate bytes held by vectors, ids and graph.
  std::size_t memory_bytes() const;
  /// True while the codes of a quantized index are read in place from the mapped file it was
  /// loaded from (format version 7; the first write copies them to the heap). Diagnostics.
  bool codes_in_place() const;
  /// True while the graph's level-0 link lists are read in place the same way. Diagnostics.
  bool links_in_place() const;
  /// True once a quantized index has trained its codes (always false for kNone).
  bool quantizer_trained() const;
  /// Trains the quantizer again from the live rows and re-encodes every row (after the data
  /// drifted out of the trained range, where values clip). Throws InvalidArgument for an
  /// index without quantization or without rows. Exclusive lock; O(n * dim).
  void retrain_quantizer(std::size_t threads);

  /// Renumbers the slots so that graph neighbours sit near each other in memory
  /// (graph_reorder.h; `method` "gorder" | "bfs" | "rcm"): rows, codes, links, metadata and text move
  /// together, so the graph, the ids and the answers stay (up to the order of equal
  /// distances). Throws InvalidArgument for a flat index or an unknown method. The order, the
  /// new level-0 links and the copies that rows and codes read in place from a loaded file
  /// need anyway are made under the shared lock (searches run on); the rest moves in place
  /// under the exclusive lock. A write in between voids what was prepared (made again under
  /// the lock); slots added in between keep their place at the end. O(n * (dim + M)) on one
  /// thread (codes that do not match the slots re-encoded on `threads`).
  void reorder(const std::string& method, std::size_t threads);

  /// Writes the index to one file atomically (temp file, fsync, rename).
  void save(const std::string& path) const;
  /// Reads a file written by save(); validates magic, version, sizes, checksum and links.
  /// `vectors` overrides where the rows live (true: disk, quantized files only); unset, they
  /// live where they did when saved. Rows on disk from a version 4 or 5 file are read in place from
  /// the mapped file (row_buffer.h) until the first write copies them into a row file.
  /// `in_place` false copies what a version 7 file would have read in place (rows in memory,
  /// codes, level-0 lists) into the process's memory once the file is checked: aligned heap
  /// arrays, in 2 MiB pages where the kernel grants them (aligned.h), which a large index
  /// searches faster than 4 KiB file pages; rows on disk stay in the file.
  static std::unique_ptr<Index> load(const std::string& path, std::optional<bool> vectors = std::nullopt,
                                     bool in_place = true);

  /// Version of files without quantization (byte-identical to earlier releases). Versions 2
  /// (SQ8), 3 (RaBitQ) and 4 (either, vectors='disk') are read, no longer written.
  static constexpr std::uint32_t kFormatVersion = 1;
  static constexpr std::uint32_t kFormatVersionQuantized = 2;
  static constexpr std::uint32_t kFormatVersionRabitq = 3;
  static constexpr std::uint32_t kFormatVersionDiskRows = 4;
  /// Version of files of a quantized index (any code type, rows in memory or on disk): after
  /// the parameters, a `vectors` byte and the code tag (the type's name, its parameters by
  /// name, the re-rank depth), the float32 rows aligned to a 64-byte file offset (load maps
  /// them in place), and the codes last. A new code type needs no new version (docs/index.md).
  static constexpr std::uint32_t kFormatVersionTagged = 5;
  /// Version 5's layout with a block_checksum (binary_io.h) instead of checksum64, so that load
  /// verifies the payload on every core at memory speed. Versions 5 and earlier load with their
  /// checksum64.
  static constexpr std::uint32_t kFormatVersionBlocks = 6;
  /// Version of files of a quantized index written now: version 6 with the graph's level-0
  /// link lists and the code rows each aligned to a 64-byte file offset, so that load reads them
  /// in place from the mapped file (the first write copies them to the heap) instead of copying
  /// them. Version 6 loads with both copied.
  static constexpr std::uint32_t kFormatVersionAligned = 7;

  /// Debug statistics of unfiltered graph search: for each query, the work of the walk that
  /// search() with these k and ef (0 = the default) runs (graph rows only; rows whose graph
  /// insertion is deferred are not counted): level-0 hops, upper-level hops and distances
  /// scored, into caller buffers [nq] each. The walk is the one search() runs, compiled with
  /// counters (search() itself counts nothing). One thread; shared lock. Throws
  /// InvalidArgument for a flat index and as search() does for bad queries or k.
  void search_stats(const float* queries, std::size_t nq, std::size_t k, std::size_t ef, std::uint64_t* out_hops,
                    std::uint64_t* out_upper_hops, std::uint64_t* out_scored) const;
  /// The strategy the cost model picks for `passing` rows out of `live` at this ef.
  Strategy choose_strategy(std::size_t passing, std::size_t live, std::size_t ef) const;
  /// Measured distance evaluations per unit of ef of recent unfiltered graph searches.
  double evals_per_ef() const { return evals_.per_ef(); }

 private:
  // load() after the header: every section, parsed and checked (the checksum is load()'s).
  static std::unique_ptr<Index> load_sections(BinaryReader& r, std::optional<bool> vectors);
  /// Checks k and the filter, then copies and (for cosine) normalises the queries; throws
  /// InvalidArgument on k = 0, an invalid filter, NaN / infinity or a zero cosine query.
  std::vector<float> prepare_queries(const float* queries, std::size_t nq, std::size_t k,
                                     const FilterNode* filter) const;
  /// res (ascending) completed with the exact scan of the rows whose graph insertion is
  /// deferred (those `accept(slot)` admits), keeping the `keep` best. Shared lock held.
  /// Defined in index_search.cpp, its only user.
  template <typename Accept>
  std::vector<Scored> merge_pending(std::vector<Scored> res, const float* q, const Accept& accept,
                                    std::size_t keep) const;
  /// The rows an exact scan reads, ascending: those of `allowed`, or every live row.
  std::vector<Slot> candidate_rows(const Bitmap* allowed, std::size_t passing) const;
  void remove_locked(const std::vector<Slot>& slots, std::size_t threads);
  /// Copies grouped slots out as ids and keys (field keys from `ordinals`). Shared lock held.
  void page_of(const GroupedSlots& groups, const GroupOrdinals& ordinals, GroupPage& page) const;
  /// Encodes new slots (training first when the row count reaches the type's kTrainRows).
  void update_codes_locked(const std::vector<Slot>& slots, std::size_t threads);
  void train_codes_locked(std::size_t threads);
  /// Codes usable for search: null unless quantized and trained.
  const CodeStore* search_codes() const { return codes_trained() ? codes_.get() : nullptr; }
  bool quantized() const { return codes_ != nullptr; }
  bool codes_trained() const {
    return codes_ && std::visit([](const auto& c) { return c.trained(); }, *codes_);
  }
  /// Rows the index holds when it first trains its codes (a quantized index; before that it
  /// searches the float32 rows; retrain_quantizer() trains again from the rows stored now).
  std::size_t train_rows() const {
    return std::visit([](const auto& c) { return CodeTraits<std::decay_t<decltype(c)>>::kTrainRows; }, *codes_);
  }
  std::size_t rerank_depth(std::size_t ef, std::size_t k) const {
    if (config_.rerank || !codes_) return config_.rerank;
    return std::visit([&](const auto& c) { return CodeTraits<std::decay_t<decltype(c)>>::default_rerank(ef, k); },
                      *codes_);
  }

  IndexConfig config_;
  VectorStore store_;
  std::unique_ptr<HnswIndex> graph_;  // null for flat
  std::unique_ptr<CodeStore> codes_;  // null unless quantized
  MetadataStore meta_;
  Bm25Index text_;
  // Measured graph work of recent unfiltered searches, feeding the filtered-search cost model.
  mutable EvalStats evals_;
  mutable std::shared_mutex mutex_;
  // Counts the exclusive sections that change rows, slots, links or codes, so that work
  // prepared under the shared lock (reorder) can tell whether it still applies.
  std::uint64_t writes_ = 0;
};

}  // namespace kbcore
