#pragma once
// Storage of the float32 rows of a VectorStore: on the heap (the default), or in a shared
// memory mapping of an unlinked temporary file ("disk"), from which release_resident() drops
// the pages out of the process's resident set: they stay in the file (and the page cache while
// the kernel keeps them) and fault back in when read. A quantized index reads rows only to
// re-rank, so with rows on disk its resident memory is the codes, the graph and the rows
// recently re-ranked.
// A loaded index can also read its rows in place from the mapped index file (use_mapped): the
// first write then copies them into a row file as above, so a saved file is never modified.
// Rows in memory are read in place the same way (use_mapped_heap), and the first write copies
// them to the heap: a reopen maps the rows instead of copying them (and the kernel zeroing the
// pages of the copy first), and they stay mapped (resident while the page cache keeps them).
// A row file's space is reserved (posix_fallocate) before it is mapped: a full disk is an
// IoError naming the file, not a SIGBUS on the first write to a sparse page.
// Not internally synchronised: the owning Index serialises growth against readers.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aligned.h"

namespace kbcore {

class RowBuffer {
 public:
  RowBuffer() = default;
  ~RowBuffer();
  RowBuffer(const RowBuffer&) = delete;
  RowBuffer& operator=(const RowBuffer&) = delete;
  RowBuffer(RowBuffer&& o) noexcept;
  RowBuffer& operator=(RowBuffer&& o) noexcept;

  /// Switches an empty buffer to a file mapping in `dir` (empty: $TMPDIR or /tmp). Throws
  /// IoError if the file cannot be created, InvalidArgument if the buffer is not empty.
  void use_disk(const char* dir = nullptr);
  /// Reads `n` floats in place at `rows` (64-byte aligned), kept alive by `owner` (a read-only
  /// file mapping); the first mutable access copies them into a row file in `dir` (as
  /// use_disk). Only on an empty buffer (InvalidArgument otherwise).
  void use_mapped(std::shared_ptr<const void> owner, const float* rows, std::size_t n, const char* dir = nullptr);
  /// The same for rows in memory: read in place at `rows` until the first mutable access copies
  /// them to the heap (on_disk() stays false). Only on an empty buffer (InvalidArgument otherwise).
  void use_mapped_heap(std::shared_ptr<const void> owner, const float* rows, std::size_t n);
  bool on_disk() const { return fd_ >= 0 || (view_ != nullptr && !view_heap_); }
  /// True while the rows are read in place from a mapped file (before the first write).
  bool in_place() const { return view_ != nullptr; }

  /// Mutable rows; rows read in place are first copied into a row file (IoError if that fails).
  float* data() {
    if (view_ != nullptr) materialize();
    return fd_ >= 0 ? map_ : heap_.data();
  }
  const float* data() const { return view_ != nullptr ? view_ : fd_ >= 0 ? map_ : heap_.data(); }
  std::size_t size() const { return view_ != nullptr || fd_ >= 0 ? size_ : heap_.size(); }
  std::size_t capacity() const { return view_ != nullptr ? size_ : fd_ >= 0 ? cap_ : heap_.capacity(); }
  /// Room for n floats (pointers into the buffer are invalidated when it grows).
  void reserve(std::size_t n);
  /// Grows or shrinks to n floats; new floats are zero.
  void resize(std::size_t n);
  /// Replaces the contents with `v` (copied into the file when on disk).
  void assign(AlignedVector<float>&& v);
  /// Rows read in place (in_place(); InvalidArgument otherwise), copied in a new order into a
  /// buffer of the kind the first write would make (the heap, or a row file in the same
  /// directory): row i of the result is row new_to_old[i] of this one (`row_len` floats per
  /// row; new_to_old.size() * row_len must be size(), and its entries below the row count:
  /// the caller's permutation). Only reads this buffer, so it can run beside readers.
  RowBuffer gathered(const std::vector<std::uint32_t>& new_to_old, std::size_t row_len) const;
  /// Drops the mapping's pages from the resident set (no-op on the heap). Thread-safe
  /// against readers: a page read afterwards faults back in with the same contents.
  void release_resident() const;
  /// Heap bytes held (a file mapping counts 0: its pages are not resident unless touched; rows
  /// in memory read in place count as the heap they stand for).
  std::size_t heap_bytes() const {
    if (view_heap_) return size_ * sizeof(float);
    return on_disk() ? 0 : heap_.capacity() * sizeof(float);
  }

 private:
  void remap(std::size_t cap);
  void materialize();
  AlignedVector<float> heap_;
  int fd_ = -1;
  float* map_ = nullptr;
  std::size_t size_ = 0, cap_ = 0;
  std::string dir_;                    // where a row file goes (empty: $TMPDIR or /tmp)
  std::string file_name_;              // the row file's name, for error messages
  std::shared_ptr<const void> owner_;  // keeps view_ mapped
  const float* view_ = nullptr;        // rows read in place (size_ floats)
  bool view_heap_ = false;             // view_ stands for heap rows (copied there on first write)
};

}  // namespace kbcore
