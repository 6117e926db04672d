// Crafted index files whose checksum is RECOMPUTED, so that they get past the checksum and
// reach the structural validation of Index::load, HnswIndex::load, MetadataStore::load,
// Bm25Index::load and (version 2 files) the SQ8 section of Sq8Codes::load. Every structural field of a real saved file
// (counts, slots, levels, link targets, flags, metadata and BM25 records) is set to hostile values in turn: each file
// must be rejected with FormatError or load into an index that works and saves back to the same bytes. Never a crash
// (these run under ASan + UBSan), never another exception.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "binary_io.h"
#include "errors.h"
#include "index.h"
#include "test_util.h"

using namespace kbcore_test;

namespace {

constexpr std::size_t kHeader = 32;

/// A file name in memory-backed storage if the system has it (every accepted crafted file is
/// saved again, and save() fsyncs), else in the working directory. Each process gets its own
/// names, so two runs at once (two build trees, a sanitizer build) never share a file.
std::string scratch(const std::string& name) {
  static const std::string tag = std::to_string(std::random_device{}()) + "_";
  const std::string shm = "/dev/shm/" + tag + name;
  if (std::FILE* f = std::fopen(shm.c_str(), "wb")) {
    std::fclose(f);
    return shm;
  }
  return tag + name;
}

struct FieldAt {
  std::string name;
  std::size_t offset;
  std::size_t size;  // 1, 4 or 8
  bool is_float;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::uint64_t get(const std::string& b, std::size_t at, std::size_t size) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < size; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}
void put(std::string& b, std::size_t at, std::size_t size, std::uint64_t v) {
  for (std::size_t i = 0; i < size; ++i) b[at + i] = static_cast<char>(v >> (8 * i));
}

/// The payload checksum recomputed, as BinaryWriter::commit writes it (a block checksum from
/// format version 6 on, checksum64 before).
void reseal(std::string& b) {
  put(b, 16, 8, b.size() - kHeader);
  const bool blocks = get(b, 8, 4) >= kbcore::Index::kFormatVersionBlocks;
  put(b, 24, 8,
      blocks ? kbcore::block_checksum(b.data() + kHeader, b.size() - kHeader)
             : kbcore::checksum64(b.data() + kHeader, b.size() - kHeader));
}

/// Every structural field of a file written by Index::save (the layout of the save()s).
std::vector<FieldAt> parse(const std::string& b) {
  std::vector<FieldAt> out;
  std::size_t pos = kHeader;
  const auto take = [&](const std::string& name, std::size_t size, bool is_float = false) {
    out.push_back({name, pos, size, is_float});
    const std::uint64_t v = get(b, pos, size);
    pos += size;
    return v;
  };
  // Version 7's zero bytes up to a 64-byte file offset (the first of them a field).
  const auto align = [&](const std::string& name) {
    const std::size_t to = (pos + 63) / 64 * 64;
    if (to > pos) take(name, 1);
    pos = to;
  };
  const auto dim = take("dim", 8);
  take("metric", 1);
  const auto kind = take("kind", 1);
  take("ef_search", 8);
  const auto m = take("M", 8);
  take("ef_construction", 8);
  take("seed", 8);
  const auto version = get(b, 8, 4);
  if (version >= kbcore::Index::kFormatVersionDiskRows) take("vectors", 1);
  if (version >= kbcore::Index::kFormatVersionTagged) {
    // The code tag: the type's name, its parameters by name (none for SQ8), the re-rank depth.
    const auto len = take("tag.name.length", 4);
    take("tag.name.byte0", 1);
    pos += len - 1;
    take("tag.params", 4);
    take("sq8.rerank", 8);
  }
  const auto n = take("slots", 8);
  for (std::uint64_t s = 0; s < n; ++s) take("id", 8);
  for (std::uint64_t s = 0; s < n; ++s) take("live", 1);
  if (version >= kbcore::Index::kFormatVersionDiskRows) pos = (pos + 63) / 64 * 64;  // zero padding
  for (std::uint64_t s = 0; s < n; ++s) {
    take("vector", 4, true);
    pos += 4 * (dim - 1);
  }
  if (kind == 0) {
    take("graph.M", 8);
    take("graph.ef_construction", 8);
    take("graph.seed", 8);
    take("graph.entry", 4);
    take("graph.levels_plus_1", 4);
    take("graph.slots", 8);
    std::vector<std::uint64_t> levels;
    for (std::uint64_t s = 0; s < n; ++s) levels.push_back(take("graph.level", 1));
    if (version >= kbcore::Index::kFormatVersionAligned) align("graph.links0.align");
    for (std::uint64_t s = 0; s < n; ++s) {
      take("graph.links0.count", 4);
      for (std::uint64_t j = 0; j < 2 * m; ++j) take("graph.links0.target", 4);
    }
    for (std::uint64_t s = 0; s < n; ++s) {
      for (std::uint64_t l = 0; l < levels[s]; ++l) {
        take("graph.upper.count", 4);
        for (std::uint64_t j = 0; j < m; ++j) take("graph.upper.target", 4);
      }
    }
    for (std::uint64_t s = 0; s < n; ++s) take("graph.pending", 1);
  }
  const auto str = [&](const std::string& name) {
    const auto len = take(name + ".len", 8);
    if (len > 0) take(name + ".byte0", 1);
    if (len > 1) pos += len - 1;
  };
  const auto fields = take("meta.fields", 8);
  for (std::uint64_t f = 0; f < fields; ++f) {
    str("meta.name");
    const auto present = take("meta.present", 8);
    for (std::uint64_t e = 0; e < present; ++e) {
      take("meta.slot", 4);
      const auto vk = take("meta.kind", 1);
      if (vk == 4) {
        str("meta.str");
      } else if (vk == 5) {
        const auto len = take("meta.list.len", 8);
        for (std::uint64_t j = 0; j < len; ++j) str("meta.list.str");
      } else {
        take(vk == 2 ? "meta.float" : "meta.value", 8, false);
      }
    }
  }
  take("bm25.k1", 4, true);
  take("bm25.b", 4, true);
  const auto terms = take("bm25.terms", 8);
  for (std::uint64_t t = 0; t < terms; ++t) str("bm25.term");
  const auto docs = take("bm25.docs", 8);
  for (std::uint64_t d = 0; d < docs; ++d) {
    take("bm25.doc.slot", 4);
    take("bm25.doc.len", 4);
    const auto nt = take("bm25.doc.terms", 8);
    for (std::uint64_t j = 0; j < nt; ++j) {
      take("bm25.doc.term", 4);
      take("bm25.doc.tf", 4);
    }
  }
  if (version >= kbcore::Index::kFormatVersionQuantized) {
    // The quantization section (versions 2 to 4: kind and re-rank depth first, which version 5
    // holds in its code tag), then the quantizer and its codes (the first two bytes and the
    // first padding byte of every code row are fields).
    if (version < kbcore::Index::kFormatVersionTagged) {
      take("sq8.quantization", 1);
      take("sq8.rerank", 8);
    }
    const auto qdim = take("sq8.dim", 8);
    const auto stride = take("sq8.stride", 8);
    const auto trained = take("sq8.trained", 1);
    if (trained) {
      for (std::uint64_t d = 0; d < qdim; ++d) take("sq8.lo", 4, true);
      for (std::uint64_t d = 0; d < qdim; ++d) take("sq8.scale", 4, true);
    }
    const auto codes = take("sq8.slots", 8);
    if (version >= kbcore::Index::kFormatVersionAligned) align("sq8.codes.align");
    for (std::uint64_t s = 0; s < codes; ++s) {
      const std::size_t row = pos;
      take("sq8.code.byte0", 1);
      take("sq8.code.byte1", 1);
      pos = row + qdim;
      if (stride > qdim) take("sq8.code.padding", 1);
      pos = row + stride;
    }
  }
  CHECK(pos == b.size());  // the parser saw every byte
  return out;
}

/// A small hnsw index (M = 2, so upper levels exist) with removals, pending rows, metadata of
/// every kind and texts, saved to path. `quantized`: an SQ8 index (re-rank depth 7) whose
/// quantizer is trained (retrain_quantizer: 40 rows are below the automatic threshold), so
/// the file is version 5 with a code tag and a full SQ8 section.
void save_victim(const std::string& path, kbcore::IndexKind kind, kbcore::Metric metric, bool quantized = false) {
  const std::size_t n = 40, dim = 4;
  kbcore::IndexConfig c = config(dim, kind);
  c.metric = metric;
  c.hnsw.M = 2;
  c.hnsw.ef_construction = 8;
  if (quantized) {
    c.quantization = "sq8";
    c.rerank = 7;
  }
  kbcore::Index index(c);
  const auto x = clustered(n, dim, 41);
  std::vector<std::int64_t> ids(n), ints(n);
  std::vector<double> floats(n);
  std::vector<std::uint8_t> valid(n, 1), bools(n);
  std::string chars;
  std::vector<std::int64_t> str_off = {0}, list_off = {0}, list_str_off = {0};
  std::string list_chars;
  std::vector<std::optional<std::string>> texts(n);
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int64_t>(i);
    ints[i] = static_cast<std::int64_t>(i % 3);
    floats[i] = static_cast<double>(i) / 7;
    bools[i] = i % 2;
    chars += "d" + std::to_string(i % 5);
    str_off.push_back(static_cast<std::int64_t>(chars.size()));
    for (std::size_t j = 0; j < i % 3; ++j) {
      list_chars += j ? "\xC3\xA9" : "a";
      list_str_off.push_back(static_cast<std::int64_t>(list_chars.size()));
    }
    list_off.push_back(static_cast<std::int64_t>(list_str_off.size() - 1));
    if (i % 3) texts[i] = "word" + std::to_string(i % 4) + " common text" + std::to_string(i % 7);
  }
  kbcore::ColumnInput ci = int_column("n", ints, valid), cf, cb, cs, cl;
  cf.name = "x";
  cf.kind = kbcore::ValueKind::kFloat;
  cf.valid = valid.data();
  cf.floats = floats.data();
  cb.name = "ok";
  cb.kind = kbcore::ValueKind::kBool;
  cb.valid = valid.data();
  cb.bools = bools.data();
  cs.name = "doc";
  cs.kind = kbcore::ValueKind::kStr;
  cs.valid = valid.data();
  cs.offsets = str_off.data();
  cs.data = reinterpret_cast<const std::uint8_t*>(chars.data());
  cs.data_len = chars.size();
  cl.name = "tags";
  cl.kind = kbcore::ValueKind::kStrList;
  cl.valid = valid.data();
  cl.list_offsets = list_off.data();
  cl.offsets = list_str_off.data();
  cl.n_strings = list_str_off.size() - 1;
  cl.data = reinterpret_cast<const std::uint8_t*>(list_chars.data());
  cl.data_len = list_chars.size();
  const std::vector<kbcore::ColumnInput> cols = {cs, ci, cf, cb, cl};
  // Rows 30.. go in a second batch (deferred for hnsw: pending rows); then two removals.
  std::vector<kbcore::ColumnInput> first = cols, second = cols;
  std::vector<std::optional<std::string>> t1(texts.begin(), texts.begin() + 30);
  index.add(x.data(), ids.data(), 30, 1, first, &t1);
  for (auto* col : {&second[0], &second[1], &second[2], &second[3], &second[4]}) {
    col->valid += 30;
    if (col->ints) col->ints += 30;
    if (col->floats) col->floats += 30;
    if (col->bools) col->bools += 30;
    if (col->kind == kbcore::ValueKind::kStr) col->offsets += 30;
    if (col->kind == kbcore::ValueKind::kStrList) col->list_offsets += 30;
  }
  // Offsets of a later batch must start at 0: rebase the str and list columns.
  std::vector<std::int64_t> s2(str_off.begin() + 30, str_off.end()), l2(list_off.begin() + 30, list_off.end());
  for (auto& v : s2) v -= str_off[30];
  second[0].offsets = s2.data();
  second[0].data = reinterpret_cast<const std::uint8_t*>(chars.data()) + str_off[30];
  second[0].data_len = chars.size() - static_cast<std::size_t>(str_off[30]);
  std::vector<std::int64_t> ls2(list_str_off.begin() + list_off[30], list_str_off.end());
  for (auto& v : ls2) v -= list_str_off[static_cast<std::size_t>(list_off[30])];
  for (auto& v : l2) v -= list_off[30];
  second[4].list_offsets = l2.data();
  second[4].offsets = ls2.data();
  second[4].n_strings = ls2.size() - 1;
  second[4].data =
      reinterpret_cast<const std::uint8_t*>(list_chars.data()) + list_str_off[static_cast<std::size_t>(list_off[30])];
  second[4].data_len =
      list_chars.size() - static_cast<std::size_t>(list_str_off[static_cast<std::size_t>(list_off[30])]);
  std::vector<std::optional<std::string>> t2(texts.begin() + 30, texts.end());
  index.add(x.data() + 30 * dim, ids.data() + 30, n - 30, 1, second, &t2, kind == kbcore::IndexKind::kHnsw);
  const std::int64_t gone[] = {3, 11};  // slots 3 and 11 become free
  index.remove(gone, 2, 1);
  if (quantized) index.retrain_quantizer(1);
  index.save(path);
}

