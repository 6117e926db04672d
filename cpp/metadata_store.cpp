#include "metadata_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "binary_io.h"
#include "errors.h"

namespace kbcore {
namespace {

std::string_view bytes_at(const std::uint8_t* data, const std::int64_t* offsets, std::size_t i) {
  return std::string_view(reinterpret_cast<const char*>(data) + offsets[i],
                          static_cast<std::size_t>(offsets[i + 1] - offsets[i]));
}

void check_offsets(const std::int64_t* off, std::size_t count, std::size_t limit, const std::string& what) {
  if (off == nullptr) throw InvalidArgument(what + ": offsets are missing");
  if (off[0] != 0) throw InvalidArgument(what + ": offsets must start at 0");
  for (std::size_t i = 0; i < count; ++i) {
    if (off[i + 1] < off[i]) throw InvalidArgument(what + ": offsets must not decrease");
  }
  if (static_cast<std::uint64_t>(off[count]) > limit) {
    throw InvalidArgument(what + ": offsets run past the end of the data");
  }
}

std::int64_t double_bits(double d) {
  std::int64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}
double bits_double(std::int64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

// All entries with lo <= key <= hi. O(log n).
template <typename K>
Entries<K> between(const SortedIndex<K>& idx, K lo, K hi) {
  const auto first = std::lower_bound(idx.begin(), idx.end(), std::make_pair(lo, Slot{0}));
  const auto last =
      std::upper_bound(first, idx.end(), hi, [](K v, const std::pair<K, Slot>& e) { return v < e.first; });
  return Entries<K>(idx.data() + (first - idx.begin()), idx.data() + (last - idx.begin()));
}

}  // namespace

Entries<std::int64_t> FieldIndex::ints_between(std::int64_t lo, std::int64_t hi) const {
  return between(int_index_, lo, hi);
}

Entries<double> FieldIndex::floats_between(double lo, double hi) const { return between(float_index_, lo, hi); }

Entries<std::int64_t> FieldIndex::bool_entries(bool b) const {
  const std::int64_t v = b ? 1 : 0;
  return between(bool_index_, v, v);
}

Entries<std::uint32_t> FieldIndex::str_entries(std::uint32_t id) const { return between(str_index_, id, id); }

Entries<std::uint32_t> FieldIndex::all_strs() const {
  return Entries<std::uint32_t>(str_index_.data(), str_index_.data() + str_index_.size());
}

Entries<std::uint32_t> FieldIndex::list_entries(std::uint32_t id) const { return between(list_index_, id, id); }

std::size_t FieldIndex::memory_bytes() const {
  return (int_index_.capacity() + float_index_.capacity() + bool_index_.capacity()) * 16 +
         (str_index_.capacity() + list_index_.capacity()) * 8;
}

void FieldIndex::build(const Field& f) {
  int_index_.clear();
  float_index_.clear();
  bool_index_.clear();
  str_index_.clear();
  list_index_.clear();
  str_runs_.clear();
  for (std::size_t s = 0; s < f.kinds_.size(); ++s) {
    const auto slot = static_cast<Slot>(s);
    const std::int64_t payload = f.payload_[s];
    switch (static_cast<ValueKind>(f.kinds_[s])) {
      case ValueKind::kInt:
        int_index_.emplace_back(payload, slot);
        break;
      case ValueKind::kFloat:
        float_index_.emplace_back(bits_double(payload), slot);
        break;
      case ValueKind::kBool:
        bool_index_.emplace_back(payload, slot);
        break;
      case ValueKind::kStr:
        str_index_.emplace_back(static_cast<std::uint32_t>(payload), slot);
        break;
      case ValueKind::kStrList:
        for (std::uint32_t id : f.lists_[static_cast<std::size_t>(payload)]) list_index_.emplace_back(id, slot);
        break;
      default:
        break;
    }
  }
  std::sort(int_index_.begin(), int_index_.end());
  std::sort(float_index_.begin(), float_index_.end());
  std::sort(bool_index_.begin(), bool_index_.end());
  std::sort(str_index_.begin(), str_index_.end());
  std::sort(list_index_.begin(), list_index_.end());
  list_index_.erase(std::unique(list_index_.begin(), list_index_.end()), list_index_.end());
  const auto* base = str_index_.data();
  for (std::size_t i = 0; i < str_index_.size();) {
    std::size_t j = i;
    while (j < str_index_.size() && str_index_[j].first == str_index_[i].first) ++j;
    str_runs_.push_back(StrRun{str_index_[i].first, Entries<std::uint32_t>(base + i, base + j)});
    i = j;
  }
}

Field::Field(std::string name, std::size_t slots) : name_(std::move(name)), kinds_(slots, 0), payload_(slots, 0) {}

const FieldIndex& Field::index() const {
  std::lock_guard<std::mutex> lock(index_mutex_);
  if (index_version_ != version_) {
    index_.build(*this);
    index_version_ = version_;
  }
  return index_;
}

void MetadataStore::grow(std::size_t n) {
  if (n <= slots_) return;
  slots_ = n;
  for (auto& f : fields_) {
    f->kinds_.resize(n, 0);
    f->payload_.resize(n, 0);
  }
}

Field& MetadataStore::field_for(const std::string& name) {
  const auto it = by_name_.find(name);
  if (it != by_name_.end()) return *fields_[it->second];
  auto f = std::make_unique<Field>(name, slots_);
  by_name_.emplace(name, fields_.size());
  fields_.push_back(std::move(f));
  return *fields_.back();
}

const Field* MetadataStore::field(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : fields_[it->second].get();
}

void MetadataStore::validate(const std::vector<ColumnInput>& cols, std::size_t n) {
  std::unordered_map<std::string, std::vector<std::uint8_t>> taken;
  for (const ColumnInput& c : cols) {
    const std::string what = "metadata field '" + c.name + "'";
    if (c.name.empty()) throw InvalidArgument("metadata field names must be non-empty strings");
    if (c.valid == nullptr) throw InvalidArgument(what + ": validity is missing");
    auto& used = taken[c.name];
    if (used.empty()) used.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      if (c.valid[i] > 1) throw InvalidArgument(what + ": validity must be 0 or 1");
      if (c.valid[i] && used[i]) {
        throw InvalidArgument(what + " has two values in row " + std::to_string(i));
      }
      used[i] |= c.valid[i];
    }
    switch (c.kind) {
      case ValueKind::kInt:
        if (c.ints == nullptr) throw InvalidArgument(what + ": int values are missing");
        break;
      case ValueKind::kFloat:
        if (c.floats == nullptr) throw InvalidArgument(what + ": float values are missing");
        for (std::size_t i = 0; i < n; ++i) {
          if (c.valid[i] && !std::isfinite(c.floats[i])) {
            throw InvalidArgument(what + " in row " + std::to_string(i) + " is NaN or infinite");
          }
        }
        break;
      case ValueKind::kBool:
        if (c.bools == nullptr) throw InvalidArgument(what + ": bool values are missing");
        break;
      case ValueKind::kStr:
        check_offsets(c.offsets, n, c.data_len, what);
        break;
      case ValueKind::kStrList:
        check_offsets(c.list_offsets, n, c.n_strings, what);
        check_offsets(c.offsets, c.n_strings, c.data_len, what);
        break;
      default:
        throw InvalidArgument(what + ": unknown column kind");
    }
  }
}

void MetadataStore::clear_value(Field& f, Slot s) {
  const auto kind = static_cast<ValueKind>(f.kinds_[s]);
  if (kind == ValueKind::kMissing) return;
  if (kind == ValueKind::kStrList) {
    const auto li = static_cast<std::uint32_t>(f.payload_[s]);
    f.lists_[li].clear();
    f.lists_[li].shrink_to_fit();
    f.free_lists_.push_back(li);
  }
  f.kinds_[s] = 0;
  f.payload_[s] = 0;
  --f.present_;
  ++f.version_;
}

void MetadataStore::set(Field& f, Slot s, ValueKind kind, std::int64_t payload) {
  clear_value(f, s);
  f.kinds_[s] = static_cast<std::uint8_t>(kind);
  f.payload_[s] = payload;
  ++f.present_;
  ++f.version_;
}

void MetadataStore::clear(Slot s) {
  if (s >= slots_) return;
  for (auto& f : fields_) clear_value(*f, s);
}

void MetadataStore::assign(const std::vector<Slot>& slots, const std::vector<ColumnInput>& cols) {
  std::size_t max_slot = 0;
  for (Slot s : slots) max_slot = std::max<std::size_t>(max_slot, s + 1);
  grow(max_slot);
  for (Slot s : slots) clear(s);
  const std::size_t n = slots.size();
  for (const ColumnInput& c : cols) {
    Field& f = field_for(c.name);
    for (std::size_t i = 0; i < n; ++i) {
      if (!c.valid[i]) continue;
      const Slot s = slots[i];
      switch (c.kind) {
        case ValueKind::kInt:
          set(f, s, ValueKind::kInt, c.ints[i]);
          break;
        case ValueKind::kFloat:
          set(f, s, ValueKind::kFloat, double_bits(c.floats[i]));
          break;
        case ValueKind::kBool:
          set(f, s, ValueKind::kBool, c.bools[i] ? 1 : 0);
          break;
        case ValueKind::kStr:
          set(f, s, ValueKind::kStr, dict_.intern(bytes_at(c.data, c.offsets, i)));
          break;
        case ValueKind::kStrList: {
          std::vector<std::uint32_t> ids;
          for (std::int64_t j = c.list_offsets[i]; j < c.list_offsets[i + 1]; ++j) {
            ids.push_back(dict_.intern(bytes_at(c.data, c.offsets, static_cast<std::size_t>(j))));
          }
          std::uint32_t li;
          if (!f.free_lists_.empty()) {
            li = f.free_lists_.back();
            f.free_lists_.pop_back();
            f.lists_[li] = std::move(ids);
          } else {
            li = static_cast<std::uint32_t>(f.lists_.size());
            f.lists_.push_back(std::move(ids));
          }
          set(f, s, ValueKind::kStrList, li);
          break;
        }
        default:
          break;
      }
    }
  }
}

std::vector<std::pair<std::string, Value>> MetadataStore::row(Slot s) const {
  std::vector<std::pair<std::string, Value>> out;
  if (s >= slots_) return out;
  out.reserve(fields_.size());  // one allocation per row, not one per doubling
  for (const auto& fp : fields_) {
    const Field& f = *fp;
    Value v;
    v.kind = static_cast<ValueKind>(f.kinds_[s]);
    switch (v.kind) {
      case ValueKind::kMissing:
        continue;
      case ValueKind::kInt:
        v.i = f.payload_[s];
        break;
      case ValueKind::kFloat:
        v.f = bits_double(f.payload_[s]);
        break;
      case ValueKind::kBool:
        v.b = f.payload_[s] != 0;
        break;
      case ValueKind::kStr:
        v.s = dict_.str(f.str_id(s));
        break;
      case ValueKind::kStrList:
        for (std::uint32_t id : f.list_at(s)) v.list.push_back(dict_.str(id));
        break;
    }
    out.emplace_back(f.name_, std::move(v));
  }
  return out;
}

std::size_t MetadataStore::memory_bytes() const {
  std::size_t b = dict_.memory_bytes();
  for (const auto& f : fields_) {
    b += f->kinds_.capacity() + f->payload_.capacity() * 8;
    for (const auto& l : f->lists_) b += l.capacity() * 4 + sizeof(l);
    b += f->index_.memory_bytes();
  }
  return b;
}

// Persisted as: u64 field count; per field: name, then per live slot a kind byte and a value
// (strings inline). Only live slots are written; the dictionary is rebuilt on load.
void MetadataStore::save(BinaryWriter& w, const VectorStore& store) const {
  const auto put_str = [&w](const std::string& s) {
    w.u64(s.size());
    w.array(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  };
  w.u64(fields_.size());
  for (const auto& fp : fields_) {
    const Field& f = *fp;
    put_str(f.name_);
    w.u64(f.present_);
    for (std::size_t s = 0; s < f.kinds_.size(); ++s) {
      const auto kind = static_cast<ValueKind>(f.kinds_[s]);
      if (kind == ValueKind::kMissing) continue;
      w.u32(static_cast<std::uint32_t>(s));
      w.u8(static_cast<std::uint8_t>(kind));
      switch (kind) {
        case ValueKind::kStr:
          put_str(dict_.str(f.str_id(static_cast<Slot>(s))));
          break;
        case ValueKind::kStrList: {
          const auto& l = f.list_at(static_cast<Slot>(s));
          w.u64(l.size());
          for (std::uint32_t id : l) put_str(dict_.str(id));
          break;
        }
        default:
          w.i64(f.payload_[s]);
      }
    }
  }
}

void MetadataStore::load(BinaryReader& r, const VectorStore& store) {
  const std::size_t n = store.slot_count();
  grow(n);
  // Strings come back to Python as str: invalid UTF-8 is refused here, not at get_metadata.
  // A view of the file's bytes (alive until the load returns): no copy per string.
  const auto get_str = [&r]() {
    const std::uint64_t len = r.u64();
    r.require(len, 1);
    const std::string_view s(reinterpret_cast<const char*>(r.here()), len);
    r.skip(len, 1);
    if (!is_valid_utf8(s)) r.fail("metadata string is not valid UTF-8");
    return s;
  };
  // Rows in slot order often repeat a string value (a document's chunks share its id, every
  // row its pipeline): the last one interned is remembered, so a repeat costs one comparison.
  std::string_view last_str;
  std::uint32_t last_id = 0;
  bool have_last = false;
  const auto intern = [&](std::string_view s) {
    if (!have_last || s != last_str) {
      last_id = dict_.intern(s);
      last_str = s;
      have_last = true;
    }
    return last_id;
  };
  const std::uint64_t nfields = r.u64();
  r.require(nfields, 16);
  for (std::uint64_t fi = 0; fi < nfields; ++fi) {
    const std::string name(get_str());
    if (name.empty() || by_name_.count(name)) r.fail("invalid or repeated metadata field name");
    Field& f = field_for(name);
    const std::uint64_t present = r.u64();
    r.require(present, 13);
    std::int64_t last = -1;  // save() writes rows by ascending slot, each once
    for (std::uint64_t k = 0; k < present; ++k) {
      const std::uint32_t s = r.u32();
      const auto kind = static_cast<ValueKind>(r.u8());
      if (s >= n || !store.is_live(s) || static_cast<std::int64_t>(s) <= last) {
        r.fail("metadata row for a missing, repeated or out-of-order slot");
      }
      last = s;
      switch (kind) {
        case ValueKind::kInt:
        case ValueKind::kBool:
          set(f, s, kind, r.i64());
          if (kind == ValueKind::kBool && (f.payload_[s] < 0 || f.payload_[s] > 1)) r.fail("invalid bool value");
          break;
        case ValueKind::kFloat: {
          const std::int64_t bits = r.i64();
          if (!std::isfinite(bits_double(bits))) r.fail("non-finite float metadata value");
          set(f, s, kind, bits);
          break;
        }
        case ValueKind::kStr:
          set(f, s, kind, intern(get_str()));
          break;
        case ValueKind::kStrList: {
          const std::uint64_t len = r.u64();
          r.require(len, 8);
          std::vector<std::uint32_t> ids;
          for (std::uint64_t j = 0; j < len; ++j) ids.push_back(intern(get_str()));
          const auto li = static_cast<std::uint32_t>(f.lists_.size());
          f.lists_.push_back(std::move(ids));
          set(f, s, kind, li);
          break;
        }
        default:
          r.fail("invalid metadata value kind");
      }
    }
  }
}

}  // namespace kbcore
