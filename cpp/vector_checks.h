#pragma once
// The checks and the scaling that add(), search() and load() apply to a vector: finiteness
// and, for the cosine metric, a direction (non-zero norm) and unit length.
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>

namespace kbcore {

/// True if no value is NaN or infinite. O(n). Branch-free over the whole vector (no early
/// exit), so that it vectorises: a query is checked in a few instructions per 8 values.
inline bool all_finite(const float* v, std::size_t n) {
  constexpr float kMax = std::numeric_limits<float>::max();
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad |= !(std::fabs(v[i]) <= kMax);  // NaN compares false
  return bad == 0;
}

/// What load() checks of a stored row, in one branch-free pass: whether every value is finite
/// and whether any is non-zero. For finite values, inverse_norm() is nullopt exactly when none
/// is (it sums squares in double, where a float's square neither underflows to 0 nor
/// overflows), so a load tells a zero cosine row without summing squares. O(n).
struct RowCheck {
  bool finite;
  bool nonzero;
};
inline RowCheck check_row(const float* v, std::size_t n) {
  constexpr float kMax = std::numeric_limits<float>::max();
  int bad = 0;
  int any = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    bad |= !(a <= kMax);  // NaN compares false
    any |= a > 0.0f;
  }
  return {bad == 0, any != 0};
}

/// 1 / (L2 norm of v), accumulated in double over four lanes (element i into lane i % 4, the
/// lanes summed in order 0..3: a fixed order, so that it vectorises without -ffast-math);
/// nullopt for a zero (or overflowing) vector.
inline std::optional<float> inverse_norm(const float* v, std::size_t dim) {
  double acc[4] = {0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 4 <= dim; i += 4) {
    for (std::size_t l = 0; l < 4; ++l) acc[l] += static_cast<double>(v[i + l]) * v[i + l];
  }
  for (std::size_t l = 0; i < dim; ++i, ++l) acc[l] += static_cast<double>(v[i]) * v[i];
  const double s = ((acc[0] + acc[1]) + acc[2]) + acc[3];
  if (s <= 0 || !std::isfinite(s)) return std::nullopt;
  return static_cast<float>(1.0 / std::sqrt(s));
}

/// Scales v to unit length in place (by inverse_norm); false, unchanged, for a zero vector.
inline bool normalise(float* v, std::size_t dim) {
  const std::optional<float> inv = inverse_norm(v, dim);
  if (!inv) return false;
  for (std::size_t i = 0; i < dim; ++i) v[i] *= *inv;
  return true;
}

}  // namespace kbcore
