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

// Horizontal sum by halves, without the extract intrinsics that make GCC 12 warn.
inline std::int32_t hsum512(__m512i v) {
  const __m256i h = _mm512_castsi512_si256(_mm512_add_epi32(v, _mm512_shuffle_i64x2(v, v, 0x4e)));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
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
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
  for (std::size_t i = 0; i < stride; i += 32) {
    a0 = step<kVnni>(q, codes[0], i, a0);
    a1 = step<kVnni>(q, codes[1], i, a1);
    a2 = step<kVnni>(q, codes[2], i, a2);
    a3 = step<kVnni>(q, codes[3], i, a3);
  }
  out[0] = hsum512(a0);
  out[1] = hsum512(a1);
  out[2] = hsum512(a2);
  out[3] = hsum512(a3);
}

}  // namespace
}  // namespace kbcore
