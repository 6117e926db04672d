#pragma once
// Per-row metadata stored natively as typed columns: one Field per name with a kind tag and
// an 8-byte payload per slot (int64, double bits, bool, dictionary id of a string, or index of
// a string list). Sorted (value, slot) indexes are built lazily per field on the first filter
// after a write, so equality, ranges and membership cost O(log n + matches).
//
// Thread-safety: writers (assign, clear) need exclusive access (the owning Index holds its
// write lock); const readers may run concurrently; the lazy index build takes a per-field mutex.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "string_dict.h"
#include "vector_store.h"

namespace kbcore {

class BinaryReader;
class BinaryWriter;

/// The kind of one stored value; kMissing means the row has no value for the field.
enum class ValueKind : std::uint8_t { kMissing = 0, kInt = 1, kFloat = 2, kBool = 3, kStr = 4, kStrList = 5 };

/// One typed input column of n rows (borrowed views, see docs/filter-ir.md).
struct ColumnInput {
  std::string name;
  ValueKind kind = ValueKind::kMissing;
  const std::uint8_t* valid = nullptr;    // n: 1 if the row has a value of this kind
  const std::int64_t* ints = nullptr;     // kInt: n
  const double* floats = nullptr;         // kFloat: n
  const std::uint8_t* bools = nullptr;    // kBool: n
  const std::int64_t* offsets = nullptr;  // kStr: n + 1; kStrList: n_strings + 1
  const std::uint8_t* data = nullptr;     // kStr, kStrList: UTF-8 bytes
  std::size_t data_len = 0;
  const std::int64_t* list_offsets = nullptr;  // kStrList: n + 1 (into the strings)
  std::size_t n_strings = 0;                   // kStrList
};

/// A decoded value (for get_metadata).
struct Value {
  ValueKind kind = ValueKind::kMissing;
  std::int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<std::string> list;
};

/// A lazily built sorted index: (key, slot) pairs ascending.
template <typename K>
using SortedIndex = std::vector<std::pair<K, Slot>>;

/// One metadata field over all slots.
struct Field {
  std::string name;
  std::vector<std::uint8_t> kinds;                // per slot, a ValueKind
  std::vector<std::int64_t> payload;              // per slot
  std::vector<std::vector<std::uint32_t>> lists;  // string lists (dictionary ids)
  std::vector<std::uint32_t> free_lists;
  std::size_t present = 0;  // rows with a value

  /// Builds the sorted indexes if a write made them stale. Thread-safe.
  void ensure_index() const;
  mutable std::mutex index_mutex;
  mutable bool dirty = true;
  mutable SortedIndex<std::int64_t> int_index;
  mutable SortedIndex<double> float_index;
  mutable SortedIndex<std::int64_t> bool_index;
  mutable SortedIndex<std::uint32_t> str_index;   // kStr rows by dictionary id
  mutable SortedIndex<std::uint32_t> list_index;  // kStrList elements by dictionary id
  /// Dense group ordinal of each slot's value (kNoGroup when the slot has no int or str
  /// value), and the (kind, payload) of each ordinal: what grouped search collapses on.
  static constexpr std::uint32_t kNoGroup = 0xFFFFFFFFu;
  mutable std::vector<std::uint32_t> group_of;
  mutable std::vector<std::pair<std::uint8_t, std::int64_t>> group_keys;
  /// Distinct dictionary ids of str_index with their [begin, end) ranges.
  mutable std::vector<std::pair<std::uint32_t, std::pair<std::size_t, std::size_t>>> str_runs;
};

class MetadataStore {
 public:
  /// Grows per-slot arrays of every field to n slots.
  void grow(std::size_t n);
  /// Checks columns for n rows: kinds, offsets monotone and in range, one value per field per
  /// row, finite floats. Throws InvalidArgument naming the field and row. Changes nothing.
  static void validate(const std::vector<ColumnInput>& cols, std::size_t n);
  /// Gives rows slots[i] exactly the values of row i (previous values are cleared).
  void assign(const std::vector<Slot>& slots, const std::vector<ColumnInput>& cols);
  /// Drops every value of slot s.
  void clear(Slot s);
  /// The field called name, or null.
  const Field* field(const std::string& name) const;
  const StringDict& dict() const { return dict_; }
  /// Values of slot s, by field name (fields without a value are omitted).
  std::vector<std::pair<std::string, Value>> row(Slot s) const;
  /// True if any field exists.
  bool empty() const { return fields_.empty(); }
  std::size_t memory_bytes() const;

  void save(BinaryWriter& w, const VectorStore& store) const;
  void load(BinaryReader& r, const VectorStore& store);

 private:
  Field& field_for(const std::string& name);
  void set(Field& f, Slot s, ValueKind kind, std::int64_t payload);
  void clear_value(Field& f, Slot s);

  std::size_t slots_ = 0;
  StringDict dict_;
  std::vector<std::unique_ptr<Field>> fields_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

}  // namespace kbcore
