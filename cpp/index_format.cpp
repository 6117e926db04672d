// Index::save and Index::load: the single-file format (binary_io.h) of an index, and the
// validation that a loaded file is one save() could have written.
#include "index.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "binary_io.h"
#include "code_types.h"
#include "errors.h"
#include "parallel.h"
#include "vector_checks.h"

namespace kbcore {
namespace {

constexpr char kMagic[8] = {'K', 'B', 'C', 'O', 'R', 'E', 'I', 'X'};
// Version 4 (vectors='disk') aligns the float32 rows to this file offset, so that load can
// read them in place from the mapped file.
constexpr std::size_t kRowAlign = 64;
// The longest code type or parameter name a file's code tag may hold.
constexpr std::size_t kMaxTagName = 64;

void write_name(BinaryWriter& w, const std::string& name) {
  w.u32(static_cast<std::uint32_t>(name.size()));
  w.array(reinterpret_cast<const std::uint8_t*>(name.data()), name.size());
}

std::string read_name(BinaryReader& r, const char* what) {
  const std::uint32_t n = r.u32();
  if (n == 0 || n > kMaxTagName) r.fail(std::string("invalid ") + what + " length " + std::to_string(n));
  std::vector<std::uint8_t> bytes;
  r.array(bytes, n);
  for (std::uint8_t b : bytes) {
    if (b < 0x21 || b > 0x7e) r.fail(std::string("invalid byte in ") + what);
  }
  return std::string(bytes.begin(), bytes.end());
}

/// The code type tag of a quantized file: the type's name and parameters. Version 5 stores
/// them by name; versions 2 to 4 by the type's legacy id, its parameters as one byte each (in
/// declaration order) just before the codes.
struct CodeTag {
  std::string type;
  CodeParamValues params;
};

CodeTag read_tag(BinaryReader& r) {
  CodeTag t;
  t.type = read_name(r, "code type name");
  if (!is_code_type(t.type)) {
    r.fail("unknown code type '" + t.type + "' (this build knows " + code_type_names() +
           "; a newer kbcore may read it)");
  }
  const std::uint32_t count = r.u32();
  if (count > 16) r.fail("invalid code parameter count " + std::to_string(count));
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string name = read_name(r, "code parameter name");
    const std::int64_t value = r.i64();
    for (const auto& [n, v] : t.params) {
      if (n == name) r.fail("code parameter '" + name + "' repeated");
    }
    t.params.emplace_back(std::move(name), value);
  }
  t.params = resolve_code_params(t.type, t.params, [&](const std::string& m) { r.fail(t.type + " section: " + m); });
  return t;
}

CodeTag read_legacy_tag(BinaryReader& r, std::uint8_t id) {
  CodeTag t;
  for_each_code_type([&](auto type) {
    using Traits = CodeTraits<typename decltype(type)::type>;
    if (Traits::kLegacyId != 0 && Traits::kLegacyId == id) t.type = Traits::kName;
  });
  const bool allowed = r.version() == Index::kFormatVersionDiskRows ||
                       (r.version() == Index::kFormatVersionQuantized && t.type == "sq8") ||
                       (r.version() == Index::kFormatVersionRabitq && t.type == "rabitq");
  if (t.type.empty() || !allowed) {
    r.fail("invalid quantization code " + std::to_string(id) + " for format version " + std::to_string(r.version()));
  }
  return t;
}

}  // namespace

void Index::save(const std::string& path) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  // A quantized index writes version 7 (its code type tagged by name, the payload block-
  // checksummed, the codes aligned); an index without quantization the bytes earlier releases wrote (version 1).
  const bool tagged = quantized();
  BinaryWriter w(path, kMagic, tagged ? kFormatVersionAligned : kFormatVersion,
                 tagged ? PayloadChecksum::kBlocks : PayloadChecksum::kWords);
  w.u64(config_.dim);
  w.u8(static_cast<std::uint8_t>(config_.metric));
  w.u8(static_cast<std::uint8_t>(config_.kind));
  w.u64(config_.ef_search);
  w.u64(config_.hnsw.M);
  w.u64(config_.hnsw.ef_construction);
  w.u64(config_.hnsw.seed);
  if (tagged) {
    w.u8(config_.vectors_on_disk ? 1 : 0);  // where the rows live (1: disk)
    // The code tag: the type's name, its parameters by name, the re-rank depth.
    write_name(w, code_type_name(*codes_));
    const CodeParamValues params =
        std::visit([](const auto& c) { return CodeTraits<std::decay_t<decltype(c)>>::values(c); }, *codes_);
    w.u32(static_cast<std::uint32_t>(params.size()));
    for (const auto& [name, value] : params) {
      write_name(w, name);
      w.i64(value);
    }
    w.u64(config_.rerank);
  }
  const std::size_t slots = store_.slot_count();
  w.u64(slots);
  w.array(store_.slot_ids().data(), slots);
  w.array(store_.live_flags().data(), slots);
  if (tagged) w.pad_to(kRowAlign);
  w.array(store_.data(), slots * config_.dim);
  if (graph_) graph_->save(w);
  meta_.save(w, store_);
  text_.save(w);
  if (tagged) std::visit([&](const auto& c) { c.save(w); }, *codes_);  // the codes, last
  w.commit();
  store_.release_resident_rows();
}

