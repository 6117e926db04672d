// Index::save and Index::load: the single-file format (binary_io.h) of an index, and the
// validation that a loaded file is one save() could have written.
#include "index.h"

#include <string>

#include "binary_io.h"
#include "errors.h"
#include "rabitq_codes.h"
#include "sq8_codes.h"
#include "vector_checks.h"

namespace kbcore {
namespace {

constexpr char kMagic[8] = {'K', 'B', 'C', 'O', 'R', 'E', 'I', 'X'};
// Version 4 (vectors='disk') aligns the float32 rows to this file offset, so that load can
// read them in place from the mapped file.
constexpr std::size_t kRowAlign = 64;

bool host_little_endian() {
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return false;
#else
  return true;
#endif
}

}  // namespace

void Index::save(const std::string& path) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  // An index with rows on disk writes version 4 (a quantized index only: the constructor and
  // load refuse others); every other index writes the bytes earlier releases wrote.
  const bool disk = config_.vectors_on_disk && quantized();
  BinaryWriter w(path, kMagic,
                 disk      ? kFormatVersionDiskRows
                 : codes_  ? kFormatVersionQuantized
                 : rabitq_ ? kFormatVersionRabitq
                           : kFormatVersion);
  w.u64(config_.dim);
  w.u8(static_cast<std::uint8_t>(config_.metric));
  w.u8(static_cast<std::uint8_t>(config_.kind));
  w.u64(config_.ef_search);
  w.u64(config_.hnsw.M);
  w.u64(config_.hnsw.ef_construction);
  w.u64(config_.hnsw.seed);
  if (disk) w.u8(1);  // version 4: where the rows live (1: disk)
  const std::size_t slots = store_.slot_count();
  w.u64(slots);
  w.array(store_.slot_ids().data(), slots);
  w.array(store_.live_flags().data(), slots);
  if (disk) w.pad_to(kRowAlign);
  w.array(store_.data(), slots * config_.dim);
  if (graph_) graph_->save(w);
  meta_.save(w, store_);
  text_.save(w);
  if (quantized()) {
    // Versions 2 (SQ8), 3 (RaBitQ) and 4 (either): the quantization section (kind, re-rank
    // depth, quantizer and codes).
    w.u8(static_cast<std::uint8_t>(config_.quantization));
    w.u64(config_.rerank);
    if (codes_) codes_->save(w);
    if (rabitq_) {
      w.u8(static_cast<std::uint8_t>(config_.rabitq_bits));  // read first: it shapes the codes object
      rabitq_->save(w);
    }
  }
  w.commit();
  store_.release_resident_rows();
}

