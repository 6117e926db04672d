// Portable RaBitQ kernels: exact int32 sums of int16 query entries times the codes of one
// container, the reference every SIMD level must equal bit for bit (rabitq_codes.h).
//   1 bit:  dimension d is bit d % 8 (least significant first) of byte d / 8
//   nibble: in each 64-dimension block of 32 bytes, byte j holds dimension j in its low nibble
//           and dimension j + 32 in its high one
//   byte:   one byte per dimension (the SQ8 kernels: the same signature and math)

#include "rabitq_codes.h"
#include "sq8_codes.h"

namespace kbcore {
namespace {

std::int32_t dot_bits_scalar(const std::int16_t* q, const std::uint8_t* c, std::size_t padded) {
  std::int32_t s0 = 0, s1 = 0;
  for (std::size_t i = 0; i < padded; i += 8) {
    const unsigned b = c[i / 8];
    for (unsigned j = 0; j < 8; j += 2) {
      // -bit is 0 or all ones: adds q only where the bit is set, without a branch.
      s0 += static_cast<std::int32_t>(q[i + j]) & -static_cast<std::int32_t>((b >> j) & 1u);
      s1 += static_cast<std::int32_t>(q[i + j + 1]) & -static_cast<std::int32_t>((b >> (j + 1)) & 1u);
    }
  }
  return s0 + s1;
}

std::int32_t dot_nibble_scalar(const std::int16_t* q, const std::uint8_t* c, std::size_t padded) {
  std::int32_t s0 = 0, s1 = 0;
  for (std::size_t i = 0; i < padded; i += 64, c += 32) {
    for (std::size_t j = 0; j < 32; ++j) {
      s0 += static_cast<std::int32_t>(q[i + j]) * (c[j] & 15);
      s1 += static_cast<std::int32_t>(q[i + j + 32]) * (c[j] >> 4);
    }
  }
  return s0 + s1;
}

template <std::int32_t (*kDot)(const std::int16_t*, const std::uint8_t*, std::size_t)>
void dot4_scalar(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t padded, std::int32_t* out) {
  for (int j = 0; j < 4; ++j) out[j] = kDot(q, codes[j], padded);
}

}  // namespace

namespace detail {
const RabitqKernels& rabitq_scalar_kernels(unsigned container_bits) {
  static const RabitqKernels bits{dot_bits_scalar, dot4_scalar<dot_bits_scalar>, "scalar"};
  static const RabitqKernels nibble{dot_nibble_scalar, dot4_scalar<dot_nibble_scalar>, "scalar"};
  static const RabitqKernels byte{sq8_scalar_kernels().dot, sq8_scalar_kernels().dot4, "scalar"};
  return rabitq_pick_container(container_bits, bits, nibble, byte);
}
}  // namespace detail

}  // namespace kbcore
