// AVX-512 F/BW RaBitQ kernels (this file's flags only; chosen at run time on CPUs with
// AVX-512 BW). The same algorithm as the AVX2 kernels at 512-bit width:
//   1 bit:  32 dimensions per step; the four code bytes are the lane mask that keeps the
//           query entries of the set bits (_mm512_maskz_mov_epi16), madd with ones sums pairs
//   nibble: one 64-dimension block per step; low nibbles widen to dimensions 0..31, high
//           nibbles to 32..63
//   byte:   the SQ8 AVX-512 kernels (with VNNI where the CPU has it)
// The sums are exact, so they equal the scalar kernels bit for bit.
#include <immintrin.h>

#include <cstring>

#include "rabitq_codes.h"
#include "sq8_codes.h"

namespace kbcore {
namespace {

static_assert(kRabitqAlign % 64 == 0, "the kernels step 64 dimensions at a time");

// The lower / upper 256 bits. The zero-masked extract with a full mask is the plain one; GCC
// 12's plain extract and cast intrinsics start from an undefined register and warn
// (-Wuninitialized). Used only in the final reductions.
inline __m256i lower256(__m512i v) { return _mm512_maskz_extracti64x4_epi64(0xff, v, 0); }
inline __m256i upper256(__m512i v) { return _mm512_maskz_extracti64x4_epi64(0xff, v, 1); }

inline std::int32_t hsum512(__m512i v) {
  const __m256i h = _mm256_add_epi32(lower256(v), upper256(v));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 512 -> 256 bits: the two halves added (an exact integer sum).
inline __m256i fold512(__m512i v) { return _mm256_add_epi32(lower256(v), upper256(v)); }

inline void hsum4(__m512i a0, __m512i a1, __m512i a2, __m512i a3, std::int32_t* out) {
  const __m256i h =
      _mm256_hadd_epi32(_mm256_hadd_epi32(fold512(a0), fold512(a1)), _mm256_hadd_epi32(fold512(a2), fold512(a3)));
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), s);
}

inline __m512i bits_step(__m512i qv, const std::uint8_t* c, std::size_t i, __m512i ones, __m512i acc) {
  std::uint32_t w;
  std::memcpy(&w, c + i / 8, sizeof(w));  // little-endian: bit j of w is bit j % 8 of byte j / 8
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maskz_mov_epi16(static_cast<__mmask32>(w), qv), ones));
}

std::int32_t dot_bits_avx512(const std::int16_t* q, const std::uint8_t* c, std::size_t padded) {
  const __m512i ones = _mm512_set1_epi16(1);
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (std::size_t i = 0; i < padded; i += 64) {
    a0 = bits_step(_mm512_loadu_si512(q + i), c, i, ones, a0);
    a1 = bits_step(_mm512_loadu_si512(q + i + 32), c, i + 32, ones, a1);
  }
  return hsum512(_mm512_add_epi32(a0, a1));
}

void dot4_bits_avx512(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t padded, std::int32_t* out) {
  const __m512i ones = _mm512_set1_epi16(1);
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
  for (std::size_t i = 0; i < padded; i += 32) {
    const __m512i qv = _mm512_loadu_si512(q + i);
    a0 = bits_step(qv, codes[0], i, ones, a0);
    a1 = bits_step(qv, codes[1], i, ones, a1);
    a2 = bits_step(qv, codes[2], i, ones, a2);
    a3 = bits_step(qv, codes[3], i, ones, a3);
  }
  hsum4(a0, a1, a2, a3, out);
}

inline __m512i nibble_block(const std::int16_t* q, const std::uint8_t* c, std::size_t i, __m512i acc) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
  const __m512i lo = _mm512_cvtepu8_epi16(_mm256_and_si256(v, mask));
  const __m512i hi = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), mask));
  const __m512i s = _mm512_add_epi32(_mm512_madd_epi16(_mm512_loadu_si512(q + i), lo),
                                     _mm512_madd_epi16(_mm512_loadu_si512(q + i + 32), hi));
  return _mm512_add_epi32(acc, s);
}

std::int32_t dot_nibble_avx512(const std::int16_t* q, const std::uint8_t* c, std::size_t padded) {
  __m512i a = _mm512_setzero_si512();
  for (std::size_t i = 0; i < padded; i += 64, c += 32) a = nibble_block(q, c, i, a);
  return hsum512(a);
}

void dot4_nibble_avx512(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t padded,
                        std::int32_t* out) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
  for (std::size_t i = 0, b = 0; i < padded; i += 64, b += 32) {
    a0 = nibble_block(q, codes[0] + b, i, a0);
    a1 = nibble_block(q, codes[1] + b, i, a1);
    a2 = nibble_block(q, codes[2] + b, i, a2);
    a3 = nibble_block(q, codes[3] + b, i, a3);
  }
  hsum4(a0, a1, a2, a3, out);
}

}  // namespace

namespace detail {
const RabitqKernels& rabitq_avx512_kernels(unsigned container_bits) {
  static const RabitqKernels bits{dot_bits_avx512, dot4_bits_avx512, "avx512"};
  static const RabitqKernels nibble{dot_nibble_avx512, dot4_nibble_avx512, "avx512"};
  static const RabitqKernels byte{sq8_kernels_for(SimdLevel::kAvx512).dot, sq8_kernels_for(SimdLevel::kAvx512).dot4,
                                  "avx512"};
  return rabitq_pick_container(container_bits, bits, nibble, byte);
}
}  // namespace detail

}  // namespace kbcore
