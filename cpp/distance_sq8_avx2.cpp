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

// The stride is a multiple of kSq8Align (64): the loops take 64 codes per iteration (one
// cache line), a quarter of the loop overhead of one step per iteration.
static_assert(kSq8Align % 64 == 0, "the kernels step 64 codes at a time");

std::int32_t dot_sq8_avx2(const std::int16_t* q, const std::uint8_t* c, std::size_t stride) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (std::size_t i = 0; i < stride; i += 64) {
    a0 = step(q, c, i, a0);
    a1 = step(q, c, i + 16, a1);
    a0 = step(q, c, i + 32, a0);
    a1 = step(q, c, i + 48, a1);
  }
  return hsum_epi32(_mm256_add_epi32(a0, a1));
}

void dot4_sq8_avx2(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t stride, std::int32_t* out) {
  const std::uint8_t* c0 = codes[0];
  const std::uint8_t* c1 = codes[1];
  const std::uint8_t* c2 = codes[2];
  const std::uint8_t* c3 = codes[3];
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  __m256i a2 = _mm256_setzero_si256(), a3 = _mm256_setzero_si256();
  for (std::size_t i = 0; i < stride; i += 64) {
    for (std::size_t o = 0; o < 64; o += 16) {
      a0 = step(q, c0, i + o, a0);
      a1 = step(q, c1, i + o, a1);
      a2 = step(q, c2, i + o, a2);
      a3 = step(q, c3, i + o, a3);
    }
  }
  // The four horizontal sums at once (integer sums: any order is exact): per 128-bit half,
  // hadd(hadd(a0, a1), hadd(a2, a3)) holds the partial sums of a0..a3; the halves add up.
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), s);
}

}  // namespace

namespace detail {
const Sq8Kernels& sq8_avx2_kernels() {
  static const Sq8Kernels k{dot_sq8_avx2, dot4_sq8_avx2, "avx2", nullptr, nullptr};
  return k;
}
}  // namespace detail

}  // namespace kbcore