enum class Outcome { kRejected, kAccepted };

/// Loads a crafted file; an accepted one must search, return its metadata and save back to
/// the same bytes. Anything else fails the test.
Outcome load_and_use(const std::string& path, const std::string& bytes) {
  std::unique_ptr<kbcore::Index> index;
  try {
    index = kbcore::Index::load(path);
  } catch (const kbcore::FormatError&) {
    return Outcome::kRejected;
  }
  const std::vector<float> q(index->dim(), 0.5f);
  std::vector<std::int64_t> out(5);
  std::vector<float> d(5);
  index->search(q.data(), 1, params(5, 0, 1), out.data(), d.data());
  const auto ids = index->ids();
  index->get_metadata(ids.data(), ids.size());
  // The BM25 leg's terms and term lists are checked at its first use (Bm25Index::load_deferred):
  // a bad leg is refused there, after vector search answered, and again at every later use.
  if (throws<kbcore::FormatError>([&] { index->search_text("word1 common", 5); })) {
    CHECK(throws<kbcore::FormatError>([&] { index->search_text("word1 common", 5); }));
    CHECK(throws<kbcore::FormatError>([&] { index->save(path + ".again"); }));
    return Outcome::kRejected;
  }
  // A crafted field name may leave no field "n": that is an InvalidArgument, not a defect.
  if (!ids.empty() &&
      !throws<kbcore::InvalidArgument>([&] { index->search_groups(q.data(), 1, group_params(3, "n", 2, 0, 1)); })) {
    index->search_groups(q.data(), 1, group_params(3, "n", 2, 0, 1));
  }
  const std::string again = path + ".again";
  index->save(again);
  CHECK(read_file(again) == bytes);
  std::remove(again.c_str());
  if (!ids.empty()) {
    index->remove(ids.data(), 1, 1);
    index->search(q.data(), 1, params(5, 0, 1), out.data(), d.data());
  }
  return Outcome::kAccepted;
}

}  // namespace

