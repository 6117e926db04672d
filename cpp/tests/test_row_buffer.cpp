// RowBuffer (row_buffer.h) on disk: rows in a file mapping keep their contents through growth
// (a new, larger mapping each time), dropping the resident pages, replacement and moves. The
// same checks on every platform's mapping code (POSIX mmap, Windows file mapping views).
#include "row_buffer.h"

#include <cstdint>
#include <string>
#include <utility>

#include "errors.h"
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
