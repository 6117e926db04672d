// Metadata store: ISO-8601 parsing, typed values round trip, UTF-8 validation.

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "errors.h"
#include "metadata_store.h"
#include "string_dict.h"
#include "test_util.h"

using namespace kbcore_test;

KBCORE_TEST(iso8601) {
  CHECK(kbcore::parse_iso8601("1970-01-01").value() == 0.0);
  CHECK(kbcore::parse_iso8601("2024-02-29T12:00:00Z").value() == 1709208000.0);
  CHECK(kbcore::parse_iso8601("2024-02-29T14:00:00+02:00").value() == 1709208000.0);
  CHECK(!kbcore::parse_iso8601("2023-02-29"));
  CHECK(!kbcore::parse_iso8601("not a date"));
  CHECK(!kbcore::parse_iso8601("2024-01-01T25:00"));
}

KBCORE_TEST(utf8_validation_matches_the_strict_decoder) {
  using kbcore::is_valid_utf8;
  CHECK(is_valid_utf8(""));
  CHECK(is_valid_utf8("plain ascii"));
  CHECK(is_valid_utf8("\xC3\xA9"));          // é
  CHECK(is_valid_utf8("\xE2\x82\xAC"));      // €
  CHECK(is_valid_utf8("\xF0\x9F\x98\x80"));  // U+1F600
  CHECK(is_valid_utf8("\xF4\x8F\xBF\xBF"));  // U+10FFFF
  CHECK(!is_valid_utf8("\xFF"));
  CHECK(!is_valid_utf8("\xC3"));              // truncated
  CHECK(!is_valid_utf8("\xC0\xAF"));          // overlong
  CHECK(!is_valid_utf8("\xE0\x80\xAF"));      // overlong
  CHECK(!is_valid_utf8("\xED\xA0\x80"));      // surrogate
  CHECK(!is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  CHECK(!is_valid_utf8("\xC3\x28"));          // bad continuation
  CHECK(!is_valid_utf8("\xE2\x82"));          // truncated
}

KBCORE_TEST(metadata_values_of_every_kind_round_trip_and_clear) {
  using namespace kbcore;
  const std::size_t n = 4;
  std::vector<std::uint8_t> valid = {1, 1, 0, 1};
  std::vector<std::int64_t> ints = {-5, 7, 0, 1LL << 40};
  std::vector<double> floats = {0.5, -1.25, 0, 3};
  std::vector<std::uint8_t> bools = {1, 0, 0, 1};
  const std::string chars = "abcxyz";
  std::vector<std::int64_t> str_off = {0, 1, 3, 3, 6};
  ColumnInput ci = int_column("i", ints, valid);
  ColumnInput cf;
  cf.name = "f";
  cf.kind = ValueKind::kFloat;
  cf.valid = valid.data();
  cf.floats = floats.data();
  ColumnInput cb;
  cb.name = "b";
  cb.kind = ValueKind::kBool;
  cb.valid = valid.data();
  cb.bools = bools.data();
  ColumnInput cs;
  cs.name = "s";
  cs.kind = ValueKind::kStr;
  cs.valid = valid.data();
  cs.offsets = str_off.data();
  cs.data = reinterpret_cast<const std::uint8_t*>(chars.data());
  cs.data_len = chars.size();
  MetadataStore::validate({ci, cf, cb, cs}, n);
  MetadataStore meta;
  meta.grow(n);
  meta.assign({0, 1, 2, 3}, {ci, cf, cb, cs});
  const auto row = meta.row(3);
  CHECK(row.size() == 4);
  CHECK(row[0].first == "i" && row[0].second.i == (1LL << 40));
  CHECK(row[1].second.f == 3.0);
  CHECK(row[2].second.b);
  CHECK(row[3].second.s == "xyz");
  CHECK(meta.row(2).empty());
  meta.clear(3);
  CHECK(meta.row(3).empty());
  CHECK(meta.row(1)[3].second.s == "bc");
  // validate names the problem and changes nothing.
  floats[1] = NAN;
  CHECK(throws<InvalidArgument>([&] { MetadataStore::validate({cf}, n); }));
}

namespace {

// A str column over rows given as (valid, text); a str-list column over rows of lists.
struct StrColumn {
  std::vector<std::uint8_t> valid;
  std::vector<std::int64_t> offsets{0};
  std::string chars;
  kbcore::ColumnInput input(const std::string& name) const {
    kbcore::ColumnInput c;
    c.name = name;
    c.kind = kbcore::ValueKind::kStr;
    c.valid = valid.data();
    c.offsets = offsets.data();
    c.data = reinterpret_cast<const std::uint8_t*>(chars.data());
    c.data_len = chars.size();
    return c;
  }
};

struct ListColumn {
  std::vector<std::uint8_t> valid;
  std::vector<std::int64_t> list_offsets{0};
  std::vector<std::int64_t> offsets{0};
  std::string chars;
  kbcore::ColumnInput input(const std::string& name) const {
    kbcore::ColumnInput c;
    c.name = name;
    c.kind = kbcore::ValueKind::kStrList;
    c.valid = valid.data();
    c.list_offsets = list_offsets.data();
    c.offsets = offsets.data();
    c.n_strings = offsets.size() - 1;
    c.data = reinterpret_cast<const std::uint8_t*>(chars.data());
    c.data_len = chars.size();
    return c;
  }
};

template <typename K>
std::vector<std::pair<K, kbcore::Slot>> to_vector(kbcore::Entries<K> e) {
  return std::vector<std::pair<K, kbcore::Slot>>(e.begin(), e.end());
}

}  // namespace

KBCORE_TEST(field_index_views_match_a_scan_of_the_values_and_follow_writes) {
  using namespace kbcore;
  std::mt19937 rng(15);
  const std::size_t n = 300;
  std::vector<std::uint8_t> int_valid(n);
  std::vector<std::int64_t> ints(n);
  std::vector<double> floats(n);
  std::vector<std::uint8_t> float_valid(n);
  StrColumn strs;
  ListColumn lists;
  const char* words[] = {"a", "b", "c", "d"};
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned r = rng() % 4;  // 0: int row, 1: float row, 2: str row, 3: missing
    int_valid[i] = r == 0;
    ints[i] = static_cast<std::int64_t>(rng() % 21) - 10;
    float_valid[i] = r == 1;
    floats[i] = static_cast<double>(rng() % 41) / 4 - 5;
    strs.valid.push_back(r == 2);
    if (r == 2) strs.chars += words[rng() % 4];
    strs.offsets.push_back(static_cast<std::int64_t>(strs.chars.size()));
    const bool has_list = rng() % 2 == 0;
    lists.valid.push_back(has_list);
    if (has_list) {
      const unsigned len = rng() % 3;
      for (unsigned j = 0; j < len; ++j) {
        lists.chars += words[rng() % 4];
        lists.offsets.push_back(static_cast<std::int64_t>(lists.chars.size()));
      }
    }
    lists.list_offsets.push_back(static_cast<std::int64_t>(lists.offsets.size() - 1));
  }
  ColumnInput cf;
  cf.name = "v";
  cf.kind = ValueKind::kFloat;
  cf.valid = float_valid.data();
  cf.floats = floats.data();
  const std::vector<ColumnInput> cols = {int_column("v", ints, int_valid), cf, strs.input("v"), lists.input("t")};
  MetadataStore::validate(cols, n);
  MetadataStore meta;
  std::vector<Slot> slots(n);
  for (std::size_t i = 0; i < n; ++i) slots[i] = static_cast<Slot>(i);
  meta.assign(slots, cols);
  const Field* v = meta.field("v");
  CHECK(v != nullptr && v->name() == "v");
  std::size_t present = 0;
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(v->present(static_cast<Slot>(i)) == (int_valid[i] || float_valid[i] || strs.valid[i]));
    present += v->present(static_cast<Slot>(i)) ? 1 : 0;
  }
  CHECK(v->present_count() == present);
  const FieldIndex& idx = v->index();
  // Ranges against a scan, ascending by (value, slot).
  for (std::int64_t lo = -11; lo <= 11; lo += 3) {
    for (std::int64_t hi = lo - 1; hi <= 11; hi += 4) {
      std::vector<std::pair<std::int64_t, Slot>> want;
      for (std::size_t i = 0; i < n; ++i) {
        if (int_valid[i] && ints[i] >= lo && ints[i] <= hi) want.push_back({ints[i], static_cast<Slot>(i)});
      }
      std::sort(want.begin(), want.end());
      CHECK(to_vector(idx.ints_between(lo, hi)) == want);
      std::vector<std::pair<double, Slot>> fwant;
      const double flo = static_cast<double>(lo) / 2, fhi = static_cast<double>(hi) / 2;
      for (std::size_t i = 0; i < n; ++i) {
        if (float_valid[i] && floats[i] >= flo && floats[i] <= fhi) fwant.push_back({floats[i], static_cast<Slot>(i)});
      }
      std::sort(fwant.begin(), fwant.end());
      CHECK(to_vector(idx.floats_between(flo, fhi)) == fwant);
    }
  }
  CHECK(idx.has_ints() && idx.has_floats() && idx.bool_entries(true).empty());
  // str runs: ids ascending, each run's rows hold that id, together every str row once.
  std::size_t str_rows = 0;
  for (std::size_t r = 0; r < idx.str_runs().size(); ++r) {
    const StrRun& run = idx.str_runs()[r];
    CHECK(r == 0 || idx.str_runs()[r - 1].id < run.id);
    CHECK(to_vector(run.rows) == to_vector(idx.str_entries(run.id)));
    for (const auto& e : run.rows) CHECK(v->kinds()[e.second] == 4 && v->str_id(e.second) == run.id);
    str_rows += run.rows.size();
  }
  CHECK(str_rows == idx.all_strs().size());
  CHECK(str_rows == static_cast<std::size_t>(std::count(strs.valid.begin(), strs.valid.end(), 1)));
  // list entries: the rows whose list holds the word, each once.
  const Field* t = meta.field("t");
  for (const char* w : words) {
    const auto id = meta.dict().find(w);
    CHECK(id.has_value());
    std::vector<std::pair<std::uint32_t, Slot>> want;
    for (std::size_t i = 0; i < n; ++i) {
      if (!lists.valid[i]) continue;
      const auto& l = t->list_at(static_cast<Slot>(i));
      if (std::find(l.begin(), l.end(), *id) != l.end()) want.push_back({*id, static_cast<Slot>(i)});
    }
    CHECK(!want.empty());
    CHECK(to_vector(t->index().list_entries(*id)) == want);
  }
  // A write bumps the version and the next index() reflects it.
  const std::uint64_t before = v->version();
  Slot int_slot = kNoSlot;
  for (std::size_t i = 0; i < n && int_slot == kNoSlot; ++i) {
    if (int_valid[i]) int_slot = static_cast<Slot>(i);
  }
  const std::size_t all_ints = v->index().ints_between(-100, 100).size();
  meta.clear(int_slot);
  CHECK(v->version() > before);
  CHECK(v->index().ints_between(-100, 100).size() == all_ints - 1);
  CHECK(!v->present(int_slot) && v->present_count() == present - 1);
}