KBCORE_TEST(every_structural_field_set_to_hostile_values_is_rejected_or_harmless) {
  const std::string victim = scratch("kbcore_test_victim.kbi"), crafted = scratch("kbcore_test_crafted.kbi");
  std::size_t tried = 0, rejected = 0;
  for (int variant = 0; variant < 3; ++variant) {
    const auto kind = variant == 1 ? kbcore::IndexKind::kFlat : kbcore::IndexKind::kHnsw;
    save_victim(victim, kind, kbcore::Metric::kL2, variant == 2);
    if (variant == 2) CHECK(get(read_file(victim), 8, 4) == kbcore::Index::kFormatVersionAligned);
    const std::string good = read_file(victim);
    std::string sealed = good;
    reseal(sealed);
    CHECK(sealed == good);  // the recomputed checksum is the one save() wrote
    CHECK(load_and_use(victim, good) == Outcome::kAccepted);
    const std::vector<FieldAt> fields = parse(good);
    const std::uint64_t n = get(good, fields[7].offset, 8);
    for (const FieldAt& f : fields) {
      const std::uint64_t v = get(good, f.offset, f.size);
      const std::uint64_t max = f.size == 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * f.size)) - 1;
      std::vector<std::uint64_t> values = {0, 1, v - 1, v + 1, n, max, max / 2 + 1};
      if (f.is_float) {
        std::uint32_t nan, inf;
        const float fnan = std::numeric_limits<float>::quiet_NaN(), finf = std::numeric_limits<float>::infinity();
        std::memcpy(&nan, &fnan, 4);
        std::memcpy(&inf, &finf, 4);
        values = {nan, inf, inf | 0x80000000u, 0};
      }
      for (std::uint64_t nv : values) {
        nv &= max;
        if (nv == v) continue;
        std::string bytes = good;
        put(bytes, f.offset, f.size, nv);
        reseal(bytes);
        write_file(crafted, bytes);
        ++tried;
        try {
          rejected += load_and_use(crafted, bytes) == Outcome::kRejected ? 1 : 0;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "  field %s at %zu: %llu -> %llu: %s\n", f.name.c_str(), f.offset,
                       static_cast<unsigned long long>(v), static_cast<unsigned long long>(nv), e.what());
          throw;
        }
      }
    }
  }
  std::printf("  %zu crafted files, %zu rejected with FormatError\n", tried, rejected);
  CHECK(tried > 4500);
  CHECK(rejected > tried / 2);
  std::remove(victim.c_str());
  std::remove(crafted.c_str());
}

