// Run-time selection of the distance kernels. The best level the CPU supports is chosen
// at start-up; set_simd_level can force a lower one (tests, KBCORE_SIMD).
#include "distance.h"

#include <atomic>

#include "errors.h"

namespace kbcore {
namespace {

bool cpu_supports(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
#if defined(KBCORE_HAVE_X86_KERNELS)
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
#endif
    default:
      return false;
  }
}

SimdLevel best_level() {
  SimdLevel best = SimdLevel::kScalar;
  for (SimdLevel l : supported_simd_levels()) best = l;
  return best;
}

std::atomic<int>& level_slot() {
  static std::atomic<int> slot{static_cast<int>(best_level())};
  return slot;
}

}  // namespace

const Kernels& kernels_for(SimdLevel level) {
  switch (level) {
#if defined(KBCORE_HAVE_X86_KERNELS)
    case SimdLevel::kAvx2:
      return detail::avx2_kernels();
    case SimdLevel::kAvx512:
      return detail::avx512_kernels();
#endif
    default:
      return detail::scalar_kernels();
  }
}

const Kernels& active_kernels() {
  return kernels_for(static_cast<SimdLevel>(level_slot().load(std::memory_order_relaxed)));
}

SimdLevel active_simd_level() { return static_cast<SimdLevel>(level_slot().load(std::memory_order_relaxed)); }

void set_simd_level(SimdLevel level) {
  if (!cpu_supports(level)) {
    throw InvalidArgument("SIMD level '" + simd_level_name(level) +
                          "' is not supported by this CPU or build; supported levels can be listed "
                          "with kbcore.available_simd_levels()");
  }
  level_slot().store(static_cast<int>(level), std::memory_order_relaxed);
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> out;
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (cpu_supports(l)) out.push_back(l);
  }
  return out;
}

std::string simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
    default:
      return "scalar";
  }
}

SimdLevel parse_simd_level(const std::string& name) {
  if (name == "scalar") return SimdLevel::kScalar;
  if (name == "avx2") return SimdLevel::kAvx2;
  if (name == "avx512") return SimdLevel::kAvx512;
  throw InvalidArgument("unknown SIMD level '" + name + "'; expected scalar, avx2 or avx512");
}

}  // namespace kbcore
