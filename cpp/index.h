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

#include "distance.h"
#include "hnsw_index.h"
#include "vector_store.h"

namespace kbcore {

/// hnsw: approximate graph search; flat: exact scan.
enum class IndexKind : std::uint8_t { kHnsw = 0, kFlat = 1 };

struct IndexConfig {
  std::size_t dim = 0;
  Metric metric = Metric::kCosine;
  IndexKind kind = IndexKind::kHnsw;
  HnswParams hnsw;
  std::size_t ef_search = 64;  ///< default level-0 candidate list size of search()
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

  /// Adds n rows (row-major n x dim) under ids; an id already present is replaced (upsert).
  /// Validates all input before changing anything: finite values, unique ids in the batch,
  /// non-zero vectors for cosine. Exclusive lock. O(n log N) graph work on `threads` threads.
  void add(const float* vectors, const std::int64_t* ids, std::size_t n, std::size_t threads);
  /// Removes ids; throws NotFound (and removes nothing) if any id is absent or repeated.
  void remove(const std::int64_t* ids, std::size_t n, std::size_t threads);
  /// k nearest per query into caller buffers [nq x k], ascending; padded with -1 / +inf.
  /// ef = 0 uses ef_search(). Shared lock; batches use `threads` threads (0 = all cores).
  void search(const float* queries, std::size_t nq, std::size_t k, std::size_t ef,
              std::size_t threads, std::int64_t* out_ids, float* out_dist) const;

  std::size_t size() const;
  bool contains(std::int64_t id) const;
  /// Copies stored rows of ids into out [n x dim]; throws NotFound on an unknown id.
  void get_vectors(const std::int64_t* ids, std::size_t n, float* out) const;
  std::vector<std::int64_t> ids() const;
  /// Approximate bytes held by vectors, ids and graph.
  std::size_t memory_bytes() const;

  /// Writes the index to one file atomically (temp file, fsync, rename).
  void save(const std::string& path) const;
  /// Reads a file written by save(); validates magic, version, sizes, checksum and links.
  static std::unique_ptr<Index> load(const std::string& path);

  static constexpr std::uint32_t kFormatVersion = 1;

 private:
  /// Copies and (for cosine) normalises one query; throws on NaN/inf.
  void prepare_query(const float* q, float* out) const;
  void remove_locked(const std::vector<Slot>& slots, std::size_t threads);

  IndexConfig config_;
  VectorStore store_;
  std::unique_ptr<HnswIndex> graph_;  // null for flat
  mutable std::shared_mutex mutex_;
};

}  // namespace kbcore