KBCORE_TEST(each_structural_defect_is_rejected_with_format_error) {
  const std::string victim = scratch("kbcore_test_victim2.kbi"), crafted = scratch("kbcore_test_crafted2.kbi");
  save_victim(victim, kbcore::IndexKind::kHnsw, kbcore::Metric::kCosine);
  const std::string good = read_file(victim);
  const std::vector<FieldAt> fields = parse(good);
  const auto first = [&](const std::string& name, std::size_t skip = 0) -> const FieldAt& {
    for (const FieldAt& f : fields) {
      if (f.name == name && skip-- == 0) return f;
    }
    throw std::runtime_error("no field " + name);
  };
  const auto rejected = [&](const FieldAt& f, std::uint64_t value) {
    std::string bytes = good;
    put(bytes, f.offset, f.size, value);
    reseal(bytes);
    write_file(crafted, bytes);
    return throws<kbcore::FormatError>([&] { kbcore::Index::load(crafted); });
  };
  // A defect of the BM25 leg's terms or term lists: the load succeeds and vector search
  // answers, the leg's first use throws FormatError (Bm25Index::load_deferred).
  const auto refused_at_first_text_use = [&](const FieldAt& f, std::uint64_t value) {
    std::string bytes = good;
    put(bytes, f.offset, f.size, value);
    reseal(bytes);
    write_file(crafted, bytes);
    const auto index = kbcore::Index::load(crafted);
    const std::vector<float> q(index->dim(), 0.5f);
    std::vector<std::int64_t> out(5);
    std::vector<float> d(5);
    index->search(q.data(), 1, params(5, 0, 1), out.data(), d.data());
    return out[0] != -1 && throws<kbcore::FormatError>([&] { index->search_text("word1 common", 5); }) &&
           throws<kbcore::FormatError>([&] { index->text_stats("word1"); });
  };
  const std::uint64_t n = get(good, first("slots").offset, 8);
  // An upper-level link to a node without that level (it crashed search: a null list).
  std::size_t up = 0;
  std::vector<std::uint64_t> levels;
  for (std::uint64_t s = 0; s < n; ++s) levels.push_back(get(good, first("graph.level", s).offset, 1));
  const FieldAt& upper_count = first("graph.upper.count");
  CHECK(get(good, upper_count.offset, 4) >= 1);
  const FieldAt& upper_target = first("graph.upper.target");
  for (std::uint64_t s = 0; s < n; ++s) {
    if (levels[s] == 0 && get(good, first("live", s).offset, 1) == 1 &&
        get(good, first("graph.pending", s).offset, 1) == 0)
      up = s;
  }
  CHECK(rejected(upper_target, up));
  CHECK(rejected(upper_count, 3));                   // more than M links
  CHECK(rejected(first("graph.links0.target"), n));  // a link past the slots
  CHECK(rejected(first("graph.links0.target"), 3));  // a link to a removed slot
  CHECK(rejected(first("graph.links0.target"), 0));  // self-link (slot 0's own list)
  CHECK(rejected(first("graph.links0.target", 1), get(good, first("graph.links0.target").offset, 4)));  // repeated
  CHECK(rejected(first("graph.levels_plus_1"), 0x80000000u));  // a level count out of range
  CHECK(rejected(first("graph.entry"), 3));                    // entry point on a removed slot
  CHECK(rejected(first("graph.level", 3), 1));                 // a removed slot with a level
  CHECK(rejected(first("graph.pending", 0), 1));               // a linked node flagged pending
  CHECK(rejected(first("graph.pending", 0), 2));
  CHECK(rejected(first("live", 0), 2));
  CHECK(rejected(first("id", 1), get(good, first("id", 0).offset, 8)));             // a repeated id
  CHECK(rejected(first("id", 2), ~std::uint64_t{0}));                               // the reserved id -1
  CHECK(rejected(first("vector", 5), 0x7FC00000u));                                 // NaN
  CHECK(rejected(first("meta.slot", 1), get(good, first("meta.slot").offset, 4)));  // repeated row
  CHECK(rejected(first("meta.slot"), 3));                                           // metadata of a removed slot
  CHECK(rejected(first("meta.kind"), 0));
  CHECK(rejected(first("meta.kind"), 9));
  CHECK(rejected(first("meta.str.byte0"), 0xFF));  // invalid UTF-8
  CHECK(rejected(first("meta.name.byte0"), 0xC3));
  CHECK(rejected(first("meta.present"), get(good, first("meta.present").offset, 8) + 1));
  CHECK(rejected(first("meta.float"), 0x7FF0000000000000ull));  // infinity
  CHECK(rejected(first("bm25.k1"), 0x7F800000u));
  CHECK(rejected(first("bm25.doc.slot"), get(good, first("bm25.doc.slot", 1).offset, 4) + 1));  // out of order
  CHECK(refused_at_first_text_use(first("bm25.doc.len"), 0));
  CHECK(refused_at_first_text_use(first("bm25.doc.tf"), 0));
  CHECK(refused_at_first_text_use(first("bm25.doc.term"), 1u << 30));
  CHECK(rejected(first("bm25.terms"), get(good, first("bm25.terms").offset, 8) + 1));
  CHECK(refused_at_first_text_use(first("bm25.term.byte0"), 0xFF));  // a term that is not UTF-8
  CHECK(refused_at_first_text_use(first("bm25.term.byte0"), 0xC0));
  std::remove(victim.c_str());
  std::remove(crafted.c_str());
}

