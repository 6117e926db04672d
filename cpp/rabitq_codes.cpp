// RaBitQ rotation, training, encoding, query preparation, distances, error bounds, persistence
// and kernel dispatch (rabitq_codes.h).
#include "rabitq_codes.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "binary_io.h"
#include "errors.h"
#include "index.h"

namespace kbcore {
namespace {

// Rounds of the rotation: sign flip, then a Walsh-Hadamard transform of a power-of-two block
// (the start of the vector in even rounds, its end in odd ones), then (when the padded dimension
// is not a power of two) a butterfly of the two halves. The block covers more than half of the
// vector, so after three rounds every output depends on every input; the fourth brings the
// transform closer to a uniformly random rotation (the FHT-Kac construction of the RaBitQ
// library; a dense Gaussian rotation would cost D^2 per vector).
constexpr unsigned kRounds = 4;
// The three float constants after a row's code: F_x, |r|^2, E_x.
constexpr std::size_t kRowConstants = 3;
constexpr std::size_t kConstantBytes = kRowConstants * sizeof(float);
// The code scale search of encode: a coarse grid of kCoarseSteps points over (0, 3 t_max]
// (t_max: the largest coordinate reaches the top code; at few bits the best codes clip, 2 bits
// near 1.5 t_max as the uniform quantizer of a Gaussian), then finer grids of kFineSteps points
// over two coarse steps around each of the kCandidates best points.
constexpr int kCoarseSteps = 32;
constexpr float kCoarseRange = 3.0f;
constexpr int kFineSteps = 16;
constexpr int kCandidates = 3;

std::size_t pow2_floor(std::size_t n) {
  std::size_t b = 1;
  while (b * 2 <= n) b *= 2;
  return b;
}

// v <- H diag(f) v for n (a power of two, >= 64) floats, H the unnormalised Walsh-Hadamard
// transform (the 1 / sqrt(n) is folded into f). Every output is the same sequence of
// multiplications, additions and subtractions whichever path runs (x + (-y) is x - y exactly),
// so the result does not depend on the build.
void fwht(float* v, const float* f, std::size_t n) {
  std::size_t h = 1;
#if defined(__SSE2__)
  // The sign factors and the first two levels (h = 1, 2) inside one register of four.
  const __m128 neg_odd = _mm_castsi128_ps(_mm_setr_epi32(0, INT_MIN, 0, INT_MIN));
  const __m128 neg_high = _mm_castsi128_ps(_mm_setr_epi32(0, 0, INT_MIN, INT_MIN));
  for (std::size_t i = 0; i < n; i += 4) {
    __m128 x = _mm_mul_ps(_mm_loadu_ps(v + i), _mm_loadu_ps(f + i));
    x = _mm_add_ps(_mm_xor_ps(x, neg_odd), _mm_shuffle_ps(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
    x = _mm_add_ps(_mm_xor_ps(x, neg_high), _mm_shuffle_ps(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    _mm_storeu_ps(v + i, x);
  }
  // Two levels per pass (half the loads and stores of one level per pass).
  for (h = 4; h * 4 <= n; h *= 4) {
    for (std::size_t i = 0; i < n; i += 4 * h) {
      float* a = v + i;
      for (std::size_t j = 0; j < h; j += 4) {
        const __m128 x0 = _mm_loadu_ps(a + j), x1 = _mm_loadu_ps(a + j + h);
        const __m128 x2 = _mm_loadu_ps(a + j + 2 * h), x3 = _mm_loadu_ps(a + j + 3 * h);
        const __m128 a1 = _mm_add_ps(x0, x1), b1 = _mm_sub_ps(x0, x1);
        const __m128 c1 = _mm_add_ps(x2, x3), d1 = _mm_sub_ps(x2, x3);
        _mm_storeu_ps(a + j, _mm_add_ps(a1, c1));
        _mm_storeu_ps(a + j + h, _mm_add_ps(b1, d1));
        _mm_storeu_ps(a + j + 2 * h, _mm_sub_ps(a1, c1));
        _mm_storeu_ps(a + j + 3 * h, _mm_sub_ps(b1, d1));
      }
    }
  }
#else
  for (std::size_t i = 0; i < n; ++i) v[i] *= f[i];
  for (; h * 4 <= n; h *= 4) {
    for (std::size_t i = 0; i < n; i += 4 * h) {
      float* a = v + i;
      for (std::size_t j = 0; j < h; ++j) {
        const float a1 = a[j] + a[j + h], b1 = a[j] - a[j + h];
        const float c1 = a[j + 2 * h] + a[j + 3 * h], d1 = a[j + 2 * h] - a[j + 3 * h];
        a[j] = a1 + c1;
        a[j + h] = b1 + d1;
        a[j + 2 * h] = a1 - c1;
        a[j + 3 * h] = b1 - d1;
      }
    }
  }
#endif
  for (; h < n; h *= 2) {  // the last level when their count is odd
    for (std::size_t i = 0; i < n; i += 2 * h) {
      float* a = v + i;
      float* b = v + i + h;
      for (std::size_t j = 0; j < h; ++j) {
        const float x = a[j], y = b[j];
        a[j] = x + y;
        b[j] = x - y;
      }
    }
  }
}

// ((a + b) / sqrt 2, (a - b) / sqrt 2) of the two halves: orthogonal, symmetric, its own inverse.
void butterfly(float* v, std::size_t n) {
  const std::size_t h = n / 2;
  const float s = static_cast<float>(1.0 / std::sqrt(2.0));
  for (std::size_t i = 0; i < h; ++i) {
    const float x = v[i], y = v[i + h];
    v[i] = (x + y) * s;
    v[i + h] = (x - y) * s;
  }
}

// Round to nearest, ties to even, for |v| <= 2^22 (as in sq8_codes.cpp): inline, where
// std::nearbyint is a libm call at the portable baseline.
[[maybe_unused]] inline float round_small(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// floor(v) clamped to [lo, hi], for |v| < 2^31; truncation then a correction (vectorises at the
// SSE2 baseline, where std::floor may not).
inline int floor_clamp(float v, int lo, int hi) {
  int i = static_cast<int>(v);
  i -= v < static_cast<float>(i) ? 1 : 0;
  return i < lo ? lo : i > hi ? hi : i;
}

// <y, o> / |y| for the codes u_d = clamp(floor(t o_d) + half, 0, 2 half - 1), y_d = u_d + 1/2 - half.
// Element d goes to lane d % 8 and the lanes are summed in order, on either path (the same
// floats: the floor and clamp are exact on these small integers).
float scaled_ip(const float* o, std::size_t n, float t, int half) {
  constexpr std::size_t kLanes = 8;
  float yo[kLanes] = {}, yy[kLanes] = {};
#if defined(__SSE2__)
  const __m128 tv = _mm_set1_ps(t), lo = _mm_set1_ps(static_cast<float>(-half));
  const __m128 hi = _mm_set1_ps(static_cast<float>(half - 1)), one = _mm_set1_ps(1.0f), mid = _mm_set1_ps(0.5f);
  __m128 yo0 = _mm_setzero_ps(), yo1 = _mm_setzero_ps(), yy0 = _mm_setzero_ps(), yy1 = _mm_setzero_ps();
  const auto code = [&](__m128 ov) {
    const __m128 x = _mm_mul_ps(tv, ov);
    __m128 f = _mm_cvtepi32_ps(_mm_cvttps_epi32(x));
    f = _mm_sub_ps(f, _mm_and_ps(_mm_cmplt_ps(x, f), one));  // floor
    return _mm_add_ps(_mm_min_ps(_mm_max_ps(f, lo), hi), mid);
  };
  for (std::size_t d = 0; d < n; d += kLanes) {  // n is a multiple of 64
    const __m128 o0 = _mm_loadu_ps(o + d), o1 = _mm_loadu_ps(o + d + 4);
    const __m128 y0 = code(o0), y1 = code(o1);
    yo0 = _mm_add_ps(yo0, _mm_mul_ps(y0, o0));
    yo1 = _mm_add_ps(yo1, _mm_mul_ps(y1, o1));
    yy0 = _mm_add_ps(yy0, _mm_mul_ps(y0, y0));
    yy1 = _mm_add_ps(yy1, _mm_mul_ps(y1, y1));
  }
  _mm_storeu_ps(yo, yo0);
  _mm_storeu_ps(yo + 4, yo1);
  _mm_storeu_ps(yy, yy0);
  _mm_storeu_ps(yy + 4, yy1);
#else
  for (std::size_t d = 0; d < n; d += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) {
      const float y = static_cast<float>(floor_clamp(t * o[d + l], -half, half - 1)) + 0.5f;
      yo[l] += y * o[d + l];
      yy[l] += y * y;
    }
  }
#endif
  float syo = 0, syy = 0;
  for (std::size_t l = 0; l < kLanes; ++l) syo += yo[l], syy += yy[l];
  return syy > 0 ? syo / std::sqrt(syy) : 0.0f;
}

// The scale t of the codes of unit vector o that maximises <y, o> / |y|. Gao et al. (2025) find
// it exactly by enumerating the scales where a code changes (O(D 2^bits log D)); here a coarse
// grid, then finer ones around the best points (92 evaluations of O(D) each).
float best_scale(const float* o, std::size_t n, int half) {
  float amax = 0;
  for (std::size_t d = 0; d < n; ++d) amax = std::max(amax, std::fabs(o[d]));
  const float t_max = static_cast<float>(half) / amax;
  const float step = kCoarseRange * t_max / kCoarseSteps;
  // The objective is piecewise constant with several local maxima: the finer grids search
  // around the kCandidates best coarse points, the last one around the best point so far.
  float cand_t[kCandidates] = {}, cand_ip[kCandidates];
  std::fill(cand_ip, cand_ip + kCandidates, -1.0f);
  for (int k = 1; k <= kCoarseSteps; ++k) {
    const float t = step * static_cast<float>(k);
    float ip = scaled_ip(o, n, t, half);
    float tt = t;
    for (int c = 0; c < kCandidates; ++c) {  // insertion into the descending list
      if (ip > cand_ip[c]) std::swap(ip, cand_ip[c]), std::swap(tt, cand_t[c]);
    }
  }
  float best_t = cand_t[0], best = cand_ip[0];
  const auto refine = [&](float centre, float width) {
    const float fine = 2 * width / kFineSteps;
    for (int k = 1; k < kFineSteps; ++k) {
      const float t = centre - width + fine * static_cast<float>(k);
      if (!(t > 0)) continue;
      const float ip = scaled_ip(o, n, t, half);
      if (ip > best) best = ip, best_t = t;
    }
  };
  for (int c = 0; c < kCandidates; ++c) {
    if (cand_ip[c] >= 0) refine(cand_t[c], step);
  }
  refine(best_t, 2 * step / kFineSteps);
  return best_t;
}

// Code value of dimension d in a row of the container.
inline unsigned code_at(const std::uint8_t* row, unsigned container, std::size_t d) {
  switch (container) {
    case 1:
      return (row[d / 8] >> (d % 8)) & 1u;
    case 4: {
      const std::uint8_t b = row[d / 64 * 32 + d % 32];
      return d % 64 < 32 ? b & 15u : b >> 4;
    }
    default:
      return row[d];
  }
}

// Stores code u of dimension d into a zeroed row of the container.
inline void put_code(std::uint8_t* row, unsigned container, std::size_t d, unsigned u) {
  switch (container) {
    case 1:
      row[d / 8] = static_cast<std::uint8_t>(row[d / 8] | (u << (d % 8)));
      break;
    case 4:
      row[d / 64 * 32 + d % 32] = static_cast<std::uint8_t>(row[d / 64 * 32 + d % 32] | (u << (d % 64 < 32 ? 0 : 4)));
      break;
    default:
      row[d] = static_cast<std::uint8_t>(u);
  }
}

std::size_t code_bytes_for(unsigned container, std::size_t padded) {
  return container == 1 ? padded / 8 : container == 4 ? padded / 2 : padded;
}

}  // namespace

namespace detail {
const RabitqKernels& rabitq_pick_container(unsigned container_bits, const RabitqKernels& bits,
                                           const RabitqKernels& nibble, const RabitqKernels& byte) {
  switch (container_bits) {
    case 1:
      return bits;
    case 4:
      return nibble;
    case 8:
      return byte;
    default:
      throw InvalidArgument("rabitq: code container must be 1, 4 or 8 bits, got " + std::to_string(container_bits));
  }
}
}  // namespace detail

const RabitqKernels& rabitq_kernels_for(unsigned container_bits, SimdLevel level) {
  if (container_bits != 1 && container_bits != 4 && container_bits != 8) {
    throw InvalidArgument("rabitq: code container must be 1, 4 or 8 bits, got " + std::to_string(container_bits));
  }
  switch (level) {
#if defined(KBCORE_HAVE_X86_KERNELS)
    case SimdLevel::kAvx2:
      return detail::rabitq_avx2_kernels(container_bits);
    case SimdLevel::kAvx512:
      return detail::rabitq_avx512_kernels(container_bits);
#endif
    default:
      return detail::rabitq_scalar_kernels(container_bits);
  }
}

RabitqCodes::RabitqCodes(std::size_t dim, Metric metric, unsigned bits, std::uint64_t seed)
    : dim_(dim), padded_(rabitq_padded_dim(dim)), bits_(bits), metric_(metric), seed_(seed) {
  if (dim == 0) throw InvalidArgument("rabitq: dim must be positive");
  if (bits < kRabitqMinBits || bits > kRabitqMaxBits) {
    throw InvalidArgument("rabitq: bits must be in [" + std::to_string(kRabitqMinBits) + ", " +
                          std::to_string(kRabitqMaxBits) + "], got " + std::to_string(bits));
  }
  code_bytes_ = code_bytes_for(rabitq_container_bits(bits), padded_);
  stride_ = (code_bytes_ + kConstantBytes + kRabitqAlign - 1) / kRabitqAlign * kRabitqAlign;
  // The signs come from the raw engine output (its top bit), which the standard fixes for every
  // platform, not from a distribution (whose algorithm is the library's choice).
  std::mt19937_64 rng(seed);
  const std::size_t block = pow2_floor(padded_);
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  signs_.resize(kRounds * padded_);
  for (unsigned r = 0; r < kRounds; ++r) {
    const std::size_t start = r % 2 ? padded_ - block : 0;
    for (std::size_t d = 0; d < padded_; ++d) {
      const float sign = (rng() >> 63) ? -1.0f : 1.0f;
      signs_[r * padded_ + d] = d >= start && d < start + block ? sign * norm : sign;
    }
  }
}

namespace {
using FwhtFn = void (*)(float*, const float*, std::size_t);
// The transform of the active SIMD level: the same floats at every level, so codes written at
// one level and queries prepared at another agree.
FwhtFn active_fwht() {
#if defined(KBCORE_HAVE_X86_KERNELS)
  if (active_simd_level() != SimdLevel::kScalar) return detail::rabitq_fwht_avx2;
#endif
  return fwht;
}
}  // namespace

void RabitqCodes::rotate(float* v) const {
  const std::size_t block = pow2_floor(padded_);
  const FwhtFn transform = active_fwht();
  for (unsigned r = 0; r < kRounds; ++r) {
    const float* f = signs_.data() + r * padded_;
    const std::size_t start = r % 2 ? padded_ - block : 0;
    for (std::size_t d = 0; d < start; ++d) v[d] *= f[d];  // the signs outside the block
    for (std::size_t d = start + block; d < padded_; ++d) v[d] *= f[d];
    transform(v + start, f + start, block);
    if (block != padded_ && r + 1 < kRounds) butterfly(v, padded_);
  }
}

void RabitqCodes::rotate_inverse(float* v) const {
  // Each step is orthogonal; the transpose of H diag(f) (H unnormalised, f holding H's
  // 1 / sqrt(block)) is diag(f) H, so the steps run backwards with the same tables.
  const std::size_t block = pow2_floor(padded_);
  std::vector<float> unit(block, 1.0f);
  for (unsigned r = kRounds; r-- > 0;) {
    if (block != padded_ && r + 1 < kRounds) butterfly(v, padded_);
    fwht(v + (r % 2 ? padded_ - block : 0), unit.data(), block);
    const float* f = signs_.data() + r * padded_;
    for (std::size_t d = 0; d < padded_; ++d) v[d] *= f[d];
  }
}

void RabitqCodes::train(const float* rows, std::size_t n, std::size_t max_sample) {
  if (n == 0) throw InvalidArgument("rabitq: cannot train the quantizer on zero rows");
  const std::size_t sample = std::max<std::size_t>(1, std::min(n, max_sample));
  std::vector<double> sum(dim_, 0.0);
  for (std::size_t i = 0; i < sample; ++i) {
    const std::size_t row = sample == n ? i : i * (n / sample);
    const float* x = rows + row * dim_;
    for (std::size_t d = 0; d < dim_; ++d) {
      if (!std::isfinite(x[d])) throw InvalidArgument("rabitq: training rows contain NaN or infinity");
      sum[d] += x[d];
    }
  }
  std::vector<float> c(dim_);
  for (std::size_t d = 0; d < dim_; ++d) c[d] = static_cast<float>(sum[d] / static_cast<double>(sample));
  centroid_ = std::move(c);
  trained_ = true;
}

void RabitqCodes::resize(std::size_t slots) {
  rows_.resize(slots * stride_, 0);
  slots_ = slots;
}

void RabitqCodes::permute_slots(const std::vector<std::uint32_t>& new_to_old) {
  if (new_to_old.size() != slots_ || rows_.size() != slots_ * stride_) {
    throw InvalidArgument("rabitq: a slot permutation of " + std::to_string(new_to_old.size()) + " slots for " +
                          std::to_string(slots_) + " rows");
  }
  permute_rows(rows_, stride_, new_to_old);
}

void RabitqCodes::encode(std::uint32_t s, const float* x) {
  if (!trained_) throw InvalidArgument("rabitq: the quantizer is not trained");
  if (s >= slots_) throw InvalidArgument("rabitq: slot out of range");
  // Per-thread scratch: encode runs concurrently for distinct slots.
  thread_local std::vector<float> scratch;
  scratch.resize(padded_);
  float* r = scratch.data();
  for (std::size_t d = 0; d < dim_; ++d) r[d] = x[d] - centroid_[d];
  std::fill(r + dim_, r + padded_, 0.0f);
  rotate(r);
  double n2 = 0;
  for (std::size_t d = 0; d < padded_; ++d) n2 += static_cast<double>(r[d]) * r[d];
  if (!std::isfinite(n2)) throw InvalidArgument("rabitq: the encoded vector contains NaN or infinity");

  std::uint8_t* row = rows_.mutable_data() + static_cast<std::size_t>(s) * stride_;
  std::memset(row, 0, stride_);
  const unsigned container = rabitq_container_bits(bits_);
  const int half = 1 << (bits_ - 1);
  float constants[kRowConstants] = {0, 0, 0};
  if (n2 == 0) {
    // x is the centroid: F_x = 0 makes the estimate exact (c0, plus |r|^2 = 0 for L2) whatever
    // the code; the code is the middle value, y = +1/2.
    for (std::size_t d = 0; d < padded_; ++d) put_code(row, container, d, static_cast<unsigned>(half));
    std::memcpy(row + code_bytes_, constants, kConstantBytes);
    return;
  }
  const double norm = std::sqrt(n2);
  const float inv = static_cast<float>(1.0 / norm);
  for (std::size_t d = 0; d < padded_; ++d) r[d] *= inv;  // o = r / |r|
  const float t = bits_ == 1 ? 1.0f : best_scale(r, padded_, half);
  double yo = 0, yy = 0;
  for (std::size_t d = 0; d < padded_; ++d) {
    // One bit: the sign (o_d >= 0 -> 1), the same as the scaled rule at any t.
    const int u = bits_ == 1 ? (r[d] >= 0 ? 1 : 0) : floor_clamp(t * r[d], -half, half - 1) + half;
    put_code(row, container, d, static_cast<unsigned>(u));
    const double y = static_cast<double>(u - half) + 0.5;
    yo += y * r[d];
    yy += y * y;
  }
  // Each y_d has the sign of o_d (or o_d = 0), so <y, o> > 0 for a unit o.
  const double ip = std::min(1.0, yo / std::sqrt(yy));
  const double f = yo > 0 ? norm / yo : 0.0;
  const double e = ip > 0 ? norm * std::sqrt(std::max(0.0, 1.0 - ip * ip)) / ip : 0.0;
  constants[0] = static_cast<float>(f);
  constants[1] = static_cast<float>(n2);
  constants[2] = static_cast<float>(e);
  for (float& v : constants) {
    if (!std::isfinite(v)) throw InvalidArgument("rabitq: the encoded vector is too large to quantize");
  }
  std::memcpy(row + code_bytes_, constants, kConstantBytes);
}

void RabitqCodes::decode(std::uint32_t s, float* out) const {
  const std::uint8_t* row = code(s);
  float f = 0;
  std::memcpy(&f, row + code_bytes_, sizeof(float));
  const unsigned container = rabitq_container_bits(bits_);
  const float kappa = 0.5f - static_cast<float>(1u << (bits_ - 1));
  std::vector<float> v(padded_);
  for (std::size_t d = 0; d < padded_; ++d) v[d] = f * (static_cast<float>(code_at(row, container, d)) + kappa);
  rotate_inverse(v.data());
  for (std::size_t d = 0; d < dim_; ++d) out[d] = (trained_ ? centroid_[d] : 0.0f) + v[d];
}

void RabitqCodes::prepare(const float* q, RabitqQuery& out) const {
  out.qi.resize(padded_);
  out.rotated.resize(padded_);
  const bool l2 = metric_ == Metric::kL2;
  float* v = out.rotated.data();
  const float* c = centroid_.data();
  const bool has_c = trained_;
  // Reductions in kLanes independent float accumulators (element d in lane d % kLanes, summed
  // in lane order), so that they vectorise without reassociation; the SSE2 paths compute the
  // same lanes with the same operations.
  constexpr std::size_t kLanes = 8;
  float cacc[kLanes] = {};  // |q - c|^2 (L2) or <c, q>
  const auto step = [&](std::size_t d, std::size_t l) {
    const float cd = has_c ? c[d] : 0.0f;
    v[d] = l2 ? q[d] - cd : q[d];
    cacc[l] += l2 ? v[d] * v[d] : cd * q[d];
  };
  std::size_t d0 = 0;
#if defined(__SSE2__)
  if (has_c) {
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
    for (; d0 + kLanes <= dim_; d0 += kLanes) {
      const __m128 q0 = _mm_loadu_ps(q + d0), q1 = _mm_loadu_ps(q + d0 + 4);
      const __m128 k0 = _mm_loadu_ps(c + d0), k1 = _mm_loadu_ps(c + d0 + 4);
      if (l2) {
        const __m128 s0 = _mm_sub_ps(q0, k0), s1 = _mm_sub_ps(q1, k1);
        _mm_storeu_ps(v + d0, s0);
        _mm_storeu_ps(v + d0 + 4, s1);
        a0 = _mm_add_ps(a0, _mm_mul_ps(s0, s0));
        a1 = _mm_add_ps(a1, _mm_mul_ps(s1, s1));
      } else {
        _mm_storeu_ps(v + d0, q0);
        _mm_storeu_ps(v + d0 + 4, q1);
        a0 = _mm_add_ps(a0, _mm_mul_ps(k0, q0));
        a1 = _mm_add_ps(a1, _mm_mul_ps(k1, q1));
      }
    }
    _mm_storeu_ps(cacc, a0);
    _mm_storeu_ps(cacc + 4, a1);
  }
#endif
  for (; d0 + kLanes <= dim_; d0 += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) step(d0 + l, l);
  }
  for (std::size_t l = 0; d0 < dim_; ++d0, ++l) step(d0, l);
  std::fill(v + dim_, v + padded_, 0.0f);
  rotate(v);
  float macc[kLanes] = {}, nacc[kLanes] = {};
#if defined(__SSE2__)
  {
    const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 m0 = _mm_setzero_ps(), m1 = _mm_setzero_ps(), n0 = _mm_setzero_ps(), n1 = _mm_setzero_ps();
    for (std::size_t d = 0; d < padded_; d += kLanes) {
      const __m128 x0 = _mm_loadu_ps(v + d), x1 = _mm_loadu_ps(v + d + 4);
      m0 = _mm_max_ps(m0, _mm_and_ps(x0, abs_mask));
      m1 = _mm_max_ps(m1, _mm_and_ps(x1, abs_mask));
      n0 = _mm_add_ps(n0, _mm_mul_ps(x0, x0));
      n1 = _mm_add_ps(n1, _mm_mul_ps(x1, x1));
    }
    _mm_storeu_ps(macc, m0);
    _mm_storeu_ps(macc + 4, m1);
    _mm_storeu_ps(nacc, n0);
    _mm_storeu_ps(nacc + 4, n1);
  }
#else
  for (std::size_t d = 0; d < padded_; d += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) {
      const float x = v[d + l], ax = std::fabs(x);
      macc[l] = macc[l] < ax ? ax : macc[l];
      nacc[l] += x * x;
    }
  }
#endif
  float constant = 0, amax = 0, n2 = 0;
  for (std::size_t l = 0; l < kLanes; ++l) {
    constant += cacc[l];
    amax = std::max(amax, macc[l]);
    n2 += nacc[l];
  }
  const std::int32_t limit = rabitq_query_limit(rabitq_container_bits(bits_), padded_);
  const float flim = static_cast<float>(limit);
  float a = amax > 0 ? amax / flim : 0.0f;
  float inv = a > 0 ? 1.0f / a : 0.0f;
  if (!std::isfinite(inv)) a = 0.0f, inv = 0.0f;
  std::int16_t* qi = out.qi.data();
  // |sum qi| <= padded * limit < 2^31 (the limit bounds the dot product of the largest code).
  std::int32_t sum = 0;
#if defined(__SSE2__)
  {
    // _mm_cvtps_epi32 rounds to nearest even (the default mode, which nothing here changes),
    // as round_small does.
    const __m128 iv = _mm_set1_ps(inv), lo = _mm_set1_ps(-flim), hi = _mm_set1_ps(flim);
    __m128i acc = _mm_setzero_si128();
    for (std::size_t d = 0; d < padded_; d += kLanes) {
      const __m128 x0 = _mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_loadu_ps(v + d), iv), lo), hi);
      const __m128 x1 = _mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_loadu_ps(v + d + 4), iv), lo), hi);
      const __m128i i0 = _mm_cvtps_epi32(x0), i1 = _mm_cvtps_epi32(x1);
      acc = _mm_add_epi32(acc, _mm_add_epi32(i0, i1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qi + d), _mm_packs_epi32(i0, i1));
    }
    std::int32_t lanes[4];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), acc);
    sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  }
