#pragma once
// Bounded max-heap that keeps the k smallest (distance, slot) pairs seen so far.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace kbcore {

/// A scored slot; ordered by distance, ties by slot so that results are deterministic.
struct Scored {
  float dist;
  std::uint32_t slot;
  bool operator<(const Scored& o) const { return dist < o.dist || (dist == o.dist && slot < o.slot); }
};

/// Keeps the k best (smallest) items. push is O(log k); worst() is the admission bar.
class TopK {
 public:
  explicit TopK(std::size_t k) : k_(k) { heap_.reserve(k + 1); }
  std::size_t size() const { return heap_.size(); }
  /// The k it keeps.
  std::size_t capacity() const { return k_; }
  bool full() const { return heap_.size() >= k_; }
  /// Distance an item must beat to enter (+inf until k items are held).
  float worst() const { return full() ? heap_.front().dist : std::numeric_limits<float>::infinity(); }
  void push(float dist, std::uint32_t slot) {
    if (k_ == 0) return;
    const Scored s{dist, slot};
    if (!full()) {
      heap_.push_back(s);
      std::push_heap(heap_.begin(), heap_.end());
    } else if (s < heap_.front()) {
      std::pop_heap(heap_.begin(), heap_.end());
      heap_.back() = s;
      std::push_heap(heap_.begin(), heap_.end());
    }
  }
  /// Items sorted ascending; the heap is emptied.
  std::vector<Scored> take_sorted() {
    std::sort_heap(heap_.begin(), heap_.end());
    return std::move(heap_);
  }
  void clear() { heap_.clear(); }

 private:
  std::size_t k_;
  std::vector<Scored> heap_;
};

}  // namespace kbcore