KBCORE_TEST(each_sq8_section_defect_is_rejected_with_format_error) {
  const std::string victim = scratch("kbcore_test_victim3.kbi"), crafted = scratch("kbcore_test_crafted3.kbi");
  save_victim(victim, kbcore::IndexKind::kHnsw, kbcore::Metric::kL2, true);
  const std::string good = read_file(victim);
  CHECK(load_and_use(victim, good) == Outcome::kAccepted);
  const std::vector<FieldAt> fields = parse(good);
  const auto first = [&](const std::string& name, std::size_t skip = 0) -> const FieldAt& {
    for (const FieldAt& f : fields) {
      if (f.name == name && skip-- == 0) return f;
    }
    throw std::runtime_error("no field " + name);
  };
  const auto rejected_bytes = [&](std::string bytes) {
    reseal(bytes);
    write_file(crafted, bytes);
    return throws<kbcore::FormatError>([&] { kbcore::Index::load(crafted); });
  };
  const auto rejected = [&](const FieldAt& f, std::uint64_t value) {
    std::string bytes = good;
    put(bytes, f.offset, f.size, value);
    return rejected_bytes(bytes);
  };
  const std::uint64_t slots = get(good, first("sq8.slots").offset, 8);
  CHECK(slots == get(good, first("slots").offset, 8));
  CHECK(rejected(first("tag.name.byte0"), 'x'));                // an unknown code type ("xq8")
  CHECK(rejected(first("tag.name.byte0"), ' '));                // a name that is not printable
  CHECK(rejected(first("tag.name.length"), 0));                 // an empty name
  CHECK(rejected(first("tag.name.length"), 0xFFFFFFFFu));       // a name past the file
  CHECK(rejected(first("tag.params"), 1));                      // a parameter SQ8 does not have
  CHECK(rejected(first("tag.params"), 0xFFFFFFFFu));            // a count out of range
  CHECK(rejected(first("sq8.rerank"), (1u << 30) + 1));         // a re-rank depth out of range
  CHECK(rejected(first("sq8.dim"), 5));                         // not the index's dimension
  CHECK(rejected(first("sq8.stride"), 128));                    // not the dimension's stride
  CHECK(rejected(first("sq8.trained"), 2));                     // a flag other than 0 / 1
  CHECK(rejected(first("sq8.trained"), 0));                     // then lo / scale are read as codes
  CHECK(rejected(first("sq8.slots"), slots - 1));               // fewer codes than rows
  CHECK(rejected(first("sq8.slots"), 0));                       // a trained quantizer without codes
  CHECK(rejected(first("sq8.slots"), ~std::uint64_t{0}));       // a count past the file
  CHECK(rejected(first("sq8.slots"), std::uint64_t{1} << 58));  // count * stride wraps
  CHECK(rejected(first("sq8.code.padding", 2), 1));             // a nonzero padding byte
  CHECK(rejected(first("sq8.lo", 1), 0x7FC00000u));             // NaN
  CHECK(rejected(first("sq8.lo"), 0x7F800000u));                // infinity
  CHECK(rejected(first("sq8.scale", 2), 0xBF800000u));          // negative (-1)
  CHECK(rejected(first("sq8.scale"), 0x7F7FFFFFu));             // lo + 255 * scale overflows
  // The header's version must match the sections present: a v5 file labelled v1, v2 or v4
  // does not parse, a v1 file labelled v2 lacks its section, and v6 is from a newer kbcore.
  for (const std::uint32_t v : {kbcore::Index::kFormatVersion, kbcore::Index::kFormatVersionQuantized,
                                kbcore::Index::kFormatVersionDiskRows, kbcore::Index::kFormatVersionAligned + 1}) {
    std::string relabelled = good;
    put(relabelled, 8, 4, v);
    CHECK(rejected_bytes(relabelled));
  }
  save_victim(victim, kbcore::IndexKind::kHnsw, kbcore::Metric::kL2, false);
  std::string plain = read_file(victim);
  CHECK(get(plain, 8, 4) == kbcore::Index::kFormatVersion);
  put(plain, 8, 4, kbcore::Index::kFormatVersionQuantized);
  CHECK(rejected_bytes(plain));
  // A flat index never has the section: a version-2 section (kind 1, depth 0, then the same
  // SQ8 codes) after a flat index is refused.
  save_victim(victim, kbcore::IndexKind::kFlat, kbcore::Metric::kL2, false);
  std::string flat = read_file(victim);
  flat += std::string(1, '\x01') + std::string(8, '\0') + good.substr(first("sq8.dim").offset);
  put(flat, 8, 4, kbcore::Index::kFormatVersionQuantized);
  CHECK(rejected_bytes(flat));
  // vectors='disk' needs a quantized file (InvalidArgument, not a format defect).
  write_file(crafted, read_file(victim));
  CHECK(throws<kbcore::InvalidArgument>([&] { kbcore::Index::load(crafted, true); }));
  std::remove(victim.c_str());
  std::remove(crafted.c_str());
}