#else
  for (std::size_t d = 0; d < padded_; ++d) {
    float x = v[d] * inv;
    x = x < -flim ? -flim : x;
    x = x > flim ? flim : x;
    qi[d] = static_cast<std::int16_t>(static_cast<std::int32_t>(round_small(x)));
    sum += qi[d];
  }
#endif
  // sum q' as a * sum qi, consistent with the integer dot (whose query is a * qi too).
  const float kappa = 0.5f - static_cast<float>(1u << (bits_ - 1));
  const float qsum = a * static_cast<float>(sum);
  const float err = kRabitqEpsilon0 * std::sqrt(n2) / std::sqrt(static_cast<float>(padded_ - 1));
  if (l2) {
    out.c0 = constant;
    out.c1 = -2.0f * a;
    out.c2 = -2.0f * kappa * qsum;
    out.err = 2.0f * err;
  } else {
    out.c0 = 1.0f - constant;
    out.c1 = -a;
    out.c2 = -kappa * qsum;
    out.err = err;
  }
}

inline float RabitqCodes::estimate(std::int32_t dot, const RabitqQuery& q, const std::uint8_t* row) const {
  float f[2];
  std::memcpy(f, row + code_bytes_, sizeof(f));
  const float d = q.c0 + f[0] * (q.c1 * static_cast<float>(dot) + q.c2);
  return metric_ == Metric::kL2 ? d + f[1] : d;
}

