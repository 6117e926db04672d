// RowBuffer (row_buffer.h) on disk: rows in a file mapping keep their contents through growth
// (a new, larger mapping each time), dropping the resident pages, replacement and moves. The
// same checks on every platform's mapping code (POSIX mmap, Windows file mapping views). And the
// renumbering of rows that a reorder makes: gathered copies of rows read in place, and rows
// moved in place.
#include "row_buffer.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "mapped_array.h"
#include "test_util.h"

namespace {

// A value for float i that no other i in range shares (exact in float32 up to 2^24).
float pattern(std::size_t i, std::size_t salt) { return static_cast<float>((i * 7 + salt) % 16777213); }

bool holds(const kbcore::RowBuffer& rows, std::size_t n, std::size_t salt) {
  if (rows.size() != n) return false;
  const float* p = rows.data();
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != pattern(i, salt)) return false;
  }
  return true;
}

}  // namespace

KBCORE_TEST(disk_rows_keep_their_contents_through_growth_release_and_moves) {
  kbcore::RowBuffer rows;
  rows.use_disk();
  CHECK(rows.on_disk() && rows.size() == 0 && rows.heap_bytes() == 0);
  // Growth in uneven steps past several remaps (the last one beyond 16 MiB).
  std::size_t n = 0;
  for (std::size_t next : {std::size_t{1}, std::size_t{1000}, std::size_t{4099}, std::size_t{300000},
                           std::size_t{1} << 20, std::size_t{4500000}}) {
    rows.resize(next);
    float* p = rows.data();
    for (std::size_t i = n; i < next; ++i) CHECK(p[i] == 0.0f);  // new floats are zero
    for (std::size_t i = n; i < next; ++i) p[i] = pattern(i, 3);
    n = next;
    CHECK(holds(rows, n, 3));
    CHECK(rows.capacity() >= n);
  }
  rows.release_resident();
  CHECK(holds(rows, n, 3));  // the dropped pages come back from the file
  rows.resize(n / 2);
  CHECK(holds(rows, n / 2, 3));
  rows.resize(n);  // the floats past the shrink are zero again
  CHECK(rows.data()[n - 1] == 0.0f && rows.data()[n / 2] == 0.0f);

  kbcore::AlignedVector<float> fresh(70000);
  for (std::size_t i = 0; i < fresh.size(); ++i) fresh[i] = pattern(i, 11);
  rows.assign(std::move(fresh));
  CHECK(rows.on_disk() && holds(rows, 70000, 11));

  kbcore::RowBuffer moved(std::move(rows));
  CHECK(moved.on_disk() && holds(moved, 70000, 11));
  kbcore::RowBuffer other;
  other.use_disk();
  other.resize(10);
  other = std::move(moved);
  CHECK(holds(other, 70000, 11));
}

KBCORE_TEST(disk_rows_in_a_missing_folder_fail_with_io_error) {
  kbcore::RowBuffer rows;
  CHECK(kbcore_test::throws<kbcore::IoError>([&] { rows.use_disk("kbcore-no-such-folder-9c1f/inner"); }));
  CHECK(!rows.on_disk());
  rows.resize(5);  // still a working heap buffer
  CHECK(rows.size() == 5 && rows.heap_bytes() >= 5 * sizeof(float));
}

KBCORE_TEST(only_an_empty_buffer_moves_to_disk) {
  kbcore::RowBuffer rows;
  rows.resize(3);
  CHECK(kbcore_test::throws<kbcore::InvalidArgument>([&] { rows.use_disk(); }));
}

namespace {

// A permutation of 0..n-1 with long cycles, short ones and fixed points.
std::vector<std::uint32_t> mixed_permutation(std::size_t n) {
  std::vector<std::uint32_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint32_t>(i);
  for (std::size_t i = 0; i + 1 < n; i += 3) std::swap(p[i], p[(i * 7919 + 13) % n]);
  return p;
}

}  // namespace

KBCORE_TEST(rows_read_in_place_are_gathered_in_a_new_order_into_a_buffer_of_their_kind) {
  constexpr std::size_t kRows = 3001, kDim = 5;
  auto src = std::make_shared<kbcore::AlignedVector<float>>(kRows * kDim);
  for (std::size_t i = 0; i < src->size(); ++i) (*src)[i] = pattern(i, 5);
  const std::vector<std::uint32_t> order = mixed_permutation(kRows);
  for (const bool in_memory : {true, false}) {
    kbcore::RowBuffer rows;
    if (in_memory) {
      rows.use_mapped_heap(src, src->data(), src->size());
    } else {
      rows.use_mapped(src, src->data(), src->size());
    }
    const kbcore::RowBuffer moved = rows.gathered(order, kDim);
    CHECK(moved.on_disk() == !in_memory && !moved.in_place() && moved.size() == kRows * kDim);
    bool same = true;
    for (std::size_t i = 0; i < kRows; ++i) {
      for (std::size_t d = 0; d < kDim; ++d)
        same = same && moved.data()[i * kDim + d] == pattern(order[i] * kDim + d, 5);
    }
    CHECK(same);
    CHECK(rows.in_place() && holds(rows, kRows * kDim, 5));  // the source is only read
    CHECK(kbcore_test::throws<kbcore::InvalidArgument>([&] { rows.gathered(order, kDim + 1); }));
  }
  kbcore::RowBuffer heap;
  heap.resize(kRows * kDim);
  CHECK(kbcore_test::throws<kbcore::InvalidArgument>([&] { heap.gathered(order, kDim); }));
}

KBCORE_TEST(rows_move_in_place_on_the_heap_and_are_copied_once_when_read_in_place) {
  constexpr std::size_t kRows = 2000, kLen = 3;
  const std::vector<std::uint32_t> order = mixed_permutation(kRows);
  auto src = std::make_shared<std::vector<std::uint16_t>>(kRows * kLen);
  for (std::size_t i = 0; i < src->size(); ++i) (*src)[i] = static_cast<std::uint16_t>(i * 31 + 7);
  const auto renumbered = [&](const kbcore::MappedArray<std::uint16_t>& a) {
    if (a.size() != kRows * kLen) return false;
    for (std::size_t i = 0; i < kRows; ++i) {
      for (std::size_t j = 0; j < kLen; ++j) {
        if (a.data()[i * kLen + j] != (*src)[order[i] * kLen + j]) return false;
      }
    }
    return true;
  };
  kbcore::MappedArray<std::uint16_t> heap;
  heap.resize(src->size());
  std::copy(src->begin(), src->end(), heap.mutable_data());
  const std::uint16_t* before = heap.data();
  kbcore::permute_rows(heap, kLen, order);
  CHECK(renumbered(heap) && heap.data() == before);  // moved where they were: no second array

  kbcore::MappedArray<std::uint16_t> mapped;
  mapped.use_mapped(src, src->data(), src->size());
  kbcore::permute_rows(mapped, kLen, order);
  CHECK(renumbered(mapped) && !mapped.in_place());
  CHECK((*src)[kLen] == static_cast<std::uint16_t>(kLen * 31 + 7));  // the mapped source is untouched

  kbcore::MappedArray<std::uint16_t> none;
  kbcore::permute_rows(none, kLen, {});
  CHECK(none.size() == 0);
}
