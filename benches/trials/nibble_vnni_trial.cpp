// Trial (issue 28): what one 4-bit RaBitQ code row costs to score, against one SQ8 row, and
// what an AVX-512 VNNI nibble kernel would cost. An experiment, not product code: it times
// kernels on rows that stay in L2 (512 rows), so it measures instructions, not memory. Built by
// hand against the static core library:
//
//   cmake -S . -B build/ctest -DKBCORE_BUILD_PYTHON=OFF -DKBCORE_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build/ctest --target kbcore_core
//   g++ -std=c++17 -O2 -Icpp benches/trials/nibble_vnni_trial.cpp build/ctest/libkbcore_core.a -lpthread -o build/nvt
//   build/nvt
//
// Three kernels over 384 dimensions, four rows per call, as the walk calls them:
// - kbcore's SQ8 kernel on an int8 query (VPDPBUSD, 64 codes per instruction);
// - kbcore's 4-bit RaBitQ kernel (cpp/distance_rabitq_avx512.cpp): nibbles widened to int16,
//   then VPMADDWD with the int16 query;
// - the trial: nibbles masked in place (the low and high nibbles of a 64-byte load are dimensions
//   0-31 / 64-95 and 32-63 / 96-127 of the layout in cpp/rabitq_codes.h) and multiplied by an
//   int8 query permuted to match, with VPDPBUSD. It returns the same integer sums as kbcore's
//   kernel when the query fits int8 (checked below); kbcore's RaBitQ query is int16 today.
// Needs a CPU with AVX-512 VNNI.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "distance.h"
#include "rabitq_codes.h"
#include "sq8_codes.h"

namespace {

constexpr std::size_t kDim = 384;
constexpr std::size_t kRows = 512;
constexpr int kIters = 20000;

#define KBCORE_TRIAL_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

// One 128-dimension step of one row: the low nibbles against ql, the high ones against qh.
KBCORE_TRIAL_VNNI inline __m512i nibble_step(__m512i acc, const std::uint8_t* c, __m512i ql, __m512i qh) {
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const __m512i v = _mm512_loadu_si512(c);
  acc = _mm512_dpbusd_epi32(acc, _mm512_and_si512(v, mask), ql);
  return _mm512_dpbusd_epi32(acc, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask), qh);
}

KBCORE_TRIAL_VNNI void dot4_nibble_vnni(const std::int8_t* lo_q, const std::int8_t* hi_q,
                                        const std::uint8_t* const* codes, std::size_t dim, std::int32_t* out) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
  for (std::size_t b = 0; b < dim / 2; b += 64) {
    const __m512i ql = _mm512_loadu_si512(lo_q + b);
    const __m512i qh = _mm512_loadu_si512(hi_q + b);
    a0 = nibble_step(a0, codes[0] + b, ql, qh);
    a1 = nibble_step(a1, codes[1] + b, ql, qh);
    a2 = nibble_step(a2, codes[2] + b, ql, qh);
    a3 = nibble_step(a3, codes[3] + b, ql, qh);
  }
  out[0] = _mm512_reduce_add_epi32(a0);
  out[1] = _mm512_reduce_add_epi32(a1);
  out[2] = _mm512_reduce_add_epi32(a2);
  out[3] = _mm512_reduce_add_epi32(a3);
}

template <typename Fn>
double ns_per_row(Fn score) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < kIters; ++it) {
    for (std::size_t j = 0; j + 4 <= kRows; j += 4) score(j);
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (double(kIters) * kRows);
}

}  // namespace

int main() {
  using namespace kbcore;
  std::mt19937 rng(1);
  std::vector<std::uint8_t> sq8(kRows * kDim), nibbles(kRows * kDim / 2);
  for (auto& b : sq8) b = static_cast<std::uint8_t>(rng());
  for (auto& b : nibbles) b = static_cast<std::uint8_t>(rng());
  alignas(64) std::int16_t q16[kDim];
  alignas(64) std::int8_t q8[kDim];
  for (std::size_t i = 0; i < kDim; ++i) {
    q16[i] = static_cast<std::int16_t>(static_cast<int>(rng() % 255) - 127);
    q8[i] = static_cast<std::int8_t>(q16[i]);
  }
  // The trial's query: per 128 dimensions, 64 entries matching the low nibbles, 64 the high.
  alignas(64) std::int8_t lo_q[kDim / 2], hi_q[kDim / 2];
  for (std::size_t i = 0; i < kDim; i += 128) {
    for (std::size_t j = 0; j < 32; ++j) {
      lo_q[i / 2 + j] = q8[i + j];
      lo_q[i / 2 + 32 + j] = q8[i + 64 + j];
      hi_q[i / 2 + j] = q8[i + 32 + j];
      hi_q[i / 2 + 32 + j] = q8[i + 96 + j];
    }
  }
  const Sq8Kernels& sq = sq8_kernels_for(SimdLevel::kAvx512);
  const RabitqKernels& rq = rabitq_kernels_for(4, SimdLevel::kAvx512);
  if (sq.dot4_i8 == nullptr) {
    std::printf("no AVX-512 VNNI on this CPU\n");
    return 1;
  }
  const auto rows_of = [](const std::vector<std::uint8_t>& v, std::size_t j, std::size_t stride,
                          const std::uint8_t*(&c)[4]) {
    for (std::size_t r = 0; r < 4; ++r) c[r] = &v[(j + r) * stride];
  };
  std::int32_t out[4];
  std::int64_t sink = 0;
  bool equal = true;
  for (std::size_t j = 0; j + 4 <= kRows; j += 4) {
    const std::uint8_t* c[4];
    rows_of(nibbles, j, kDim / 2, c);
    std::int32_t a[4], b[4];
    rq.dot4(q16, c, kDim, a);
    dot4_nibble_vnni(lo_q, hi_q, c, kDim, b);
    for (int r = 0; r < 4; ++r) equal = equal && a[r] == b[r];
  }
  std::printf("trial kernel == kbcore's 4-bit kernel on every row: %s\n", equal ? "yes" : "NO");
  for (int round = 0; round < 3; ++round) {
    const double t_sq8 = ns_per_row([&](std::size_t j) {
      const std::uint8_t* c[4];
      rows_of(sq8, j, kDim, c);
      sq.dot4_i8(q8, c, kDim, out);
      sink += out[0] + out[3];
    });
    const double t_nib = ns_per_row([&](std::size_t j) {
      const std::uint8_t* c[4];
      rows_of(nibbles, j, kDim / 2, c);
      rq.dot4(q16, c, kDim, out);
      sink += out[0] + out[3];
    });
    const double t_vnni = ns_per_row([&](std::size_t j) {
      const std::uint8_t* c[4];
      rows_of(nibbles, j, kDim / 2, c);
      dot4_nibble_vnni(lo_q, hi_q, c, kDim, out);
      sink += out[0] + out[3];
    });
    std::printf("ns per row: sq8 (VNNI) %.2f, 4-bit RaBitQ (kbcore) %.2f, 4-bit VNNI trial %.2f\n", t_sq8, t_nib,
                t_vnni);
  }
  return sink == 42 ? 2 : 0;  // keeps the sums alive
}
