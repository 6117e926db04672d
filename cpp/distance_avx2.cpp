// AVX2 + FMA kernels, compiled with -mavx2 -mfma (this file only) and used only when the
// CPU reports both at run time. Tails shorter than 8 floats run in scalar code.
#include <immintrin.h>

#include "distance.h"

namespace kbcore {
namespace {

inline float hsum256(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

float dot_avx2(const float* a, const float* b, std::size_t dim) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= dim; i += 8) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  }
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < dim; ++i) s += a[i] * b[i];
  return s;
}

float l2sq_avx2(const float* a, const float* b, std::size_t dim) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
    s0 = _mm256_fmadd_ps(d0, d0, s0);
    s1 = _mm256_fmadd_ps(d1, d1, s1);
  }
  for (; i + 8 <= dim; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    s0 = _mm256_fmadd_ps(d, d, s0);
  }
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < dim; ++i) {
    const float d = a[i] - b[i];
    s += d * d;
  }
  return s;
}

template <bool kL2>
void multi4_avx2(const float* q, const float* const* rs, std::size_t dim, float* out) {
  const std::size_t body = dim & ~static_cast<std::size_t>(7);
  const float* r0 = rs[0];
  const float* r1 = rs[1];
  const float* r2 = rs[2];
  const float* r3 = rs[3];
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  for (std::size_t i = 0; i < body; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    __m256 v0 = _mm256_loadu_ps(r0 + i);
    __m256 v1 = _mm256_loadu_ps(r1 + i);
    __m256 v2 = _mm256_loadu_ps(r2 + i);
    __m256 v3 = _mm256_loadu_ps(r3 + i);
    if constexpr (kL2) {
      v0 = _mm256_sub_ps(qv, v0);
      v1 = _mm256_sub_ps(qv, v1);
      v2 = _mm256_sub_ps(qv, v2);
      v3 = _mm256_sub_ps(qv, v3);
      s0 = _mm256_fmadd_ps(v0, v0, s0);
      s1 = _mm256_fmadd_ps(v1, v1, s1);
      s2 = _mm256_fmadd_ps(v2, v2, s2);
      s3 = _mm256_fmadd_ps(v3, v3, s3);
    } else {
      s0 = _mm256_fmadd_ps(qv, v0, s0);
      s1 = _mm256_fmadd_ps(qv, v1, s1);
      s2 = _mm256_fmadd_ps(qv, v2, s2);
      s3 = _mm256_fmadd_ps(qv, v3, s3);
    }
  }
  float t[4] = {hsum256(s0), hsum256(s1), hsum256(s2), hsum256(s3)};
  for (std::size_t i = body; i < dim; ++i) {
    for (int j = 0; j < 4; ++j) {
      if constexpr (kL2) {
        const float d = q[i] - rs[j][i];
        t[j] += d * d;
      } else {
        t[j] += q[i] * rs[j][i];
      }
    }
  }
  for (int j = 0; j < 4; ++j) out[j] = t[j];
}

void dot4_avx2(const float* q, const float* const* rows, std::size_t dim, float* out) {
  multi4_avx2<false>(q, rows, dim, out);
}
void l2sq4_avx2(const float* q, const float* const* rows, std::size_t dim, float* out) {
  multi4_avx2<true>(q, rows, dim, out);
}

// AVX2 has 16 registers: a 4 x 4 tile of accumulators would spill, so the tile is four
// one-query passes over the same four rows (which stay in L1).
void dot4x4_avx2(const float* const* q, const float* const* rows, std::size_t dim, float* out) {
  for (int i = 0; i < 4; ++i) multi4_avx2<false>(q[i], rows, dim, out + 4 * i);
}
void l2sq4x4_avx2(const float* const* q, const float* const* rows, std::size_t dim, float* out) {
  for (int i = 0; i < 4; ++i) multi4_avx2<true>(q[i], rows, dim, out + 4 * i);
}

}  // namespace

namespace detail {
const Kernels& avx2_kernels() {
  static const Kernels k{dot_avx2, l2sq_avx2, dot4_avx2, l2sq4_avx2, dot4x4_avx2, l2sq4x4_avx2, nullptr};
  return k;
}
}  // namespace detail

}  // namespace kbcore