std::unique_ptr<Index> Index::load(const std::string& path, std::optional<bool> vectors, bool in_place) {
  // The payload checksum is computed on a second thread while the sections below are parsed
  // and checked (every read bounds-checked, as for any untrusted bytes): the index is returned,
  // and any error other than the checksum's reported, only once the checksum matches.
  BinaryReader r(path, kMagic, kFormatVersionAligned, BinaryReader::Checksum::kAlongside, kFormatVersionBlocks);
  try {
    std::unique_ptr<Index> index = load_sections(r, vectors);
    r.verify();
    if (!in_place) {
      // The first mutable access copies each section read in place to the heap.
      VectorStore& store = index->store_;
      if (store.rows_in_place() && !store.rows_on_disk()) store.copy_rows_to_heap();
      if (index->graph_) index->graph_->copy_links_to_heap();
      if (index->codes_) std::visit([](auto& c) { c.copy_codes_to_heap(); }, *index->codes_);
    }
    // The checks read every page of the file; a file mapping's pages are not anonymous memory,
    // but they need not stay resident either, whether the mapping lives on (rows on disk used in
    // place, a BM25 section not built yet) or not; rows in memory used in place stay.
    // Codes and level-0 lists read in place stay too (a search reads them on every hop).
    if (r.bytes()->mapped()) {
      const VectorStore& store = index->store_;
      std::vector<std::pair<const void*, std::size_t>> keep;
      if (store.rows_in_place() && !store.rows_on_disk()) {
        keep.emplace_back(store.data(), store.slot_count() * store.dim() * sizeof(float));
      }
      if (index->graph_ && index->graph_->links_in_place()) keep.push_back(index->graph_->level0_bytes());
      if (index->codes_) {
        std::visit(
            [&](const auto& c) {
              if (c.codes_in_place()) keep.emplace_back(c.code(0), c.slot_count() * c.stride());
            },
            *index->codes_);
      }
      if (keep.empty()) {
        r.bytes()->release_resident();
      } else {
        r.bytes()->release_resident_except(std::move(keep));
      }
    }
    return index;
  } catch (...) {
    r.verify();
    throw;
  }
}

bool Index::codes_in_place() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return codes_ && std::visit([](const auto& c) { return c.codes_in_place(); }, *codes_);
}

bool Index::links_in_place() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return graph_ && graph_->links_in_place();
}

