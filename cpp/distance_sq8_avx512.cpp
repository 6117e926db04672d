// AVX-512 F/BW SQ8 kernels (this file's flags only; chosen at run time on CPUs without VNNI).
#include "distance_sq8_avx512_impl.h"

namespace kbcore::detail {
const Sq8Kernels& sq8_avx512_kernels() {
  static const Sq8Kernels k{dot_sq8<false>, dot4_sq8<false>, "avx512", nullptr, nullptr};
  return k;
}
}  // namespace kbcore::detail
