#pragma once
// The checks and the scaling that add(), search() and load() apply to a vector: finiteness
// and, for the cosine metric, a direction (non-zero norm) and unit length.
#include <cmath>
#include <cstddef>
#include <optional>

namespace kbcore {

/// True if no value is NaN or infinite. O(n).
inline bool all_finite(const float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return false;
  }
  return true;
}

/// 1 / (L2 norm of v), accumulated in double; nullopt for a zero (or overflowing) vector.
inline std::optional<float> inverse_norm(const float* v, std::size_t dim) {
  double s = 0;
  for (std::size_t i = 0; i < dim; ++i) s += static_cast<double>(v[i]) * v[i];
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
