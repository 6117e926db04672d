#pragma once
// Map from external int64 id to slot for VectorStore: an open-addressing table of slots
// (linear probing, backward-shift deletion, at most half full). Buckets hold only the slot;
// the id is read back from the caller's id-per-slot array, which VectorStore keeps anyway.
// 4 bytes per bucket, 8 to 16 bytes per id, against about 40 for std::unordered_map (a
// 32-byte heap node plus a bucket pointer). Not synchronised: the owner serialises writers
// against readers; concurrent find() calls are safe.
#include <cstdint>
#include <optional>
#include <vector>

#include "slot.h"

namespace kbcore {

class IdMap {
 public:
  std::size_t size() const { return size_; }
  std::size_t bucket_count() const { return buckets_.size(); }
  void clear() {
    buckets_.clear();
    size_ = 0;
  }

  /// The slot stored for `id`; `ids` maps every stored slot to its id. O(1) expected.
  std::optional<Slot> find(std::int64_t id, const std::int64_t* ids) const {
    if (size_ == 0) return std::nullopt;
    const std::size_t mask = buckets_.size() - 1;
    for (std::size_t i = home(id, mask);; i = (i + 1) & mask) {
      const Slot s = buckets_[i];
      if (s == kNoSlot) return std::nullopt;
      if (ids[s] == id) return s;
    }
  }

  /// Stores slot s for id, which must not be stored yet; ids[s] must already be id.
  void insert(std::int64_t id, Slot s, const std::int64_t* ids) {
    reserve(size_ + 1, ids);
    const std::size_t mask = buckets_.size() - 1;
    std::size_t i = home(id, mask);
    while (buckets_[i] != kNoSlot) i = (i + 1) & mask;
    buckets_[i] = s;
    ++size_;
  }

  /// Forgets id (ids must still map its slot to it); false if it was not stored.
  bool erase(std::int64_t id, const std::int64_t* ids) {
    if (size_ == 0) return false;
    const std::size_t mask = buckets_.size() - 1;
    std::size_t i = home(id, mask);
    for (;; i = (i + 1) & mask) {
      if (buckets_[i] == kNoSlot) return false;
      if (ids[buckets_[i]] == id) break;
    }
    // Backward shift: a later entry of the same run moves into the hole when the hole lies
    // between its home bucket and where it sits, so that every entry stays reachable from
    // its home without tombstones.
    for (std::size_t j = (i + 1) & mask; buckets_[j] != kNoSlot; j = (j + 1) & mask) {
      const std::size_t h = home(ids[buckets_[j]], mask);
      if (((j - h) & mask) >= ((j - i) & mask)) {
        buckets_[i] = buckets_[j];
        i = j;
      }
    }
    buckets_[i] = kNoSlot;
    --size_;
    return true;
  }

  /// Makes room for n ids in all without a rehash. O(size) when it grows.
  void reserve(std::size_t n, const std::int64_t* ids) {
    if (2 * n <= buckets_.size()) return;
    std::size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    std::vector<Slot> old(cap, kNoSlot);
    old.swap(buckets_);
    const std::size_t mask = cap - 1;
    for (const Slot s : old) {
      if (s == kNoSlot) continue;
      std::size_t i = home(ids[s], mask);
      while (buckets_[i] != kNoSlot) i = (i + 1) & mask;
      buckets_[i] = s;
    }
  }

  std::size_t memory_bytes() const { return buckets_.capacity() * sizeof(Slot); }

 private:
  // The splitmix64 finaliser: consecutive ids (the common case) land far apart.
  static std::size_t home(std::int64_t id, std::size_t mask) {
    auto x = static_cast<std::uint64_t>(id);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<std::size_t>(x) & mask;
  }

  std::vector<Slot> buckets_;  // power of two, or empty
  std::size_t size_ = 0;
};

}  // namespace kbcore
