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

}  // namespace

void Index::save(const std::string& path) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  BinaryWriter w(path, kMagic, codes_ ? kFormatVersionQuantized : rabitq_ ? kFormatVersionRabitq : kFormatVersion);
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
  if (quantized()) {
    // Versions 2 (SQ8) and 3 (RaBitQ): the quantization section (kind, re-rank depth,
    // quantizer and codes).
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

std::unique_ptr<Index> Index::load(const std::string& path, bool vectors_on_disk) {
  BinaryReader r(path, kMagic, kFormatVersionRabitq);
  IndexConfig c;
  c.dim = r.u64();
  const std::uint8_t metric = r.u8();
  const std::uint8_t kind = r.u8();
  c.ef_search = r.u64();
  c.hnsw.M = r.u64();
  c.hnsw.ef_construction = r.u64();
  c.hnsw.seed = r.u64();
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
  AlignedVector<float> data(slots * c.dim);
  r.array_into(data.data(), data.size());
  // What add() refuses, load refuses too: the reserved id, NaN or infinity, and (cosine) a
  // zero vector.
  for (std::size_t s = 0; s < slots; ++s) {
    if (live[s] != 1) continue;
    if (ids[s] == -1) r.fail("slot " + std::to_string(s) + " holds the reserved id -1");
    const float* row = data.data() + s * c.dim;
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
    // The quantization section: its kind (SQ8 in version 2, RaBitQ in version 3), re-rank depth
    // and codes must be ones save() writes, and the code count must match the rows (all of
    // them once trained, none before).
    const std::uint8_t q = r.u8();
    const std::uint64_t rerank = r.u64();
    const Quantization expected = r.version() == kFormatVersionQuantized ? Quantization::kSq8 : Quantization::kRabitq;
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
  if (vectors_on_disk && !index->quantized()) {
    throw InvalidArgument("vectors='disk' needs a quantized index file (quantization='sq8' or 'rabitq')");
  }
  return index;
}

}  // namespace kbcore
