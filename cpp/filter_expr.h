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
  kEq, kNe, kGt, kGte, kLt, kLte, kIn, kNin, kContains, kNotContains, kStartsWith, kEndsWith,
  kExists, kEmpty, kBefore, kAfter
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

}  // namespace kbcore
