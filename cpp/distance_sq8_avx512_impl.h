#pragma once
// Body of the AVX-512 SQ8 kernels, included by distance_sq8_avx512.cpp (AVX-512 F/BW) and
// distance_sq8_avx512vnni.cpp (the same plus VNNI), each compiled with its own flags, so the
// compiler cannot fuse VNNI instructions into the kernels chosen on CPUs without it.
// 32 codes widen to int16 per step; without VNNI, _mm512_madd_epi16 + add forms exact int32
// pair sums, with VNNI _mm512_dpwssd_epi32 fuses both. The sums are exact, so both equal the
// scalar kernels bit for bit.
#include <immintrin.h>

#include "sq8_codes.h"

namespace kbcore {
namespace {

// 512 -> 256 bits: the two halves added (an exact integer sum). The zero-masked extracts with
// a full mask are the plain ones; GCC 12's plain extract and cast intrinsics start from an
// undefined register and warn (-Wuninitialized).
inline __m256i fold512(__m512i v) {
  return _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xff, v, 0), _mm512_maskz_extracti64x4_epi64(0xff, v, 1));
}

// Horizontal sum: folded to 256 bits, then by halves.
inline std::int32_t hsum512(__m512i v) {
  const __m256i h = fold512(v);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The four horizontal sums at once (integer sums, exact in any order): each accumulator folded
// to 256 bits, then per 128-bit half hadd(hadd(a0, a1), hadd(a2, a3)); the halves add up to the
// four sums, stored to out[0..3].
inline void hsum4(__m512i a0, __m512i a1, __m512i a2, __m512i a3, std::int32_t* out) {
  const __m256i h =
      _mm256_hadd_epi32(_mm256_hadd_epi32(fold512(a0), fold512(a1)), _mm256_hadd_epi32(fold512(a2), fold512(a3)));
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), s);
}

template <bool kVnni>
inline __m512i step(const std::int16_t* q, const std::uint8_t* c, std::size_t i, __m512i acc) {
  const __m512i cv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)));
  const __m512i qv = _mm512_loadu_si512(q + i);
  if constexpr (kVnni) {
    return _mm512_dpwssd_epi32(acc, qv, cv);
  } else {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(qv, cv));
  }
}

// The stride is a multiple of kSq8Align (64): one cache line of codes per iteration.
static_assert(kSq8Align % 64 == 0, "the kernels step 64 codes at a time");

template <bool kVnni>
std::int32_t dot_sq8(const std::int16_t* q, const std::uint8_t* c, std::size_t stride) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (std::size_t i = 0; i < stride; i += 64) {
    a0 = step<kVnni>(q, c, i, a0);
    a1 = step<kVnni>(q, c, i + 32, a1);
  }
  return hsum512(_mm512_add_epi32(a0, a1));
}

template <bool kVnni>
void dot4_sq8(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t stride, std::int32_t* out) {
  const std::uint8_t* c0 = codes[0];
  const std::uint8_t* c1 = codes[1];
  const std::uint8_t* c2 = codes[2];
  const std::uint8_t* c3 = codes[3];
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
  for (std::size_t i = 0; i < stride; i += 64) {
    for (std::size_t o = 0; o < 64; o += 32) {
      a0 = step<kVnni>(q, c0, i + o, a0);
      a1 = step<kVnni>(q, c1, i + o, a1);
      a2 = step<kVnni>(q, c2, i + o, a2);
      a3 = step<kVnni>(q, c3, i + o, a3);
    }
  }
  hsum4(a0, a1, a2, a3, out);
}

}  // namespace
}  // namespace kbcore