KBCORE_TEST(each_disk_rows_defect_is_rejected_with_format_error) {
  // Format version 5 (as version 4 before it): a vectors byte after the parameters, zero
  // padding to a 64-byte file offset, then the rows, which load reads in place from the mapped
  // file.
  const std::string victim = scratch("kbcore_test_victim4.kbi"), crafted = scratch("kbcore_test_crafted4.kbi");
  save_victim(victim, kbcore::IndexKind::kHnsw, kbcore::Metric::kL2, true);
  kbcore::Index::load(victim, true)->save(victim);
  const std::string good = read_file(victim);
  CHECK(get(good, 8, 4) == kbcore::Index::kFormatVersionAligned);
  CHECK(load_and_use(victim, good) == Outcome::kAccepted);
  CHECK(kbcore::Index::load(victim)->config().vectors_on_disk);
  CHECK(!kbcore::Index::load(victim, false)->config().vectors_on_disk);
  const auto rejected_bytes = [&](std::string bytes) {
    reseal(bytes);
    write_file(crafted, bytes);
    return throws<kbcore::FormatError>([&] { kbcore::Index::load(crafted); });
  };
  const std::size_t vectors_at = kHeader + 8 + 1 + 1 + 4 * 8;  // after dim, metric, kind, ef, M, efC, seed
  CHECK(get(good, vectors_at, 1) == 1);
  const std::vector<FieldAt> fields = parse(good);
  std::size_t slots_at = 0;
  for (const FieldAt& f : fields) {
    if (f.name == "slots") slots_at = f.offset;
  }
  CHECK(slots_at > vectors_at + 1);  // the code tag between them
  const std::size_t slots = get(good, slots_at, 8);
  const std::size_t pad_at = slots_at + 8 + slots * 9;
  const std::size_t rows_at = (pad_at + 63) / 64 * 64;
  CHECK(rows_at > pad_at);
  for (std::size_t i = pad_at; i < rows_at; ++i) CHECK(good[i] == 0);
  std::string bad = good;
  put(bad, vectors_at, 1, 2);  // an unknown vectors code
  CHECK(rejected_bytes(bad));
  bad = good;
  put(bad, rows_at - 1, 1, 1);  // a nonzero padding byte
  CHECK(rejected_bytes(bad));
  bad = good;
  put(bad, 8, 4, kbcore::Index::kFormatVersionQuantized);  // v5 bytes labelled v2
  CHECK(rejected_bytes(bad));
  bad = good;
  put(bad, rows_at, 4, 0x7FC00000u);  // a NaN in a row read in place
  CHECK(rejected_bytes(bad));
  bad = good;
  put(bad, 8, 4, kbcore::Index::kFormatVersionAligned + 1);  // from a newer kbcore
  CHECK(rejected_bytes(bad));
  std::remove(victim.c_str());
  std::remove(crafted.c_str());
}
