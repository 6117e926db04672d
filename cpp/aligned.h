#pragma once
// A std::vector allocator that aligns storage to 64 bytes (one cache line, one AVX-512 register),
// and backs large arrays (the SQ8 codes, the level-0 links, the float32 rows, big visited sets)
// with transparent huge pages where the platform has them.
//
// Huge pages: a graph search touches a few hundred scattered rows, codes and link lists per
// query; over a working set of tens of MB with 4 KiB pages nearly every touch misses the STLB
// (1.5k entries reach 6 MB) and pays a page walk. An allocation of at least kHugeMinBytes is
// therefore mapped directly (mmap), 2 MiB aligned and rounded up to whole 2 MiB pages, and its
// whole 2 MiB pages are marked MADV_HUGEPAGE, so that a kernel whose THP mode is "madvise" (or
// "always") backs them with 2 MiB pages. The last, partly used 2 MiB of the mapping is marked
// MADV_NOHUGEPAGE: only its 4 KiB pages that are touched become resident, instead of a whole
// huge page (on 100k x 384 SQ8 the float32 rows, codes and links ended 1.5 MB each short of a
// page boundary: 45 B per vector of resident memory that held nothing). The process-wide
// switch (huge_pages_enabled / set_huge_pages_enabled) decides at allocation time: off marks
// new mappings MADV_NOHUGEPAGE instead (so an A/B in one process compares 4 KiB with 2 MiB pages
// even under "always"). A madvise that fails changes nothing but the page size. The mapping's
// size depends only on the byte count, so deallocate (given the same count) knows how the block
// was made whatever the switch says by then.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#define KBCORE_HAVE_HUGE_MMAP 1
#endif

namespace kbcore {

/// Allocations of at least this many bytes are mapped for huge pages (where supported).
inline constexpr std::size_t kHugeMinBytes = std::size_t{4} << 20;
/// The huge page size the mappings are aligned and rounded to (x86-64 and aarch64 4K-granule).
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

namespace detail {
/// The switch starts on unless the environment sets KBCORE_HUGE_PAGES to 0 / false / off / no.
inline bool huge_pages_env_default() {
  const char* v = std::getenv("KBCORE_HUGE_PAGES");
  if (v == nullptr) return true;
  for (const char* off : {"0", "false", "off", "no", "FALSE", "OFF", "NO", "False", "Off", "No"}) {
    if (std::strcmp(v, off) == 0) return false;
  }
  return true;
}
inline std::atomic<bool>& huge_pages_flag() {
  static std::atomic<bool> flag{huge_pages_env_default()};
  return flag;
}
}  // namespace detail

/// Whether allocations made from now on are marked for transparent huge pages.
inline bool huge_pages_enabled() { return detail::huge_pages_flag().load(std::memory_order_relaxed); }
/// Sets the process-wide switch; affects allocations (and reallocations on growth) made after.
inline void set_huge_pages_enabled(bool on) { detail::huge_pages_flag().store(on, std::memory_order_relaxed); }
/// True if this build maps large arrays itself (Linux); elsewhere the switch has no effect.
inline constexpr bool huge_pages_supported() {
#if defined(KBCORE_HAVE_HUGE_MMAP)
  return true;
#else
  return false;
#endif
}

namespace detail {
/// Bytes a large block of `bytes` occupies: rounded up to whole huge pages.
inline std::size_t huge_round(std::size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

#if defined(KBCORE_HAVE_HUGE_MMAP)
/// A zeroed anonymous mapping of huge_round(bytes), 2 MiB aligned. Throws std::bad_alloc.
inline void* huge_map(std::size_t bytes) {
  const std::size_t len = huge_round(bytes);
  if (len < bytes || len + kHugePageBytes < len) throw std::bad_alloc();
  // Over-map by one huge page, then trim the unaligned head and the tail.
  void* raw = ::mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + kHugePageBytes - 1) & ~(static_cast<std::uintptr_t>(kHugePageBytes) - 1);
  const std::size_t head = aligned - base;
  if (head != 0) ::munmap(raw, head);
  const std::size_t tail = kHugePageBytes - head;
  if (tail != 0) ::munmap(reinterpret_cast<void*>(aligned + len), tail);
  void* p = reinterpret_cast<void*>(aligned);
  // Before the first touch, so that the first fault of each 2 MiB range can take a huge page.
  // A kernel without THP (or with it "never") rejects or ignores this: 4 KiB pages then.
  const std::size_t whole = bytes / kHugePageBytes * kHugePageBytes;  // >= 2 MiB: bytes >= kHugeMinBytes
  if (huge_pages_enabled() && whole != 0) {
    (void)::madvise(p, whole, MADV_HUGEPAGE);
    if (len > whole) (void)::madvise(static_cast<char*>(p) + whole, len - whole, MADV_NOHUGEPAGE);
  } else {
    (void)::madvise(p, len, MADV_NOHUGEPAGE);
  }
  return p;
}
inline void huge_unmap(void* p, std::size_t bytes) noexcept { ::munmap(p, huge_round(bytes)); }
#endif
}  // namespace detail

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::size_t kAlign = 64;
  AlignedAllocator() noexcept = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
#if defined(KBCORE_HAVE_HUGE_MMAP)
    if (n * sizeof(T) >= kHugeMinBytes) return static_cast<T*>(detail::huge_map(n * sizeof(T)));
#endif
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
#if defined(KBCORE_HAVE_HUGE_MMAP)
    if (n * sizeof(T) >= kHugeMinBytes) {
      detail::huge_unmap(p, n * sizeof(T));
      return;
    }
#endif
    ::operator delete(p, std::align_val_t(kAlign));
  }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept {
    return false;
  }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace kbcore
