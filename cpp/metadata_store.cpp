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

}  // namespace

void Field::ensure_index() const {
  std::lock_guard<std::mutex> lock(index_mutex);
  if (!dirty) return;
  int_index.clear();
  float_index.clear();
  bool_index.clear();
  str_index.clear();
  list_index.clear();
  str_runs.clear();
  for (std::size_t s = 0; s < kinds.size(); ++s) {
    const auto slot = static_cast<Slot>(s);
    switch (static_cast<ValueKind>(kinds[s])) {
      case ValueKind::kInt:
        int_index.emplace_back(payload[s], slot);
        break;
      case ValueKind::kFloat:
        float_index.emplace_back(bits_double(payload[s]), slot);
        break;
      case ValueKind::kBool:
        bool_index.emplace_back(payload[s], slot);
        break;
      case ValueKind::kStr:
        str_index.emplace_back(static_cast<std::uint32_t>(payload[s]), slot);
        break;
      case ValueKind::kStrList:
        for (std::uint32_t id : lists[static_cast<std::size_t>(payload[s])]) list_index.emplace_back(id, slot);
        break;
      default:
        break;
    }
  }
  std::sort(int_index.begin(), int_index.end());
  std::sort(float_index.begin(), float_index.end());
  std::sort(bool_index.begin(), bool_index.end());
  std::sort(str_index.begin(), str_index.end());
  std::sort(list_index.begin(), list_index.end());
  list_index.erase(std::unique(list_index.begin(), list_index.end()), list_index.end());
  // Group ordinals: ints by value, strings by dictionary id, in one dense numbering.
  group_of.assign(kinds.size(), kNoGroup);
  group_keys.clear();
  for (const auto* idx : {&int_index}) {
    for (std::size_t i = 0; i < idx->size(); ++i) {
      if (i == 0 || (*idx)[i].first != (*idx)[i - 1].first) {
        group_keys.emplace_back(static_cast<std::uint8_t>(ValueKind::kInt), (*idx)[i].first);
      }
      group_of[(*idx)[i].second] = static_cast<std::uint32_t>(group_keys.size() - 1);
    }
  }
  for (std::size_t i = 0; i < str_index.size(); ++i) {
    if (i == 0 || str_index[i].first != str_index[i - 1].first) {
      group_keys.emplace_back(static_cast<std::uint8_t>(ValueKind::kStr), str_index[i].first);
    }
    group_of[str_index[i].second] = static_cast<std::uint32_t>(group_keys.size() - 1);
  }
  for (std::size_t i = 0; i < str_index.size();) {
    std::size_t j = i;
    while (j < str_index.size() && str_index[j].first == str_index[i].first) ++j;
    str_runs.push_back({str_index[i].first, {i, j}});
    i = j;
  }
  dirty = false;
}

void MetadataStore::grow(std::size_t n) {
  if (n <= slots_) return;
  slots_ = n;
  for (auto& f : fields_) {
    f->kinds.resize(n, 0);
    f->payload.resize(n, 0);
  }
}

Field& MetadataStore::field_for(const std::string& name) {
  const auto it = by_name_.find(name);
  if (it != by_name_.end()) return *fields_[it->second];
  auto f = std::make_unique<Field>();
  f->name = name;
  f->kinds.assign(slots_, 0);
  f->payload.assign(slots_, 0);
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
  const auto kind = static_cast<ValueKind>(f.kinds[s]);
  if (kind == ValueKind::kMissing) return;
  if (kind == ValueKind::kStrList) {
    const auto li = static_cast<std::uint32_t>(f.payload[s]);
    f.lists[li].clear();
    f.lists[li].shrink_to_fit();
    f.free_lists.push_back(li);
  }
  f.kinds[s] = 0;
  f.payload[s] = 0;
  --f.present;
  f.dirty = true;
}

