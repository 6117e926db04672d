// Memory floor of the filtered exact scan (issue 28, h44): ns per passing row for
//   seq      a plain sequential read of the same bytes (the passing rows packed together),
//   gather   a read of the scattered passing rows in slot order, software prefetch d rows ahead,
//   dot      the same with an int8 x uint8 dot product per row (VPDPBUSD), as the SQ8 scan.
// 100k rows x 384 bytes (SQ8 of 384 dims) on 2 MiB pages, 10 % passing, uniformly drawn, ascending.
// Thread CPU time, median of interleaved passes. A trial, not part of the build:
//   g++ -O2 -mavx512f -mavx512bw -mavx512vnni -o /tmp/floor benches/trials/filter_scan_floor.cpp
//   /tmp/floor
#include <immintrin.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

double thread_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

constexpr std::size_t kRows = 100000, kStride = 384;

std::int32_t hsum(__m512i v) { return _mm512_reduce_add_epi32(v); }

template <int kHint, std::size_t kStep = 64>
std::int64_t gather(const std::uint8_t* codes, const std::vector<std::uint32_t>& rows, std::size_t ahead,
                    const std::int8_t* q, bool dot, std::size_t bytes = kStride) {
  std::int64_t total = 0;
  const std::size_t n = rows.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (ahead != 0 && i + ahead < n) {
      const char* p = reinterpret_cast<const char*>(codes + rows[i + ahead] * kStride);
      for (std::size_t o = 0; o < bytes; o += kStep) _mm_prefetch(p + o, kHint == 0 ? _MM_HINT_T0 : _MM_HINT_T1);
    }
    const std::uint8_t* c = codes + rows[i] * kStride;
    __m512i acc = _mm512_setzero_si512();
    for (std::size_t o = 0; o < bytes; o += 64) {
      const __m512i cv = _mm512_load_si512(c + o);
      acc = dot ? _mm512_dpbusd_epi32(acc, cv, _mm512_load_si512(q + o)) : _mm512_xor_si512(acc, cv);
    }
    total += hsum(acc);
  }
  return total;
}

std::int64_t seq(const std::uint8_t* packed, std::size_t n) {
  __m512i acc = _mm512_setzero_si512();
  for (std::size_t i = 0; i < n * kStride; i += 64) acc = _mm512_xor_si512(acc, _mm512_load_si512(packed + i));
  return hsum(acc);
}

}  // namespace

int main() {
  // 2 MiB pages, as the index's code array (aligned.h): the rows are scattered over 38 MB.
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t bytes = (kRows * kStride + kHuge - 1) / kHuge * kHuge;
  auto* codes = static_cast<std::uint8_t*>(std::aligned_alloc(kHuge, bytes));
  madvise(codes, bytes, MADV_HUGEPAGE);
  std::mt19937_64 rng(7);
  for (std::size_t i = 0; i < kRows * kStride; ++i) codes[i] = static_cast<std::uint8_t>(rng());
  alignas(64) std::int8_t q[kStride];
  for (auto& v : q) v = static_cast<std::int8_t>(rng() % 255 - 127);
  std::vector<std::uint32_t> rows;
  for (std::uint32_t s = 0; s < kRows; ++s) {
    if (rng() % 10 == 0) rows.push_back(s);
  }
  auto* packed = static_cast<std::uint8_t*>(std::aligned_alloc(64, rows.size() * kStride));
  for (std::size_t i = 0; i < rows.size(); ++i) std::memcpy(packed + i * kStride, codes + rows[i] * kStride, kStride);
  // A 64 MiB buffer read between runs, so each starts with the rows out of L1/L2 (the codes of
  // an index searched by many queries stay in L3 when it is large enough, as here).
  struct Case {
    const char* name;
    int kind;  // 0 seq, 1 gather T0, 2 gather T1, 3 / 4 the same prefetching every other line
    std::size_t ahead;
    bool dot;
    std::size_t bytes = kStride;  // of each row read (a prefix: the first pass of a pruned scan)
  };
  std::vector<Case> cases = {{"seq (packed)", 0, 0, false}};
  for (std::size_t b : {64, 128, 192, 256}) cases.push_back({"dot T0 prefix", 1, 16, true, b});
  for (std::size_t a : {8, 16, 32}) {
    cases.push_back({"dot T0 pairs", 3, a, true});
    cases.push_back({"dot T1 pairs", 4, a, true});
  }
  for (std::size_t a : {0, 2, 4, 8, 16, 32}) {
    cases.push_back({"gather T1", 2, a, false});
    cases.push_back({"dot T1", 2, a, true});
    cases.push_back({"dot T0", 1, a, true});
  }
  std::vector<std::vector<double>> t(cases.size());
  std::int64_t sink = 0;
  for (int pass = 0; pass < 9; ++pass) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const Case& cs = cases[pass % 2 == 0 ? c : cases.size() - 1 - c];
      const std::size_t idx = pass % 2 == 0 ? c : cases.size() - 1 - c;
      const int reps = 20;
      const double t0 = thread_ns();
      for (int r = 0; r < reps; ++r) {
        if (cs.kind == 0) sink += seq(packed, rows.size());
        if (cs.kind == 1) sink += gather<0>(codes, rows, cs.ahead, q, cs.dot, cs.bytes);
        if (cs.kind == 2) sink += gather<1>(codes, rows, cs.ahead, q, cs.dot);
        if (cs.kind == 3) sink += gather<0, 128>(codes, rows, cs.ahead, q, cs.dot);
        if (cs.kind == 4) sink += gather<1, 128>(codes, rows, cs.ahead, q, cs.dot);
      }
      t[idx].push_back((thread_ns() - t0) / reps / static_cast<double>(rows.size()));
    }
  }
  for (std::size_t c = 0; c < cases.size(); ++c) {
    std::sort(t[c].begin(), t[c].end());
    std::printf("%-14s ahead %2zu bytes %3zu: %6.2f ns/row\n", cases[c].name, cases[c].ahead, cases[c].bytes,
                t[c][t[c].size() / 2]);
  }
  std::printf("(%zu passing rows, sink %lld)\n", rows.size(), static_cast<long long>(sink));
  std::free(packed);
  std::free(codes);
  return 0;
}
