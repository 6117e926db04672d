// AVX2 RaBitQ kernels (compiled with -mavx2 for this file only, used only when the CPU has
// AVX2). The codes widen to int16 lanes and _mm256_madd_epi16 forms exact int32 pair sums:
//   1 bit:  16 dimensions per step; the two code bytes broadcast to every lane, each lane keeps
//           its bit (and + compare), the mask selects the query entry, madd with ones sums pairs
//   nibble: one 64-dimension block of 32 bytes per step; low and high nibbles widen separately
//   byte:   the SQ8 AVX2 kernels
// The sums are exact, so they equal the scalar kernels bit for bit. The file also holds the
// AVX2 Walsh-Hadamard transform of the rotation (used at the AVX2 and AVX-512 levels).
#include <immintrin.h>

#include <climits>
#include <cstring>

#include "rabitq_codes.h"
#include "sq8_codes.h"

namespace kbcore {
namespace {

static_assert(kRabitqAlign % 64 == 0, "the kernels step 64 dimensions at a time");

// The four horizontal sums of a0..a3 at once (exact integer sums in any order).
inline void hsum4(__m256i a0, __m256i a1, __m256i a2, __m256i a3, std::int32_t* out) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), s);
}

inline std::int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Lane j of the 16 dimensions at i: q[i + j] if bit j of the two code bytes is set, else 0,
// summed in pairs into acc.
inline __m256i bits_step(__m256i qv, const std::uint8_t* c, std::size_t i, __m256i sel, __m256i ones, __m256i acc) {
  std::uint16_t w;
  std::memcpy(&w, c + i / 8, sizeof(w));  // little-endian: bit j of w is bit j % 8 of byte j / 8
  const __m256i m = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(static_cast<short>(w)), sel), sel);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_and_si256(m, qv), ones));
}

inline __m256i bit_selectors() {
  return _mm256_setr_epi16(0x0001, 0x0002, 0x0004, 0x0008, 0x0010, 0x0020, 0x0040, 0x0080, 0x0100, 0x0200, 0x0400,
                           0x0800, 0x1000, 0x2000, 0x4000, static_cast<short>(0x8000));
}

inline __m256i load_q(const std::int16_t* q, std::size_t i) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
}

std::int32_t dot_bits_avx2(const std::int16_t* q, const std::uint8_t* c, std::size_t padded) {
  const __m256i sel = bit_selectors(), ones = _mm256_set1_epi16(1);
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (std::size_t i = 0; i < padded; i += 32) {
    a0 = bits_step(load_q(q, i), c, i, sel, ones, a0);
    a1 = bits_step(load_q(q, i + 16), c, i + 16, sel, ones, a1);
  }
  return hsum(_mm256_add_epi32(a0, a1));
}

void dot4_bits_avx2(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t padded, std::int32_t* out) {
  const __m256i sel = bit_selectors(), ones = _mm256_set1_epi16(1);
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  __m256i a2 = _mm256_setzero_si256(), a3 = _mm256_setzero_si256();
  for (std::size_t i = 0; i < padded; i += 16) {
    const __m256i qv = load_q(q, i);
    a0 = bits_step(qv, codes[0], i, sel, ones, a0);
    a1 = bits_step(qv, codes[1], i, sel, ones, a1);
    a2 = bits_step(qv, codes[2], i, sel, ones, a2);
    a3 = bits_step(qv, codes[3], i, sel, ones, a3);
  }
  hsum4(a0, a1, a2, a3, out);
}

// One 64-dimension block at i of 32 code bytes: bytes 0..15 hold dimensions 0..15 (low) and
// 32..47 (high), bytes 16..31 dimensions 16..31 and 48..63.
inline __m256i nibble_block(const std::int16_t* q, const std::uint8_t* c, std::size_t i, __m256i acc) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16));
  const __m256i l0 = _mm256_cvtepu8_epi16(_mm_and_si128(v0, mask));
  const __m256i l1 = _mm256_cvtepu8_epi16(_mm_and_si128(v1, mask));
  const __m256i h0 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v0, 4), mask));
  const __m256i h1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v1, 4), mask));
  const __m256i s0 = _mm256_add_epi32(_mm256_madd_epi16(load_q(q, i), l0), _mm256_madd_epi16(load_q(q, i + 16), l1));
  const __m256i s1 =
      _mm256_add_epi32(_mm256_madd_epi16(load_q(q, i + 32), h0), _mm256_madd_epi16(load_q(q, i + 48), h1));
  return _mm256_add_epi32(acc, _mm256_add_epi32(s0, s1));
}

