#pragma once
// Per-row metadata stored natively as typed columns: one Field per name with a kind tag and
// an 8-byte payload per slot (int64, double bits, bool, dictionary id of a string, or index of
// a string list). Sorted (value, slot) indexes are built lazily per field on the first filter
// after a write, so equality, ranges and membership cost O(log n + matches).
//
// Thread-safety: writers (assign, clear) need exclusive access (the owning Index holds its
// write lock); const readers may run concurrently; the lazy index build and derived data
// (Field::derived) take a per-field mutex.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graph_reorder.h"
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

/// A read-only view of consecutive entries of a SortedIndex (C++17 has no std::span). Valid
/// until the next write to the field.
template <typename K>
class Entries {
 public:
  using Entry = std::pair<K, Slot>;
  Entries() = default;
  Entries(const Entry* first, const Entry* last) : first_(first), last_(last) {}
  const Entry* begin() const { return first_; }
  const Entry* end() const { return last_; }
  std::size_t size() const { return static_cast<std::size_t>(last_ - first_); }
  bool empty() const { return first_ == last_; }

 private:
  const Entry* first_ = nullptr;
  const Entry* last_ = nullptr;
};

/// The kStr rows holding one dictionary id.
struct StrRun {
  std::uint32_t id = 0;
  Entries<std::uint32_t> rows;
};

class Field;

/// The sorted (value, slot) indexes of one field, built from its values by Field::index().
/// Every method is a const read: concurrent callers are safe while no write runs.
class FieldIndex {
 public:
  FieldIndex() = default;
  FieldIndex(const FieldIndex&) = delete;  // str_runs_ points into str_index_
  FieldIndex& operator=(const FieldIndex&) = delete;

  /// True if some row holds an int. O(1).
  bool has_ints() const { return !int_index_.empty(); }
  /// True if some row holds a float. O(1).
  bool has_floats() const { return !float_index_.empty(); }
  /// Int rows with lo <= value <= hi, ascending. O(log n), no allocation.
  Entries<std::int64_t> ints_between(std::int64_t lo, std::int64_t hi) const;
  /// Float rows with lo <= value <= hi, ascending. O(log n), no allocation.
  Entries<double> floats_between(double lo, double hi) const;
  /// Bool rows whose value is b. O(log n), no allocation.
  Entries<std::int64_t> bool_entries(bool b) const;
  /// kStr rows whose dictionary id is id. O(log n), no allocation.
  Entries<std::uint32_t> str_entries(std::uint32_t id) const;
  /// Every kStr row, ascending by (dictionary id, slot). O(1).
  Entries<std::uint32_t> all_strs() const;
  /// The kStr rows grouped by distinct dictionary id, ids ascending. O(1).
  const std::vector<StrRun>& str_runs() const { return str_runs_; }
  /// kStrList rows whose list holds dictionary id id (each row once). O(log n), no allocation.
  Entries<std::uint32_t> list_entries(std::uint32_t id) const;
  /// Bytes held by the indexes. O(1).
  std::size_t memory_bytes() const;

 private:
  friend class Field;
  void build(const Field& f);

  SortedIndex<std::int64_t> int_index_;
  SortedIndex<double> float_index_;
  SortedIndex<std::int64_t> bool_index_;
  SortedIndex<std::uint32_t> str_index_;   // kStr rows by dictionary id
  SortedIndex<std::uint32_t> list_index_;  // kStrList elements by dictionary id
  std::vector<StrRun> str_runs_;           // distinct ids of str_index_ with their rows
};

/// One metadata field over all slots. Only MetadataStore writes it; the const API below is
/// what readers (filters, grouping) use.
class Field {
 public:
  Field(std::string name, std::size_t slots);
  Field(const Field&) = delete;
  Field& operator=(const Field&) = delete;

  /// The field's name. O(1).
  const std::string& name() const { return name_; }
  /// Number of rows with a value. O(1).
  std::size_t present_count() const { return present_; }
  /// True if slot s has a value (s < kinds().size()). O(1).
  bool present(Slot s) const { return kinds_[s] != 0; }
  /// The kind byte (a ValueKind) of every slot. O(1), no copy.
  const std::vector<std::uint8_t>& kinds() const { return kinds_; }
  /// The 8-byte payload of every slot, read by its kind byte (int64, double bits, bool 0 / 1,
  /// dictionary id, list index). O(1), no copy.
  const std::vector<std::int64_t>& payloads() const { return payload_; }
  /// The dictionary id of slot s's value; s must hold a kStr. O(1).
  std::uint32_t str_id(Slot s) const { return static_cast<std::uint32_t>(payload_[s]); }
  /// The dictionary ids of slot s's list; s must hold a kStrList. O(1), no copy.
  const std::vector<std::uint32_t>& list_at(Slot s) const { return lists_[static_cast<std::size_t>(payload_[s])]; }
  /// Incremented by every write; derived data compares it to know it is stale. O(1).
  std::uint64_t version() const { return version_; }
  /// The sorted indexes, rebuilt first if a write made them stale (O(n log n) then, O(1)
  /// after). Thread-safe (per-field mutex); the reference is valid until the next write.
  const FieldIndex& index() const;
  /// A T built as T(*this) from the current values and cached in the field until the next
  /// write (one per type T): how other components (grouping) keep their own derived data.
  /// Thread-safe (per-field mutex); the reference is valid until the next write.
  template <typename T>
  const T& derived() const;

 private:
  friend class MetadataStore;
  friend class FieldIndex;

  std::string name_;
  std::vector<std::uint8_t> kinds_;                // per slot, a ValueKind
  std::vector<std::int64_t> payload_;              // per slot
  std::vector<std::vector<std::uint32_t>> lists_;  // string lists (dictionary ids)
  std::vector<std::uint32_t> free_lists_;
  std::size_t present_ = 0;    // rows with a value
  std::uint64_t version_ = 1;  // bumped by every write

  mutable std::mutex index_mutex_;
  mutable std::uint64_t index_version_ = 0;  // version_ the index was built from
  mutable FieldIndex index_;

  struct Derived {
    const void* tag;  // one per T
    std::uint64_t version;
    std::shared_ptr<const void> value;
  };
  mutable std::mutex derived_mutex_;
  mutable std::vector<Derived> derived_;
};

template <typename T>
const T& Field::derived() const {
  static const char tag = 0;
  std::lock_guard<std::mutex> lock(derived_mutex_);
  for (Derived& d : derived_) {
    if (d.tag != &tag) continue;
    if (d.version != version_) {
      d.value.reset();  // free the stale one before building the new
      d.value = std::make_shared<const T>(*this);
      d.version = version_;
    }
    return *static_cast<const T*>(d.value.get());
  }
  derived_.push_back(Derived{&tag, version_, std::make_shared<const T>(*this)});
  return *static_cast<const T*>(derived_.back().value.get());
}

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

  /// Moves every field's value of old slot p.new_to_old[i] to slot i (graph_reorder.h); the
  /// sorted indexes and derived data are rebuilt at their next use. O(fields * slots).
  void permute_slots(const SlotPermutation& p);

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
