// AVX2 SQ8 kernels (compiled with -mavx2 for this file only, used only when the CPU has
// AVX2): 16 codes widen to int16, _mm256_madd_epi16 forms exact int32 pair sums.
#include <immintrin.h>

#include "sq8_codes.h"

namespace kbcore {
namespace {

inline std::int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

inline __m256i step(const std::int16_t* q, const std::uint8_t* c, std::size_t i, __m256i acc) {
  const __m256i cv = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
  const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(qv, cv));
}

std::int32_t dot_sq8_avx2(const std::int16_t* q, const std::uint8_t* c, std::size_t stride) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (std::size_t i = 0; i < stride; i += 32) {
    a0 = step(q, c, i, a0);
    a1 = step(q, c, i + 16, a1);
  }
  return hsum_epi32(_mm256_add_epi32(a0, a1));
}

void dot4_sq8_avx2(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t stride, std::int32_t* out) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  __m256i a2 = _mm256_setzero_si256(), a3 = _mm256_setzero_si256();
  for (std::size_t i = 0; i < stride; i += 16) {
    a0 = step(q, codes[0], i, a0);
    a1 = step(q, codes[1], i, a1);
    a2 = step(q, codes[2], i, a2);
    a3 = step(q, codes[3], i, a3);
  }
  out[0] = hsum_epi32(a0);
  out[1] = hsum_epi32(a1);
  out[2] = hsum_epi32(a2);
  out[3] = hsum_epi32(a3);
}

}  // namespace

namespace detail {
const Sq8Kernels& sq8_avx2_kernels() {
  static const Sq8Kernels k{dot_sq8_avx2, dot4_sq8_avx2, "avx2"};
  return k;
}
}  // namespace detail

}  // namespace kbcore