std::int32_t dot_nibble_avx2(const std::int16_t* q, const std::uint8_t* c, std::size_t padded) {
  __m256i a = _mm256_setzero_si256();
  for (std::size_t i = 0; i < padded; i += 64, c += 32) a = nibble_block(q, c, i, a);
  return hsum(a);
}

void dot4_nibble_avx2(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t padded, std::int32_t* out) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  __m256i a2 = _mm256_setzero_si256(), a3 = _mm256_setzero_si256();
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
// The sign factors and the first three levels (h = 1, 2, 4) inside one register of eight, then
// two levels per pass; each output is the same sequence of operations as in the portable
// transform (x + (-y) is x - y exactly), so the floats are the same.
void rabitq_fwht_avx2(float* v, const float* f, std::size_t n) {
  const __m256 neg1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, INT_MIN, 0, INT_MIN, 0, INT_MIN, 0, INT_MIN));
  const __m256 neg2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, INT_MIN, INT_MIN, 0, 0, INT_MIN, INT_MIN));
  const __m256 neg4 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, INT_MIN, INT_MIN, INT_MIN, INT_MIN));
  for (std::size_t i = 0; i < n; i += 8) {
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(v + i), _mm256_loadu_ps(f + i));
    x = _mm256_add_ps(_mm256_xor_ps(x, neg1), _mm256_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
    x = _mm256_add_ps(_mm256_xor_ps(x, neg2), _mm256_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm256_add_ps(_mm256_xor_ps(x, neg4), _mm256_permute2f128_ps(x, x, 0x01));
    _mm256_storeu_ps(v + i, x);
  }
  std::size_t h = 8;
  for (; h * 4 <= n; h *= 4) {
    for (std::size_t i = 0; i < n; i += 4 * h) {
      float* a = v + i;
      for (std::size_t j = 0; j < h; j += 8) {
        const __m256 x0 = _mm256_loadu_ps(a + j), x1 = _mm256_loadu_ps(a + j + h);
        const __m256 x2 = _mm256_loadu_ps(a + j + 2 * h), x3 = _mm256_loadu_ps(a + j + 3 * h);
        const __m256 a1 = _mm256_add_ps(x0, x1), b1 = _mm256_sub_ps(x0, x1);
        const __m256 c1 = _mm256_add_ps(x2, x3), d1 = _mm256_sub_ps(x2, x3);
        _mm256_storeu_ps(a + j, _mm256_add_ps(a1, c1));
        _mm256_storeu_ps(a + j + h, _mm256_add_ps(b1, d1));
        _mm256_storeu_ps(a + j + 2 * h, _mm256_sub_ps(a1, c1));
        _mm256_storeu_ps(a + j + 3 * h, _mm256_sub_ps(b1, d1));
      }
    }
  }
  for (; h < n; h *= 2) {  // the last level when their count is odd
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; j += 8) {
        const __m256 x = _mm256_loadu_ps(v + j), y = _mm256_loadu_ps(v + j + h);
        _mm256_storeu_ps(v + j, _mm256_add_ps(x, y));
        _mm256_storeu_ps(v + j + h, _mm256_sub_ps(x, y));
      }
    }
  }
}

const RabitqKernels& rabitq_avx2_kernels(unsigned container_bits) {
  static const RabitqKernels bits{dot_bits_avx2, dot4_bits_avx2, "avx2"};
  static const RabitqKernels nibble{dot_nibble_avx2, dot4_nibble_avx2, "avx2"};
  static const RabitqKernels byte{sq8_avx2_kernels().dot, sq8_avx2_kernels().dot4, "avx2"};
  return rabitq_pick_container(container_bits, bits, nibble, byte);
}
}  // namespace detail

}  // namespace kbcore
