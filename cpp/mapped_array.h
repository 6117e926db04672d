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

/// Writes the rows of `src` (`row_len` elements each) to `dst` renumbered: row i of dst is row
/// new_to_old[i] of src. dst holds new_to_old.size() rows and does not overlap src; every
/// index is a row of src (the caller's permutation of its rows, checked by the caller).
template <typename T>
void gather_rows_into(T* dst, const T* src, std::size_t row_len, const std::vector<std::uint32_t>& new_to_old) {
  static_assert(std::is_trivially_copyable_v<T>, "rows move by memcpy");
  const std::size_t bytes = row_len * sizeof(T);
  for (std::size_t i = 0; i < new_to_old.size(); ++i) {
    std::memcpy(dst + i * row_len, src + static_cast<std::size_t>(new_to_old[i]) * row_len, bytes);
  }
}

/// The rows of `src` (`row_len` elements each) renumbered: row i of the result is row
/// new_to_old[i] of src, on the heap. Every index must be below src.size() / row_len (the
/// caller's permutation of its rows; checked by the caller). O(rows * row_len). For rows read
/// in place this is the one copy their first write would make anyway; rows on the heap move
/// in place instead (permute_rows_in_place), without a second copy.
template <typename T>
MappedArray<T> gather_rows(const MappedArray<T>& src, const std::vector<std::uint32_t>& new_to_old,
                           std::size_t row_len) {
  MappedArray<T> out;
  out.resize(new_to_old.size() * row_len);
  gather_rows_into(out.mutable_data(), src.data(), row_len, new_to_old);
  return out;
}

/// Renumbers the rows of `rows` (`row_len` elements each, new_to_old.size() rows) in place:
/// row i becomes the old row new_to_old[i], which must be a permutation of the row numbers
/// (checked by the caller). One cycle of the permutation at a time through a one-row buffer:
/// O(rows * row_len) copies and no second copy of the rows.
template <typename T>
void permute_rows_in_place(T* rows, std::size_t row_len, const std::vector<std::uint32_t>& new_to_old) {
  static_assert(std::is_trivially_copyable_v<T>, "rows move by memcpy");
  const std::size_t n = new_to_old.size();
  const std::size_t bytes = row_len * sizeof(T);
  const auto row = [&](std::size_t i) { return rows + i * row_len; };
  std::vector<T> held(row_len);
  std::vector<std::uint8_t> done(n, 0);
  for (std::size_t start = 0; start < n; ++start) {
    if (done[start] || new_to_old[start] == start) continue;
    std::memcpy(held.data(), row(start), bytes);
    std::size_t i = start;
    for (;;) {
      done[i] = 1;
      const std::size_t from = new_to_old[i];
      if (from == start) {
        std::memcpy(row(i), held.data(), bytes);
        break;
      }
      std::memcpy(row(i), row(from), bytes);
      i = from;
    }
  }
}

/// The elements of a MappedArray of `row_len`-element rows renumbered by new_to_old (as
/// gather_rows): copied in the new order when read in place (the copy a first write makes
/// anyway), moved in place on the heap.
template <typename T>
void permute_rows(MappedArray<T>& a, std::size_t row_len, const std::vector<std::uint32_t>& new_to_old) {
  if (a.in_place()) {
    a = gather_rows(a, new_to_old, row_len);
  } else if (!new_to_old.empty()) {
    permute_rows_in_place(a.mutable_data(), row_len, new_to_old);
  }
}

}  // namespace kbcore