std::unique_ptr<Index> Index::load_sections(BinaryReader& r, std::optional<bool> vectors) {
  IndexConfig c;
  c.dim = r.u64();
  const std::uint8_t metric = r.u8();
  const std::uint8_t kind = r.u8();
  c.ef_search = r.u64();
  c.hnsw.M = r.u64();
  c.hnsw.ef_construction = r.u64();
  c.hnsw.seed = r.u64();
  // Versions 4 and 5: where the rows live and the rows aligned (mapped in place on load).
  const bool aligned = r.version() >= kFormatVersionDiskRows;
  bool saved_on_disk = false;
  if (aligned) {
    const std::uint8_t where = r.u8();
    if (where > 1) r.fail("invalid vectors code " + std::to_string(where));
    saved_on_disk = where == 1;
  }
  std::optional<CodeTag> tag;
  std::uint64_t rerank = 0;
  if (r.version() >= kFormatVersionTagged) {
    tag = read_tag(r);
    rerank = r.u64();
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
  if (aligned) r.skip_padding(kRowAlign);
  // Rows from an aligned (version 4 to 6) mapped file are read in place: nothing is copied. Rows
  // on disk leave the resident set once the load is done; rows in memory stay mapped, and the
  // first write copies them to the heap (row_buffer.h): a reopen neither copies 4 bytes per
  // dimension per row nor has the kernel zero the pages of a copy.
  const bool in_place = aligned && r.bytes()->mapped() && host_little_endian() && c.kind == IndexKind::kHnsw;
  AlignedVector<float> data;
  const float* rows = nullptr;
  // What add() refuses, load refuses too: the reserved id, NaN or infinity, and (cosine) a
  // zero vector.
  const auto check_rows = [&](std::size_t begin, std::size_t end) {
    for (std::size_t s = begin; s < end; ++s) {
      if (live[s] != 1) continue;
      if (ids[s] == -1) r.fail("slot " + std::to_string(s) + " holds the reserved id -1");
      const RowCheck row = check_row(rows + s * c.dim, c.dim);
      if (!row.finite) r.fail("vector of id " + std::to_string(ids[s]) + " contains NaN or infinity");
      if (c.metric == Metric::kCosine && !row.nonzero) {
        r.fail("vector of id " + std::to_string(ids[s]) + " is all zeros under the cosine metric");
      }
    }
  };
  // Rows are copied (unless used in place) and checked a block at a time, so that the checks
  // read rows still in cache instead of a second pass over all of them from memory; blocks go
  // to the hardware's threads once the rows pass 4 MiB (first exception rethrown here).
  constexpr std::size_t kBlockRows = 256;
  const std::size_t blocks = (slots + kBlockRows - 1) / kBlockRows;
  const std::size_t threads = slots * c.dim * sizeof(float) >= (std::size_t{4} << 20) ? 0 : 1;
  r.require(slots * c.dim, sizeof(float));
  if (in_place) {
    rows = reinterpret_cast<const float*>(r.here());
    r.skip(slots * c.dim, sizeof(float));
    parallel_for(blocks, threads, [&](std::size_t b, std::size_t) {
      check_rows(b * kBlockRows, std::min<std::size_t>(slots, (b + 1) * kBlockRows));
    });
  } else if (host_little_endian()) {
    data.resize(slots * c.dim);
    rows = data.data();
    const unsigned char* src = r.here();
    r.skip(slots * c.dim, sizeof(float));
    parallel_for(blocks, threads, [&](std::size_t b, std::size_t) {
      const std::size_t begin = b * kBlockRows;
      const std::size_t end = std::min<std::size_t>(slots, begin + kBlockRows);
      std::memcpy(data.data() + begin * c.dim, src + begin * c.dim * sizeof(float),
                  (end - begin) * c.dim * sizeof(float));
      check_rows(begin, end);
    });
  } else {
    data.resize(slots * c.dim);
    rows = data.data();
    for (std::size_t s = 0; s < slots; s += kBlockRows) {
      const std::size_t end = std::min<std::size_t>(slots, s + kBlockRows);
      r.array_into(data.data() + s * c.dim, (end - s) * c.dim);  // byte-swapped
      check_rows(s, end);
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
      index->store_.restore_mapped(std::move(ids), std::move(live), r.bytes(), rows, vectors_on_disk);
    } else {
      index->store_.restore(std::move(ids), std::move(live), std::move(data));
    }
  } catch (const FormatError& e) {
    r.fail(e.what());
  }
  // HnswIndex::load sets every per-slot array itself (no grow() first: it would allocate and
  // zero level-0 lists that the mapped ones replace).
  if (index->graph_) index->graph_->load(r);
  index->meta_.load(r, index->store_);
  index->text_.load_deferred(r, index->store_);
  if (r.version() >= kFormatVersionQuantized && r.version() < kFormatVersionTagged) {
    // Versions 2 to 4: the trailing quantization section (the type's legacy id, the re-rank
    // depth, its parameters one byte each).
    const std::uint8_t q = r.u8();
    rerank = r.u64();
    tag = read_legacy_tag(r, q);
    CodeParamValues given;
    for_each_code_type([&](auto type) {
      using Traits = CodeTraits<typename decltype(type)::type>;
      if (tag->type != Traits::kName) return;
      for (const CodeParam& p : Traits::params()) given.emplace_back(p.name, r.u8());
    });
    tag->params =
        resolve_code_params(tag->type, given, [&](const std::string& m) { r.fail(tag->type + " section: " + m); });
  }
  if (tag) {
    // The codes (their type and parameters from the tag) must be ones save() writes, and the
    // code count must match the rows (all of them once trained, none before).
    if (!index->graph_) r.fail("quantization section in a flat index");
    if (rerank > kMaxEf) r.fail("invalid re-rank depth " + std::to_string(rerank));
    index->config_.quantization = tag->type;
    index->config_.code_params = tag->params;
    index->config_.rerank = rerank;
    index->codes_ = std::make_unique<CodeStore>(make_code_store(tag->type, c.dim, c.metric, c.hnsw.seed, tag->params));
    std::visit(
        [&](auto& codes) {
          codes.load(r);
          if (codes.trained() ? codes.slot_count() != slots : index->store_.size() >= index->train_rows()) {
            r.fail(tag->type + " section: code count does not match the rows");
          }
        },
        *index->codes_);
  }
  r.expect_end();
  if (aligned && !index->quantized()) {
    r.fail("format version " + std::to_string(r.version()) + " without quantization");
  }
  if (vectors_on_disk && !index->quantized()) {
    throw InvalidArgument("vectors='disk' needs a quantized index file (quantization='sq8' or 'rabitq')");
  }
  return index;
}

}  // namespace kbcore
