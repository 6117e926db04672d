#pragma once
// A compiled metadata filter (the IR of docs/filter-ir.md) and its evaluation to a Bitmap of
// passing slots. Evaluation uses each field's sorted indexes, so equality, ranges and
// membership cost O(log n + matches); negations complement against the live rows.
#include <cstdint>
#include <cstring>
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

/// Consecutive entries of one sorted index: the rows of a leaf come as a few runs. Exactly one
/// of the three views is non-empty.
struct IndexRun {
  Entries<std::int64_t> i64;
  Entries<double> f64;
  Entries<std::uint32_t> u32;
  template <typename Fn>
  void for_each_slot(Fn&& fn) const {
    for (const auto& e : i64) fn(e.second);
    for (const auto& e : f64) fn(e.second);
    for (const auto& e : u32) fn(e.second);
  }
};

/// The runs a leaf reads. Distinct runs never share a slot: a slot holds one value per field,
/// and a string list holds each dictionary id once. Views into the field's index: valid until
/// the next write to the field.
struct LeafRuns {
  std::vector<IndexRun> runs;
  std::size_t total = 0;  // entries over all runs

  void add(Entries<std::int64_t> e);
  void add(Entries<double> e);
  void add(Entries<std::uint32_t> e);
  template <typename Fn>
  void for_each_slot(Fn&& fn) const {
    for (const IndexRun& r : runs) r.for_each_slot(fn);
  }
};

/// One leaf filter tested on a slot's stored value, in O(1): equality or a range on numbers
/// (int and float rows compared exactly, as the index evaluation does), equality on a bool or
/// a string. A filtered walk tests the few nodes it admits with it instead of first building
/// the bitmap of every passing slot. Borrows the field and the live bitmap: valid until the
/// next write.
class SlotPredicate {
 public:
  /// True if live slot s passes. s < the slot count the predicate was built for.
  bool operator()(Slot s) const {
    if (live_ != nullptr && !live_->test(s)) return false;
    const std::int64_t p = payload_[s];
    switch (static_cast<ValueKind>(kinds_[s])) {
      case ValueKind::kInt:
        return ints_ && p >= int_lo_ && p <= int_hi_;
      case ValueKind::kFloat: {
        double d;
        std::memcpy(&d, &p, sizeof d);
        return floats_ && d >= float_lo_ && d <= float_hi_;
      }
      case ValueKind::kBool:
        return bools_ && p == bool_value_;
      case ValueKind::kStr:
        return strs_ && static_cast<std::uint32_t>(p) == str_id_;
      default:
        return false;
    }
  }

 private:
  friend bool compile_predicate(const FilterNode&, const MetadataStore&, const Bitmap*, SlotPredicate&);
  const std::uint8_t* kinds_ = nullptr;
  const std::int64_t* payload_ = nullptr;
  const Bitmap* live_ = nullptr;  // null: every slot is live
  bool ints_ = false;
  bool floats_ = false;
  bool bools_ = false;
  bool strs_ = false;
  std::int64_t int_lo_ = 0;
  std::int64_t int_hi_ = -1;
  double float_lo_ = 1;
  double float_hi_ = 0;
  std::int64_t bool_value_ = 0;
  std::uint32_t str_id_ = 0;
};

/// Builds `out` for a leaf $eq / $in of one operand / $gt / $gte / $lt / $lte on a field some
/// row holds; false (out untouched) for any other filter. `live` null promises every slot is
/// live. O(log n) for a string operand (the dictionary), else O(1).
bool compile_predicate(const FilterNode& node, const MetadataStore& meta, const Bitmap* live, SlotPredicate& out);

/// The live rows that pass a filter: their number, and the passing slots as a bitmap over all
/// slots and/or as a list, whichever the evaluation produced; the other form is
/// derived on demand. A filtered search wants the list for an exact scan of the passing rows
/// and the bitmap for a filtered graph walk, or the predicate when the evaluation offered one.
struct FilterMatches {
  std::size_t count = 0;  // passing live rows
  std::size_t slots = 0;  // bitmap size (every slot, live or not)
  bool has_bitmap = false;
  Bitmap bitmap;  // valid when has_bitmap: bit s set iff slot s passes
  bool has_rows = false;
  std::vector<Slot> rows;  // valid when has_rows: the passing slots, each once, in no set order
  /// Valid when has_predicate: tests one slot; then neither form is built yet, and both are
  /// derived from `runs` (the leaf's index entries, with `live` tested when not null).
  bool has_predicate = false;
  SlotPredicate predicate;
  LeafRuns runs;
  const Bitmap* live = nullptr;
  /// Makes `rows` valid (from the bitmap or the runs). O(slots / 64 + count). Not safe to call
  /// concurrently.
  const std::vector<Slot>& ensure_rows();
  /// Makes `bitmap` valid (from the rows or the runs). O(slots / 64 + count). Not safe to call
  /// concurrently.
  const Bitmap& ensure_bitmap();
};

/// Evaluates `node` among `live` like evaluate_filter, producing `rows` when at most
/// `rows_up_to` rows pass. A leaf that reads a sorted index (eq, $in, ranges, string tests)
/// costs O(log n + matches) when at most rows_up_to entries match (the list is copied out of
/// the index in index order, with no pass over all slots), else O(n / 64 + matches) for the
/// bitmap. With `allow_predicate`, a leaf compile_predicate accepts that passes more than
/// rows_up_to rows yields the predicate instead, with its count, in O(log n) when every slot
/// is live (O(matches) otherwise) and neither form built. Other nodes evaluate to a bitmap as
/// in evaluate_filter. `all_live` promises that every slot of `live` is set (no row was
/// removed), which spares a test per match. Thread-safe for concurrent readers; the result
/// borrows `meta` and `live` until their next write.
FilterMatches match_filter(const FilterNode& node, const MetadataStore& meta, const Bitmap& live,
                           std::size_t rows_up_to, bool all_live = false, bool allow_predicate = false);

}  // namespace kbcore
