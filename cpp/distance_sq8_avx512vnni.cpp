// AVX-512 VNNI SQ8 kernels (this file adds -mavx512vnni; chosen at run time only when
// __builtin_cpu_supports("avx512vnni")).
//
// Besides the int16-query kernels of distance_sq8_avx512_impl.h, the int8-query ones:
// VPDPBUSD multiplies 64 uint8 codes by 64 int8 query entries and adds each group of four
// products into an int32 lane, without saturation (the products are at most 255 * 127 in
// magnitude, and sq8_query_limit bounds the whole sum), so one instruction takes a cache line
// of codes with nothing widened, and the sums equal the int16 kernels' on the same values.
#include "distance_sq8_avx512_impl.h"

namespace kbcore {
namespace {

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

std::int32_t dot_sq8_i8(const std::int8_t* q, const std::uint8_t* c, std::size_t stride) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 128 <= stride; i += 128) {
    a0 = _mm512_dpbusd_epi32(a0, load64(c + i), load64(q + i));
    a1 = _mm512_dpbusd_epi32(a1, load64(c + i + 64), load64(q + i + 64));
  }
  if (i < stride) a0 = _mm512_dpbusd_epi32(a0, load64(c + i), load64(q + i));  // one line left
  return hsum512(_mm512_add_epi32(a0, a1));
}

void dot4_sq8_i8(const std::int8_t* q, const std::uint8_t* const* codes, std::size_t stride, std::int32_t* out) {
  const std::uint8_t* c0 = codes[0];
  const std::uint8_t* c1 = codes[1];
  const std::uint8_t* c2 = codes[2];
  const std::uint8_t* c3 = codes[3];
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
  for (std::size_t i = 0; i < stride; i += 64) {
    const __m512i qv = load64(q + i);
    a0 = _mm512_dpbusd_epi32(a0, load64(c0 + i), qv);
    a1 = _mm512_dpbusd_epi32(a1, load64(c1 + i), qv);
    a2 = _mm512_dpbusd_epi32(a2, load64(c2 + i), qv);
    a3 = _mm512_dpbusd_epi32(a3, load64(c3 + i), qv);
  }
  hsum4(a0, a1, a2, a3, out);
}

}  // namespace

namespace detail {
const Sq8Kernels& sq8_avx512vnni_kernels() {
  static const Sq8Kernels k{dot_sq8<true>, dot4_sq8<true>, "avx512vnni", dot_sq8_i8, dot4_sq8_i8};
  return k;
}
}  // namespace detail
}  // namespace kbcore
