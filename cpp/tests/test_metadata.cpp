// Metadata store: ISO-8601 parsing, typed values round trip, UTF-8 validation.

#include <cmath>
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