void MetadataStore::set(Field& f, Slot s, ValueKind kind, std::int64_t payload) {
  clear_value(f, s);
  f.kinds[s] = static_cast<std::uint8_t>(kind);
  f.payload[s] = payload;
  ++f.present;
  f.dirty = true;
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
          if (!f.free_lists.empty()) {
            li = f.free_lists.back();
            f.free_lists.pop_back();
            f.lists[li] = std::move(ids);
          } else {
            li = static_cast<std::uint32_t>(f.lists.size());
            f.lists.push_back(std::move(ids));
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
  for (const auto& fp : fields_) {
    const Field& f = *fp;
    Value v;
    v.kind = static_cast<ValueKind>(f.kinds[s]);
    switch (v.kind) {
      case ValueKind::kMissing:
        continue;
      case ValueKind::kInt:
        v.i = f.payload[s];
        break;
      case ValueKind::kFloat:
        v.f = bits_double(f.payload[s]);
        break;
      case ValueKind::kBool:
        v.b = f.payload[s] != 0;
        break;
      case ValueKind::kStr:
        v.s = dict_.str(static_cast<std::uint32_t>(f.payload[s]));
        break;
      case ValueKind::kStrList:
        for (std::uint32_t id : f.lists[static_cast<std::size_t>(f.payload[s])]) v.list.push_back(dict_.str(id));
        break;
    }
    out.emplace_back(f.name, std::move(v));
  }
  return out;
}

std::size_t MetadataStore::memory_bytes() const {
  std::size_t b = dict_.memory_bytes();
  for (const auto& f : fields_) {
    b += f->kinds.capacity() + f->payload.capacity() * 8;
    for (const auto& l : f->lists) b += l.capacity() * 4 + sizeof(l);
    b += (f->int_index.capacity() + f->float_index.capacity() + f->bool_index.capacity()) * 16 +
         (f->str_index.capacity() + f->list_index.capacity()) * 8;
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
    put_str(f.name);
    w.u64(f.present);
    for (std::size_t s = 0; s < f.kinds.size(); ++s) {
      const auto kind = static_cast<ValueKind>(f.kinds[s]);
      if (kind == ValueKind::kMissing) continue;
      w.u32(static_cast<std::uint32_t>(s));
      w.u8(static_cast<std::uint8_t>(kind));
      switch (kind) {
        case ValueKind::kStr:
          put_str(dict_.str(static_cast<std::uint32_t>(f.payload[s])));
          break;
        case ValueKind::kStrList: {
          const auto& l = f.lists[static_cast<std::size_t>(f.payload[s])];
          w.u64(l.size());
          for (std::uint32_t id : l) put_str(dict_.str(id));
          break;
        }
        default:
          w.i64(f.payload[s]);
      }
    }
  }
}

void MetadataStore::load(BinaryReader& r, const VectorStore& store) {
  const std::size_t n = store.slot_count();
  grow(n);
  // Strings come back to Python as str: invalid UTF-8 is refused here, not at get_metadata.
  const auto get_str = [&r]() {
    const std::uint64_t len = r.u64();
    std::vector<std::uint8_t> bytes;
    r.array(bytes, len);
    std::string s(bytes.begin(), bytes.end());
    if (!is_valid_utf8(s)) r.fail("metadata string is not valid UTF-8");
    return s;
  };
  const std::uint64_t nfields = r.u64();
  r.require(nfields, 16);
  for (std::uint64_t fi = 0; fi < nfields; ++fi) {
    const std::string name = get_str();
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
          if (kind == ValueKind::kBool && (f.payload[s] < 0 || f.payload[s] > 1)) r.fail("invalid bool value");
          break;
        case ValueKind::kFloat: {
          const std::int64_t bits = r.i64();
          if (!std::isfinite(bits_double(bits))) r.fail("non-finite float metadata value");
          set(f, s, kind, bits);
          break;
        }
        case ValueKind::kStr:
          set(f, s, kind, dict_.intern(get_str()));
          break;
        case ValueKind::kStrList: {
          const std::uint64_t len = r.u64();
          r.require(len, 8);
          std::vector<std::uint32_t> ids;
          for (std::uint64_t j = 0; j < len; ++j) ids.push_back(dict_.intern(get_str()));
          const auto li = static_cast<std::uint32_t>(f.lists.size());
          f.lists.push_back(std::move(ids));
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