std::unique_ptr<Index> Index::load(const std::string& path, std::optional<bool> vectors) {
  BinaryReader r(path, kMagic, kFormatVersionDiskRows);
  IndexConfig c;
  c.dim = r.u64();
  const std::uint8_t metric = r.u8();
  const std::uint8_t kind = r.u8();
  c.ef_search = r.u64();
  c.hnsw.M = r.u64();
  c.hnsw.ef_construction = r.u64();
  c.hnsw.seed = r.u64();
  bool saved_on_disk = false;
  if (r.version() == kFormatVersionDiskRows) {
    const std::uint8_t where = r.u8();
    if (where > 1) r.fail("invalid vectors code " + std::to_string(where));
    saved_on_disk = where == 1;
  }
  const bool vectors_on_disk = vectors.value_or(saved_on_disk);
  if (c.dim == 0 || c.dim > kMaxDim) r.fail("invalid dimension " + std::to_string(c.dim));
  if (metric > 2) r.fail("invalid metric code " + std::to_string(metric));
  if (kind > 1) r.fail("invalid index kind code " + std::to_string(kind));
  if (c.ef_search == 0 || c.hnsw.M < 2 || c.hnsw.M > kMaxM || c.hnsw.ef_construction == 0 || c.ef_search > kMaxEf ||
      c.hnsw.ef_construction > kMaxEf) {
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
  if (r.version() == kFormatVersionDiskRows) r.skip_padding(kRowAlign);
  // Rows on disk from an aligned (version 4) mapped file are read in place: nothing is copied,
  // and the pages the checks below read leave the resident set once the load is done.
  const bool in_place = vectors_on_disk && r.version() == kFormatVersionDiskRows && r.bytes()->mapped() &&
                        host_little_endian() && c.kind == IndexKind::kHnsw;
  AlignedVector<float> data;
  const float* rows = nullptr;
  if (in_place) {
    r.require(slots * c.dim, sizeof(float));
    rows = reinterpret_cast<const float*>(r.here());
    r.skip(slots * c.dim, sizeof(float));
  } else {
    data.resize(slots * c.dim);
    r.array_into(data.data(), data.size());
    rows = data.data();
  }
  // What add() refuses, load refuses too: the reserved id, NaN or infinity, and (cosine) a
  // zero vector.
  for (std::size_t s = 0; s < slots; ++s) {
    if (live[s] != 1) continue;
    if (ids[s] == -1) r.fail("slot " + std::to_string(s) + " holds the reserved id -1");
    const float* row = rows + s * c.dim;
    if (!all_finite(row, c.dim)) r.fail("vector of id " + std::to_string(ids[s]) + " contains NaN or infinity");
    if (c.metric == Metric::kCosine && !inverse_norm(row, c.dim)) {
      r.fail("vector of id " + std::to_string(ids[s]) + " is all zeros under the cosine metric");
    }
  }
  auto index = std::make_unique<Index>(c);
  if (vectors_on_disk) {
    // Known only once the trailing section is read: rows go to the file now, and the load
    // fails below unless the file is quantized.
    if (c.kind != IndexKind::kHnsw) throw InvalidArgument("vectors='disk' needs quantization='sq8' or 'rabitq'");
    if (!in_place) index->store_.use_disk_rows();
    index->config_.vectors_on_disk = true;
  }
  try {
    if (in_place) {
      index->store_.restore_mapped(std::move(ids), std::move(live), r.bytes(), rows);
    } else {
      index->store_.restore(std::move(ids), std::move(live), std::move(data));
    }
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
    // The quantization section: its kind (SQ8 in version 2, RaBitQ in version 3), re-rank depth
    // and codes must be ones save() writes, and the code count must match the rows (all of
    // them once trained, none before).
    const std::uint8_t q = r.u8();
    const std::uint64_t rerank = r.u64();
    Quantization expected = r.version() == kFormatVersionQuantized ? Quantization::kSq8 : Quantization::kRabitq;
    if (r.version() == kFormatVersionDiskRows && q == static_cast<std::uint8_t>(Quantization::kSq8)) {
      expected = Quantization::kSq8;  // version 4 holds either kind
    }
    if (q != static_cast<std::uint8_t>(expected)) {
      r.fail("invalid quantization code " + std::to_string(q) + " for format version " + std::to_string(r.version()));
    }
    if (!index->graph_) r.fail("quantization section in a flat index");
    if (rerank > kMaxEf) r.fail("invalid re-rank depth " + std::to_string(rerank));
    index->config_.quantization = expected;
    index->config_.rerank = rerank;
    std::size_t codes_held = 0;
    bool trained = false;
    if (expected == Quantization::kSq8) {
      index->codes_ = std::make_unique<Sq8Codes>(c.dim, c.metric);
      index->codes_->load(r);
      codes_held = index->codes_->slot_count();
      trained = index->codes_->trained();
    } else {
      const unsigned bits = r.u8();
      if (bits < kRabitqMinBits || bits > kRabitqMaxBits)
        r.fail("rabitq section: invalid bits " + std::to_string(bits));
      index->config_.rabitq_bits = bits;
      index->rabitq_ = std::make_unique<RabitqCodes>(c.dim, c.metric, bits, c.hnsw.seed);
      index->rabitq_->load(r);
      codes_held = index->rabitq_->slot_count();
      trained = index->rabitq_->trained();
    }
    if (trained ? codes_held != slots : index->store_.size() >= kSq8TrainRows) {
      r.fail(std::string(expected == Quantization::kSq8 ? "sq8" : "rabitq") +
             " section: code count does not match the rows");
    }
  }
  r.expect_end();
  if (r.version() == kFormatVersionDiskRows && !index->quantized()) r.fail("format version 4 without quantization");
  if (vectors_on_disk && !index->quantized()) {
    throw InvalidArgument("vectors='disk' needs a quantized index file (quantization='sq8' or 'rabitq')");
  }
  // The checks above read every page of the file; a file mapping's pages are not anonymous
  // memory, but they need not stay resident either.
  if (in_place) r.bytes()->release_resident();
  return index;
}

}  // namespace kbcore
