#include "vector_store.h"

#include <algorithm>
#include <cstring>

#include "errors.h"

namespace kbcore {

VectorStore::VectorStore(std::size_t dim) : dim_(dim) {
  if (dim == 0) throw InvalidArgument("dimension must be positive");
}

std::optional<Slot> VectorStore::slot_of(std::int64_t id) const { return id_to_slot_.find(id, slot_ids_.data()); }

void VectorStore::reserve_more(std::size_t n) {
  const std::size_t need = slot_count() + (n > free_.size() ? n - free_.size() : 0);
  if (need >= kNoSlot) throw InvalidArgument("an index holds at most 4,294,967,294 vectors");
  if (need * dim_ > data_.capacity()) data_.reserve(std::max(need * dim_, data_.capacity() * 3 / 2));
  if (need > slot_ids_.capacity()) {
    const std::size_t cap = std::max(need, slot_ids_.capacity() * 3 / 2);
    slot_ids_.reserve(cap);
    live_.reserve(cap);
  }
  id_to_slot_.reserve(size() + n, slot_ids_.data());
}

Slot VectorStore::allocate(std::int64_t id, const float* vec) {
  Slot slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    if (slot_count() + 1 >= kNoSlot) throw InvalidArgument("an index holds at most 4,294,967,294 vectors");
    slot = static_cast<Slot>(slot_count());
    slot_ids_.push_back(0);
    live_.push_back(0);
    data_.resize(data_.size() + dim_);
    live_bits_.resize(slot_count());
  }
  std::memcpy(mutable_vector(slot), vec, dim_ * sizeof(float));
  slot_ids_[slot] = id;
  live_[slot] = 1;
  live_bits_.set(slot);
  id_to_slot_.insert(id, slot, slot_ids_.data());
  return slot;
}

void VectorStore::release(Slot slot) {
  if (!live_[slot]) return;
  id_to_slot_.erase(slot_ids_[slot], slot_ids_.data());
  live_[slot] = 0;
  live_bits_.reset(slot);
  free_.push_back(slot);
}

std::vector<std::int64_t> VectorStore::ids() const {
  std::vector<std::int64_t> out;
  out.reserve(size());
  for (std::size_t s = 0; s < slot_count(); ++s) {
    if (live_[s]) out.push_back(slot_ids_[s]);
  }
  return out;
}

std::size_t VectorStore::memory_bytes() const {
  const std::size_t map_bytes = id_to_slot_.memory_bytes();
  return data_.heap_bytes() + slot_ids_.capacity() * sizeof(std::int64_t) + live_.capacity() +
         free_.capacity() * sizeof(Slot) + map_bytes;
}

void VectorStore::restore(std::vector<std::int64_t> slot_ids, std::vector<std::uint8_t> live,
                          AlignedVector<float> data) {
  if (slot_ids.size() != live.size() || data.size() != slot_ids.size() * dim_) {
    throw FormatError("inconsistent vector store sizes");
  }
  restore_slots(std::move(slot_ids), std::move(live));
  data_.assign(std::move(data));
}

void VectorStore::restore_mapped(std::vector<std::int64_t> slot_ids, std::vector<std::uint8_t> live,
                                 std::shared_ptr<const void> owner, const float* rows, bool on_disk) {
  if (slot_ids.size() != live.size()) throw FormatError("inconsistent vector store sizes");
  const std::size_t n = slot_ids.size() * dim_;
  restore_slots(std::move(slot_ids), std::move(live));
  data_ = RowBuffer();
  if (on_disk) {
    data_.use_mapped(std::move(owner), rows, n);
  } else {
    data_.use_mapped_heap(std::move(owner), rows, n);
  }
}

void VectorStore::restore_slots(std::vector<std::int64_t> slot_ids, std::vector<std::uint8_t> live) {
  IdMap map;
  std::vector<Slot> free;
  std::size_t live_count = 0;
  for (std::size_t s = 0; s < slot_ids.size(); ++s) {
    if (live[s] > 1) throw FormatError("invalid live flag in vector store");
    live_count += live[s];
  }
  map.reserve(live_count, slot_ids.data());
  for (std::size_t s = 0; s < slot_ids.size(); ++s) {
    if (live[s]) {
      if (map.find(slot_ids[s], slot_ids.data())) {
        throw FormatError("duplicate id " + std::to_string(slot_ids[s]) + " in vector store");
      }
      map.insert(slot_ids[s], static_cast<Slot>(s), slot_ids.data());
    } else {
      free.push_back(static_cast<Slot>(s));
    }
  }
  std::reverse(free.begin(), free.end());
  Bitmap bits(slot_ids.size());
  for (std::size_t s = 0; s < live.size(); ++s) {
    if (live[s]) bits.set(s);
  }
  live_bits_ = std::move(bits);
  slot_ids_ = std::move(slot_ids);
  live_ = std::move(live);
  free_ = std::move(free);
  id_to_slot_ = std::move(map);
}

}  // namespace kbcore
