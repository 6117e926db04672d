// Portable kernels: the reference every SIMD level is tested against. Four independent
// accumulators let the compiler vectorise with baseline SSE2 without -ffast-math.
#include "distance.h"

namespace kbcore {
namespace {

float dot_scalar(const float* a, const float* b, std::size_t dim) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::size_t i = 0;
  for (; i + 4 <= dim; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < dim; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

float l2sq_scalar(const float* a, const float* b, std::size_t dim) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::size_t i = 0;
  for (; i + 4 <= dim; i += 4) {
    const float d0 = a[i] - b[i], d1 = a[i + 1] - b[i + 1];
    const float d2 = a[i + 2] - b[i + 2], d3 = a[i + 3] - b[i + 3];
    s0 += d0 * d0;
    s1 += d1 * d1;
    s2 += d2 * d2;
    s3 += d3 * d3;
  }
  for (; i < dim; ++i) {
    const float d = a[i] - b[i];
    s0 += d * d;
  }
  return (s0 + s1) + (s2 + s3);
}

void dot4_scalar(const float* q, const float* const* rows, std::size_t dim, float* out) {
  for (int j = 0; j < 4; ++j) out[j] = dot_scalar(q, rows[j], dim);
}

void l2sq4_scalar(const float* q, const float* const* rows, std::size_t dim, float* out) {
  for (int j = 0; j < 4; ++j) out[j] = l2sq_scalar(q, rows[j], dim);
}

void dot4x4_scalar(const float* const* q, const float* const* rows, std::size_t dim, float* out) {
  for (int i = 0; i < 4; ++i) dot4_scalar(q[i], rows, dim, out + 4 * i);
}

void l2sq4x4_scalar(const float* const* q, const float* const* rows, std::size_t dim, float* out) {
  for (int i = 0; i < 4; ++i) l2sq4_scalar(q[i], rows, dim, out + 4 * i);
}

}  // namespace

namespace detail {
const Kernels& scalar_kernels() {
  static const Kernels k{dot_scalar, l2sq_scalar, dot4_scalar, l2sq4_scalar, dot4x4_scalar, l2sq4x4_scalar, nullptr};
  return k;
}
}  // namespace detail

}  // namespace kbcore
