// AVX-512 VNNI SQ8 kernels (this file adds -mavx512vnni; chosen at run time only when
// __builtin_cpu_supports("avx512vnni")).
#include "distance_sq8_avx512_impl.h"

namespace kbcore::detail {
const Sq8Kernels& sq8_avx512vnni_kernels() {
  static const Sq8Kernels k{dot_sq8<true>, dot4_sq8<true>, "avx512vnni"};
  return k;
}
}  // namespace kbcore::detail