float RabitqCodes::distance(const RabitqKernels& k, const RabitqQuery& q, std::uint32_t s) const {
  const std::uint8_t* row = code(s);
  return estimate(k.dot(q.qi.data(), row, padded_), q, row);
}

void RabitqCodes::distance4(const RabitqKernels& k, const RabitqQuery& q, const std::uint32_t* slots,
                            float* out) const {
  const std::uint8_t* rows[4] = {code(slots[0]), code(slots[1]), code(slots[2]), code(slots[3])};
  std::int32_t dots[4];
  k.dot4(q.qi.data(), rows, padded_, dots);
  for (int j = 0; j < 4; ++j) out[j] = estimate(dots[j], q, rows[j]);
}

float RabitqCodes::error_bound(const RabitqQuery& q, std::uint32_t s) const {
  float e = 0;
  std::memcpy(&e, code(s) + code_bytes_ + 2 * sizeof(float), sizeof(float));
  return q.err * e;
}

std::size_t RabitqCodes::memory_bytes() const {
  return rows_.heap_bytes() + (centroid_.capacity() + signs_.capacity()) * sizeof(float);
}

void RabitqCodes::save(BinaryWriter& w) const {
  w.u64(dim_);
  w.u64(padded_);
  w.u8(static_cast<std::uint8_t>(bits_));
  w.u64(seed_);
  w.u8(trained_ ? 1 : 0);
  if (trained_) w.array(centroid_.data(), dim_);
  w.u64(slots_);
  // Rows as raw bytes: the float constants inside are in native byte order (little-endian on
  // every platform the kernels build for), aligned so that load reads them in place (format
  // version 7 on).
  if (w.version() >= Index::kFormatVersionAligned) w.pad_to(kRowsAlign);
  w.array(rows_.data(), slots_ * stride_);
}

