#pragma once
// Distance kernels and their run-time dispatch. Each SIMD level lives in its own
// translation unit compiled with its own flags (distance_avx2.cpp, distance_avx512.cpp);
// the baseline build is portable.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kbcore {

/// Distance metric; for every metric a smaller distance means closer.
/// kCosine: 1 - cos(a, b) on vectors normalised at insert; kIp: 1 - dot(a, b); kL2: squared L2.
enum class Metric : std::uint8_t { kL2 = 0, kIp = 1, kCosine = 2 };

/// Instruction-set level of the distance kernels.
enum class SimdLevel : std::uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

/// Pointwise kernels over `dim` floats.
using DotFn = float (*)(const float* a, const float* b, std::size_t dim);
using L2Fn = float (*)(const float* a, const float* b, std::size_t dim);
/// Scores four rows (anywhere in memory) against one query: out[j] = dot or l2sq of rows[j].
/// Interleaving four rows shares the query loads and hides FMA latency.
using Multi4Fn = void (*)(const float* query, const float* const* rows, std::size_t dim, float* out);

/// Scores a 4 x 4 tile: out[4 * i + j] = dot or l2sq of queries[i] and rows[j]. Sixteen
/// accumulators reuse every load four times, which is what an exact batch scan needs to be
/// compute-bound rather than load-bound.
using Tile4x4Fn = void (*)(const float* const* queries, const float* const* rows, std::size_t dim, float* out);

/// Inner products of up to kPanelQueries queries with a panel of 32 rows stored transposed
/// (panel[d * 32 + r] = row r, dimension d): out[32 * i + r] = dot(queries[i], row r).
/// Broadcast-multiply over a transposed panel needs no horizontal sums (the GEMM layout).
using PanelFn = void (*)(const float* const* queries, std::size_t nq, const float* panel, std::size_t dim, float* out);
inline constexpr std::size_t kPanelRows = 32;
inline constexpr std::size_t kPanelQueries = 8;

/// One level's kernels.
struct Kernels {
  DotFn dot;
  L2Fn l2sq;
  Multi4Fn dot4;
  Multi4Fn l2sq4;
  Tile4x4Fn dot4x4;
  Tile4x4Fn l2sq4x4;
  PanelFn dot_panel;  ///< null where the level has no panel kernel
};

/// Kernels of one level; level must be supported (see supported_simd_levels).
const Kernels& kernels_for(SimdLevel level);
/// The kernels currently in use. Thread-safe (reads an atomic).
const Kernels& active_kernels();
/// The level currently in use.
SimdLevel active_simd_level();
/// Forces a level; throws InvalidArgument if this CPU (or this build) cannot run it.
void set_simd_level(SimdLevel level);
/// The levels this CPU and build can run, lowest first.
std::vector<SimdLevel> supported_simd_levels();
/// "scalar" | "avx2" | "avx512".
std::string simd_level_name(SimdLevel level);
/// Parses a level name; throws InvalidArgument on an unknown name.
SimdLevel parse_simd_level(const std::string& name);

/// Distance from precomputed kernel output, so that metrics share kernels.
inline float dot_to_distance(float dot) { return 1.0f - dot; }

namespace detail {
const Kernels& scalar_kernels();
#if defined(KBCORE_HAVE_X86_KERNELS)
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();
#endif
}  // namespace detail

/// Distances of four rows to q under `metric`.
inline void distance4(const Kernels& k, Metric metric, const float* q, const float* const* rows, std::size_t dim,
                      float* out) {
  if (metric == Metric::kL2) {
    k.l2sq4(q, rows, dim, out);
    return;
  }
  k.dot4(q, rows, dim, out);
  for (int j = 0; j < 4; ++j) out[j] = 1.0f - out[j];
}

/// Distance between a and b under `metric` with the given kernels.
inline float distance(const Kernels& k, Metric metric, const float* a, const float* b, std::size_t dim) {
  if (metric == Metric::kL2) return k.l2sq(a, b, dim);
  return 1.0f - k.dot(a, b, dim);
}

}  // namespace kbcore
