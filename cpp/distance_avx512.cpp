// AVX-512F kernels, compiled with -mavx512f (this file only) and used only when the CPU
// reports avx512f at run time. Tails use masked loads, so any dimension is exact.
#include <immintrin.h>

#include "distance.h"

namespace kbcore {
namespace {

inline __mmask16 tail_mask(std::size_t rest) { return static_cast<__mmask16>((1u << rest) - 1u); }

float dot_avx512(const float* a, const float* b, std::size_t dim) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= dim; i += 16) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  }
  if (i < dim) {
    const __mmask16 m = tail_mask(dim - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

float l2sq_avx512(const float* a, const float* b, std::size_t dim) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
    s0 = _mm512_fmadd_ps(d0, d0, s0);
    s1 = _mm512_fmadd_ps(d1, d1, s1);
  }
  for (; i + 16 <= dim; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    s0 = _mm512_fmadd_ps(d, d, s0);
  }
  if (i < dim) {
    const __mmask16 m = tail_mask(dim - i);
    const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
    s1 = _mm512_fmadd_ps(d, d, s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// Four rows against one query: the query is loaded once per step for four rows.
template <bool kL2>
void multi4_avx512(const float* q, const float* const* rows, std::size_t dim, float* out) {
  const float* r0 = rows[0];
  const float* r1 = rows[1];
  const float* r2 = rows[2];
  const float* r3 = rows[3];
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  __m512 s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  for (std::size_t i = 0; i < dim; i += 16) {
    const __mmask16 m = dim - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(dim - i);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + i);
    __m512 v0 = _mm512_maskz_loadu_ps(m, r0 + i);
    __m512 v1 = _mm512_maskz_loadu_ps(m, r1 + i);
    __m512 v2 = _mm512_maskz_loadu_ps(m, r2 + i);
    __m512 v3 = _mm512_maskz_loadu_ps(m, r3 + i);
    if constexpr (kL2) {
      v0 = _mm512_sub_ps(qv, v0);
      v1 = _mm512_sub_ps(qv, v1);
      v2 = _mm512_sub_ps(qv, v2);
      v3 = _mm512_sub_ps(qv, v3);
      s0 = _mm512_fmadd_ps(v0, v0, s0);
      s1 = _mm512_fmadd_ps(v1, v1, s1);
      s2 = _mm512_fmadd_ps(v2, v2, s2);
      s3 = _mm512_fmadd_ps(v3, v3, s3);
    } else {
      s0 = _mm512_fmadd_ps(qv, v0, s0);
      s1 = _mm512_fmadd_ps(qv, v1, s1);
      s2 = _mm512_fmadd_ps(qv, v2, s2);
      s3 = _mm512_fmadd_ps(qv, v3, s3);
    }
  }
  out[0] = _mm512_reduce_add_ps(s0);
  out[1] = _mm512_reduce_add_ps(s1);
  out[2] = _mm512_reduce_add_ps(s2);
  out[3] = _mm512_reduce_add_ps(s3);
}

void dot4_avx512(const float* q, const float* const* rows, std::size_t dim, float* out) {
  multi4_avx512<false>(q, rows, dim, out);
}
void l2sq4_avx512(const float* q, const float* const* rows, std::size_t dim, float* out) {
  multi4_avx512<true>(q, rows, dim, out);
}

// Sixteen accumulators (4 queries x 4 rows); each loaded register feeds four FMAs.
template <bool kL2>
void tile4x4_avx512(const float* const* q, const float* const* r, std::size_t dim, float* out) {
  __m512 acc[4][4];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  for (std::size_t i = 0; i < dim; i += 16) {
    const __mmask16 m = dim - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(dim - i);
    const __m512 r0 = _mm512_maskz_loadu_ps(m, r[0] + i);
    const __m512 r1 = _mm512_maskz_loadu_ps(m, r[1] + i);
    const __m512 r2 = _mm512_maskz_loadu_ps(m, r[2] + i);
    const __m512 r3 = _mm512_maskz_loadu_ps(m, r[3] + i);
    for (int a = 0; a < 4; ++a) {
      const __m512 qv = _mm512_maskz_loadu_ps(m, q[a] + i);
      if constexpr (kL2) {
        __m512 d0 = _mm512_sub_ps(qv, r0), d1 = _mm512_sub_ps(qv, r1);
        __m512 d2 = _mm512_sub_ps(qv, r2), d3 = _mm512_sub_ps(qv, r3);
        acc[a][0] = _mm512_fmadd_ps(d0, d0, acc[a][0]);
        acc[a][1] = _mm512_fmadd_ps(d1, d1, acc[a][1]);
        acc[a][2] = _mm512_fmadd_ps(d2, d2, acc[a][2]);
        acc[a][3] = _mm512_fmadd_ps(d3, d3, acc[a][3]);
      } else {
        acc[a][0] = _mm512_fmadd_ps(qv, r0, acc[a][0]);
        acc[a][1] = _mm512_fmadd_ps(qv, r1, acc[a][1]);
        acc[a][2] = _mm512_fmadd_ps(qv, r2, acc[a][2]);
        acc[a][3] = _mm512_fmadd_ps(qv, r3, acc[a][3]);
      }
    }
  }
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) out[4 * a + b] = _mm512_reduce_add_ps(acc[a][b]);
  }
}

void dot4x4_avx512(const float* const* q, const float* const* r, std::size_t dim, float* out) {
  tile4x4_avx512<false>(q, r, dim, out);
}
void l2sq4x4_avx512(const float* const* q, const float* const* r, std::size_t dim, float* out) {
  tile4x4_avx512<true>(q, r, dim, out);
}

void dot_panel_avx512(const float* const* q, std::size_t nq, const float* panel, std::size_t dim, float* out) {
  // Up to 8 queries x 32 rows: 16 accumulators; per dimension 2 row loads and one broadcast
  // per query feed 16 FMAs, so the loop is bound by FMA throughput, not by loads.
  __m512 acc[8][2];
  for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
  const float* qp[8];
  for (std::size_t a = 0; a < 8; ++a) qp[a] = q[a < nq ? a : 0];
  for (std::size_t d = 0; d < dim; ++d) {
    const __m512 r0 = _mm512_loadu_ps(panel + d * 32);
    const __m512 r1 = _mm512_loadu_ps(panel + d * 32 + 16);
    for (std::size_t a = 0; a < 8; ++a) {
      const __m512 qb = _mm512_set1_ps(qp[a][d]);
      acc[a][0] = _mm512_fmadd_ps(qb, r0, acc[a][0]);
      acc[a][1] = _mm512_fmadd_ps(qb, r1, acc[a][1]);
    }
  }
  for (std::size_t a = 0; a < nq && a < 8; ++a) {
    _mm512_storeu_ps(out + 32 * a, acc[a][0]);
    _mm512_storeu_ps(out + 32 * a + 16, acc[a][1]);
  }
}

}  // namespace

namespace detail {
const Kernels& avx512_kernels() {
  static const Kernels k{dot_avx512,    l2sq_avx512,    dot4_avx512,     l2sq4_avx512,
                         dot4x4_avx512, l2sq4x4_avx512, dot_panel_avx512};
  return k;
}
}  // namespace detail

}  // namespace kbcore