void RabitqCodes::load(BinaryReader& r) {
  const std::uint64_t dim = r.u64();
  const std::uint64_t padded = r.u64();
  if (dim != dim_ || padded != padded_) {
    r.fail("rabitq section: dimension " + std::to_string(dim) + " / padded " + std::to_string(padded) +
           " does not match the index's " + std::to_string(dim_) + " / " + std::to_string(padded_));
  }
  const std::uint8_t bits = r.u8();
  if (bits != bits_) {
    r.fail("rabitq section: codes of " + std::to_string(bits) + " bits, the index is configured with " +
           std::to_string(bits_));
  }
  const std::uint64_t seed = r.u64();
  const std::uint8_t trained_flag = r.u8();
  if (trained_flag > 1) r.fail("rabitq section: trained flag is not 0 or 1");
  RabitqCodes fresh(dim_, metric_, bits_, seed);
  if (trained_flag) {
    r.array(fresh.centroid_, dim_);
    for (float v : fresh.centroid_) {
      if (!std::isfinite(v)) r.fail("rabitq section: centroid is NaN or infinite");
    }
    fresh.trained_ = true;
  }
  const std::uint64_t slots = r.u64();
  if (slots > r.remaining() / stride_) r.fail("rabitq section: row count exceeds the file");
  if (!trained_flag && slots != 0) r.fail("rabitq section: rows stored for an untrained quantizer");
  // Version 7 aligns the rows to a 64-byte file offset: from a mapped file they are read in
  // place (checked below, not copied); the first write copies them to the heap.
  if (r.version() >= Index::kFormatVersionAligned) r.skip_padding(kRowsAlign);
  r.require(slots * stride_, 1);
  if (r.bytes()->mapped() && reinterpret_cast<std::uintptr_t>(r.here()) % kRowsAlign == 0) {
    fresh.rows_.use_mapped(r.bytes(), r.here(), slots * stride_);
    fresh.slots_ = slots;
    r.skip(slots * stride_, 1);
  } else {
    fresh.resize(slots);
    r.array_into(fresh.rows_.mutable_data(), slots * stride_);
  }
  const unsigned container = rabitq_container_bits(bits_);
  // Every dimension of the padded code carries data (the rotation mixes the zero padding of x
  // in), so the check per code value is only that it uses no more than its bits.
  const unsigned limit = 1u << bits_;
  for (std::size_t s = 0; s < slots; ++s) {
    const std::uint8_t* row = fresh.code(static_cast<std::uint32_t>(s));
    if (container == 4 && bits_ < 4) {
      for (std::size_t i = 0; i < fresh.code_bytes_; ++i) {
        if ((row[i] & 15u) >= limit || (row[i] >> 4) >= limit) {
          r.fail("rabitq section: code value above " + std::to_string(bits_) + " bits in row " + std::to_string(s));
        }
      }
    } else if (container == 8 && bits_ < 8) {
      for (std::size_t i = 0; i < fresh.code_bytes_; ++i) {
        if (row[i] >= limit) {
          r.fail("rabitq section: code value above " + std::to_string(bits_) + " bits in row " + std::to_string(s));
        }
      }
    }
    float constants[kRowConstants];
    std::memcpy(constants, row + fresh.code_bytes_, kConstantBytes);
    for (float v : constants) {
      if (!std::isfinite(v) || v < 0) {
        r.fail("rabitq section: row constant is negative, NaN or infinite in row " + std::to_string(s));
      }
    }
    for (std::size_t i = fresh.code_bytes_ + kConstantBytes; i < stride_; ++i) {
      if (row[i] != 0) r.fail("rabitq section: nonzero padding byte in row " + std::to_string(s));
    }
  }
  *this = std::move(fresh);
}

}  // namespace kbcore
