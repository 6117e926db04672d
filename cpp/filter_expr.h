#pragma once
// A compiled metadata filter (the IR of docs/filter-ir.md) and its evaluation to a Bitmap of
// passing slots. Evaluation uses each field's sorted indexes, so equality, ranges and
// membership cost O(log n + matches); negations complement against the live rows.
#include <cstdint>
#include <string>
#include <vector>

#include "bitmap.h"
#include "metadata_store.h"

namespace kbcore {

enum class FilterOp : std::uint8_t {
  kEq,
  kNe,
  kGt,
  kGte,
  kLt,
  kLte,
  kIn,
  kNin,
  kContains,
  kNotContains,
  kStartsWith,
  kEndsWith,
  kExists,
  kEmpty,
  kBefore,
  kAfter
};

/// Parses an IR operator name ("eq", "not_contains", ...); throws InvalidArgument.
FilterOp parse_filter_op(const std::string& name);

/// One operand value: an int, a float, a bool or a string.
struct Operand {
  ValueKind kind = ValueKind::kMissing;  // kInt, kFloat, kBool or kStr
  std::int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
};

/// A filter tree node: an AND / OR of children, or a comparison of one field.
struct FilterNode {
  enum class Type : std::uint8_t { kAnd, kOr, kCmp };
  Type type = Type::kCmp;
  std::vector<FilterNode> children;  // kAnd, kOr
  std::string field;                 // kCmp
  FilterOp op = FilterOp::kEq;       // kCmp
  std::vector<Operand> operands;     // kCmp: one, or the list of $in / $nin
};

/// Checks operand kinds against the operator (a defensive re-check of what Python compiled).
void validate_filter(const FilterNode& node);

/// Slots (among `live`) whose metadata passes `node`. O(matches + log n) per indexed leaf;
/// O(n) for exists / empty and for negations. Thread-safe for concurrent readers.
Bitmap evaluate_filter(const FilterNode& node, const MetadataStore& meta, const Bitmap& live);

/// The live rows that pass a filter: their number, and the passing slots as a bitmap over all
/// slots and/or as a list, whichever the evaluation produced; the other form is
/// derived on demand. A filtered search wants the list for an exact scan of the passing rows
/// and the bitmap for a filtered graph walk.
struct FilterMatches {
  std::size_t count = 0;  // passing live rows
  std::size_t slots = 0;  // bitmap size (every slot, live or not)
  bool has_bitmap = false;
  Bitmap bitmap;  // valid when has_bitmap: bit s set iff slot s passes
  bool has_rows = false;
  std::vector<Slot> rows;  // valid when has_rows: the passing slots, each once, in no set order
  /// Makes `rows` valid (from the bitmap). O(slots / 64 + count). Not safe to call concurrently.
  const std::vector<Slot>& ensure_rows();
  /// Makes `bitmap` valid (from the rows). O(slots / 64 + count). Not safe to call concurrently.
  const Bitmap& ensure_bitmap();
};

/// Evaluates `node` among `live` like evaluate_filter, producing `rows` when at most
/// `rows_up_to` rows pass. A leaf that reads a sorted index (eq, $in, ranges, string tests)
/// costs O(log n + matches) when at most rows_up_to entries match (the list is copied out of
/// the index in index order, with no pass over all slots), else O(n / 64 + matches) for the
/// bitmap. Other nodes evaluate to a bitmap as in evaluate_filter. `all_live` promises that
/// every slot of `live` is set (no row was removed), which spares a test per match.
/// Thread-safe for concurrent readers.
FilterMatches match_filter(const FilterNode& node, const MetadataStore& meta, const Bitmap& live,
                           std::size_t rows_up_to, bool all_live = false);

}  // namespace kbcore
