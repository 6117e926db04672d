#pragma once
// An array of trivially copyable elements on the heap (AlignedVector), or read in place from a
// mapped index file until its first write, which copies it to the heap (the way RowBuffer's
// use_mapped_heap does for rows): a reopen maps a section instead of copying it, and the kernel
// does not zero the fresh pages of a copy first. The mapping is kept alive by a shared owner
// (the loaded file's bytes) for as long as the array reads it.
// Reads go through one pointer (the view or the heap), so that reading costs what reading an
// AlignedVector does. Not internally synchronised: the owner serialises writes against readers.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "aligned.h"

namespace kbcore {

template <typename T>
class MappedArray {
  static_assert(std::is_trivially_copyable_v<T>, "MappedArray holds trivially copyable elements");

 public:
  MappedArray() = default;
  MappedArray(const MappedArray& o) : heap_(o.heap_), owner_(o.owner_), view_(o.view_), size_(o.size_) { rebind(); }
  MappedArray(MappedArray&& o) noexcept
      : heap_(std::move(o.heap_)), owner_(std::move(o.owner_)), view_(o.view_), size_(o.size_) {
    rebind();
    o.reset_view();
  }
  MappedArray& operator=(const MappedArray& o) {
    if (this != &o) *this = MappedArray(o);
    return *this;
  }
  MappedArray& operator=(MappedArray&& o) noexcept {
    if (this != &o) {
      heap_ = std::move(o.heap_);
      owner_ = std::move(o.owner_);
      view_ = o.view_;
      size_ = o.size_;
      rebind();
      o.reset_view();
    }
    return *this;
  }

  /// Reads `n` elements in place at `data` (aligned as the caller's readers need), kept mapped
  /// by `owner`; the first mutable access copies them to the heap. Replaces any contents.
  void use_mapped(std::shared_ptr<const void> owner, const T* data, std::size_t n) {
    heap_ = AlignedVector<T>();
    owner_ = std::move(owner);
    view_ = data;
    size_ = n;
    rebind();
  }
  /// True while the elements are read in place (before the first write).
  bool in_place() const { return view_ != nullptr; }

  const T* data() const { return base_; }
  /// Mutable elements; elements read in place are first copied to the heap (O(n)).
  T* mutable_data() {
    if (view_ != nullptr) materialize();
    return heap_.data();
  }
  std::size_t size() const { return view_ != nullptr ? size_ : heap_.size(); }
  /// Grows or shrinks to n elements (new ones `value`); copies elements read in place first.
  void resize(std::size_t n, const T& value = T()) {
    if (view_ != nullptr) materialize();
    heap_.resize(n, value);
    rebind();
  }
  /// Bytes the elements stand for (in place: the heap a copy would take).
  std::size_t heap_bytes() const { return view_ != nullptr ? size_ * sizeof(T) : heap_.capacity() * sizeof(T); }

 private:
  void rebind() { base_ = view_ != nullptr ? view_ : heap_.data(); }
  void reset_view() {
    owner_.reset();
    view_ = nullptr;
    size_ = 0;
    rebind();
  }
  void materialize() {
    AlignedVector<T> copy(size_);
    if (size_ != 0) std::memcpy(copy.data(), view_, size_ * sizeof(T));
    heap_ = std::move(copy);
    reset_view();
  }

  AlignedVector<T> heap_;
  std::shared_ptr<const void> owner_;  // keeps view_ mapped
  const T* view_ = nullptr;            // elements read in place (size_ of them)
  std::size_t size_ = 0;
  const T* base_ = nullptr;  // view_ or heap_.data(): the one pointer reads go through
};

/// The rows of `src` (`row_len` elements each) renumbered: row i of the result is row
/// new_to_old[i] of src, on the heap. Every index must be below src.size() / row_len (the
/// caller's permutation of its rows; checked by the caller). O(rows * row_len).
template <typename T>
MappedArray<T> gather_rows(const MappedArray<T>& src, const std::vector<std::uint32_t>& new_to_old,
                           std::size_t row_len) {
  MappedArray<T> out;
  out.resize(new_to_old.size() * row_len);
  T* dst = out.mutable_data();
  const T* from = src.data();
  for (std::size_t i = 0; i < new_to_old.size(); ++i) {
    std::memcpy(dst + i * row_len, from + static_cast<std::size_t>(new_to_old[i]) * row_len, row_len * sizeof(T));
  }
  return out;
}

}  // namespace kbcore
