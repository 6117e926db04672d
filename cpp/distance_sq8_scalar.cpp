// Portable SQ8 kernels: exact int32 sums of int16 x uint8 products, the reference every SIMD
// level must equal bit for bit (sq8_codes.h).
#include "sq8_codes.h"

namespace kbcore {
namespace {

std::int32_t dot_sq8_scalar(const std::int16_t* q, const std::uint8_t* c, std::size_t stride) {
  std::int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (std::size_t i = 0; i < stride; i += 4) {
    s0 += static_cast<std::int32_t>(q[i]) * c[i];
    s1 += static_cast<std::int32_t>(q[i + 1]) * c[i + 1];
    s2 += static_cast<std::int32_t>(q[i + 2]) * c[i + 2];
    s3 += static_cast<std::int32_t>(q[i + 3]) * c[i + 3];
  }
  return (s0 + s1) + (s2 + s3);
}

void dot4_sq8_scalar(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t stride, std::int32_t* out) {
  for (int j = 0; j < 4; ++j) out[j] = dot_sq8_scalar(q, codes[j], stride);
}

}  // namespace

namespace detail {
const Sq8Kernels& sq8_scalar_kernels() {
  static const Sq8Kernels k{dot_sq8_scalar, dot4_sq8_scalar, "scalar", nullptr, nullptr};
  return k;
}
}  // namespace detail

}  // namespace kbcore
