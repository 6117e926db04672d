#pragma once
// Software prefetch hints: __builtin_prefetch (GCC, clang), _mm_prefetch (MSVC on x86), else
// no-ops.
#include <cstddef>
#include <cstdint>
#if !defined(__GNUC__) && !defined(__clang__) && defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>
#define KBCORE_MSVC_PREFETCH 1
#endif

namespace kbcore {

/// Starts loading the cache line of p for reading; kLocality is __builtin_prefetch's (3: every
/// cache level, 2: L2 and below).
template <int kLocality>
inline void prefetch_hint(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, kLocality);
#elif defined(KBCORE_MSVC_PREFETCH)
  _mm_prefetch(static_cast<const char*>(p), kLocality >= 3 ? _MM_HINT_T0 : _MM_HINT_T1);
#else
  (void)p;
#endif
}

/// Into every level (PREFETCHT0 on x86): for small data read right away (link lists,
/// per-group marks).
inline void prefetch_l1(const void* p) { prefetch_hint<3>(p); }

/// Into L2 but not L1 (PREFETCHT1 on x86).
inline void prefetch_l2(const void* p) { prefetch_hint<2>(p); }

/// Into every level, every cache line that [p, p + bytes) touches: for a small block that is
/// read right away but need not start on a line (a level-0 link list of 1 + 2M words spans
/// three lines at M = 16, and its ids past the first line were missed by a one-line prefetch).
inline void prefetch_block_l1(const void* p, std::size_t bytes) {
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{63};
  const std::uintptr_t last = reinterpret_cast<std::uintptr_t>(p) + bytes - 1;
  for (std::uintptr_t a = first; a <= last; a += 64) prefetch_l1(reinterpret_cast<const void*>(a));
}

/// Starts loading a whole vector row of `bytes` into L2. Searches know the rows they will
/// score a group of up to 2M rows (graph) or a few rows (scans of scattered slots) ahead and
/// request them all at once: with the L2 hint the requests queue in L2's miss buffers instead
/// of stalling on L1's few, and memory streams the rows at close to its bandwidth (faster than
/// a T0 prefetch of each row's first lines for search, build and scattered scans alike; the
/// figures are in the commit that introduced it and in benches/README.md).
/// Two lines per loop iteration (the same lines, in the same order): half the loop overhead
/// of a call made for every row a graph search scores.
inline void prefetch_row_l2(const void* row, std::size_t bytes) {
  const char* p = static_cast<const char*>(row);
  std::size_t off = 0;
  for (; off + 128 <= bytes; off += 128) {
    prefetch_l2(p + off);
    prefetch_l2(p + off + 64);
  }
  if (off < bytes) prefetch_l2(p + off);
}

/// Starts loading a whole row of `bytes` into every level, for a scan that reads it a few rows
/// later: on x86 one request per 128-byte pair of lines the row touches (the L2 spatial
/// prefetcher fetches each pair's other line), elsewhere one per line (no such prefetcher is
/// assumed). The rows of a filtered exact scan are scattered, so the scan is bound by the misses
/// the core keeps in flight (its L1 fill buffers, which software prefetches hold whatever their
/// hint); a request per pair instead of per line keeps more rows in flight. The figures are in
/// docs/filter-ir.md, "The exact scan".
inline void prefetch_row_pairs_l1(const void* row, std::size_t bytes) {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
  constexpr std::uintptr_t kStep = 128;
#else
  constexpr std::uintptr_t kStep = 64;
#endif
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(row);
  const std::uintptr_t end = first + bytes;
  prefetch_l1(row);
  for (std::uintptr_t a = (first & ~(kStep - 1)) + kStep; a < end; a += kStep) {
    prefetch_l1(reinterpret_cast<const void*>(a));
  }
}

}  // namespace kbcore
