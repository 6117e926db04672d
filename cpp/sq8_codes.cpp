// SQ8 training, encoding, query preparation, persistence and kernel dispatch (sq8_codes.h).
#include "sq8_codes.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "binary_io.h"
#include "errors.h"
#include "index.h"
#include "parallel.h"

namespace kbcore {
namespace {

// Round to nearest, ties to even, for |v| <= 2^22: adding and subtracting 1.5 * 2^23 leaves
// the rounded value (IEEE addition rounds in the default mode, which nothing here changes).
// Equal to std::nearbyint on that range, but inline: without SSE4.1 (the portable baseline)
// nearbyint is a libm call per dimension, which dominated query preparation and encoding.
inline float round_small(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

}  // namespace

const Sq8Kernels& sq8_kernels_for(SimdLevel level) {
  switch (level) {
#if defined(KBCORE_HAVE_X86_KERNELS)
    case SimdLevel::kAvx2:
      return detail::sq8_avx2_kernels();
    case SimdLevel::kAvx512: {
      static const bool vnni = __builtin_cpu_supports("avx512vnni");
      return vnni ? detail::sq8_avx512vnni_kernels() : detail::sq8_avx512_kernels();
    }
#endif
    default:
      return detail::sq8_scalar_kernels();
  }
}

Sq8Codes::Sq8Codes(std::size_t dim, Metric metric) : dim_(dim), stride_(sq8_stride(dim)), metric_(metric) {
  if (dim == 0) throw InvalidArgument("sq8: dim must be positive");
}

void Sq8Codes::train(const float* rows, std::size_t n, std::size_t max_sample) {
  if (n == 0) throw InvalidArgument("sq8: cannot train the quantizer on zero rows");
  const std::size_t sample = std::max<std::size_t>(1, std::min(n, max_sample));
  std::vector<float> lo(dim_, INFINITY), hi(dim_, -INFINITY);
  for (std::size_t i = 0; i < sample; ++i) {
    const std::size_t row = sample == n ? i : i * (n / sample);
    const float* x = rows + row * dim_;
    for (std::size_t d = 0; d < dim_; ++d) {
      if (!std::isfinite(x[d])) throw InvalidArgument("sq8: training rows contain NaN or infinity");
      lo[d] = std::min(lo[d], x[d]);
      hi[d] = std::max(hi[d], x[d]);
    }
  }
  std::vector<float> scale(dim_);
  for (std::size_t d = 0; d < dim_; ++d) scale[d] = (hi[d] - lo[d]) / 255.0f;
  set_params(std::move(lo), std::move(scale));
}

void Sq8Codes::set_params(std::vector<float> lo, std::vector<float> scale) {
  if (lo.size() != dim_ || scale.size() != dim_) {
    throw InvalidArgument("sq8: quantizer parameters have " + std::to_string(lo.size()) + " / " +
                          std::to_string(scale.size()) + " entries, expected " + std::to_string(dim_));
  }
  std::vector<float> inv(dim_);
  for (std::size_t d = 0; d < dim_; ++d) {
    if (!std::isfinite(lo[d]) || !std::isfinite(scale[d]) || scale[d] < 0 ||
        !std::isfinite(lo[d] + 255.0f * scale[d])) {
      throw InvalidArgument("sq8: quantizer parameter of dimension " + std::to_string(d) +
                            " is negative, NaN or infinite");
    }
    inv[d] = scale[d] > 0 ? 1.0f / scale[d] : 0.0f;
    if (!std::isfinite(inv[d])) inv[d] = 0.0f, scale[d] = 0.0f;
  }
  lo_ = std::move(lo);
  scale_ = std::move(scale);
  inv_scale_ = std::move(inv);
}

void Sq8Codes::resize(std::size_t slots) {
  codes_.resize(slots * stride_, 0);
  if (metric_ == Metric::kL2) terms_.resize(slots, 0.0f);
  slots_ = slots;
}

void Sq8Codes::permute_slots(const std::vector<std::uint32_t>& new_to_old) {
  if (new_to_old.size() != slots_ || codes_.size() != slots_ * stride_) {
    throw InvalidArgument("sq8: a slot permutation of " + std::to_string(new_to_old.size()) + " slots for " +
                          std::to_string(slots_) + " code rows");
  }
  permute_rows(codes_, stride_, new_to_old);
  if (terms_.size() == slots_) permute_rows_in_place(terms_.data(), 1, new_to_old);
}

float Sq8Codes::encode_to(const float* x, std::uint8_t* out) const {
  if (!trained()) throw InvalidArgument("sq8: the quantizer is not trained");
  float term = 0;
  for (std::size_t d = 0; d < dim_; ++d) {
    // Clamped before rounding (the same code as rounding first: the bounds are integers),
    // so that round_small sees only [0, 255].
    float c = (x[d] - lo_[d]) * inv_scale_[d];
    if (!(c > 0)) c = 0;  // also maps NaN to 0
    if (c > 255) c = 255;
    c = round_small(c);
    out[d] = static_cast<std::uint8_t>(c);
    const float v = scale_[d] * c;
    term += v * v;
  }
  std::memset(out + dim_, 0, stride_ - dim_);
  return term;
}

void Sq8Codes::encode(std::uint32_t s, const float* x) {
  if (s >= slots_) throw InvalidArgument("sq8: slot out of range");
  const float t = encode_to(x, codes_.mutable_data() + static_cast<std::size_t>(s) * stride_);
  if (metric_ == Metric::kL2) terms_[s] = t;
}

void Sq8Codes::decode(std::uint32_t s, float* out) const {
  const std::uint8_t* c = code(s);
  for (std::size_t d = 0; d < dim_; ++d) out[d] = lo_[d] + scale_[d] * static_cast<float>(c[d]);
}

namespace {

// Lanes of the per-query reductions below: eight independent float accumulators (two SSE
// registers at the portable baseline), so that the loops vectorise without -ffast-math. The
// order is fixed: element d goes to lane d % kLanes, and the lanes are summed 0..kLanes-1.
constexpr std::size_t kLanes = 8;

float sum_lanes(const float (&acc)[kLanes]) {
  float s = 0;
  for (std::size_t l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// The query folded with the quantizer: (q - lo) * scale for L2, q * scale otherwise. Returns
// the constant term (|q - lo|^2 for L2, sum q * lo otherwise) and the largest |folded| value.
template <bool kL2>
void fold_query(const float* __restrict q, const float* __restrict lo, const float* __restrict scale, std::size_t dim,
                float* __restrict folded, float& constant, float& amax) {
  float acc[kLanes] = {};
  float mx[kLanes] = {};
  std::size_t d = 0;
  const auto step = [&](std::size_t i, std::size_t l) {
    const float shifted = kL2 ? q[i] - lo[i] : q[i];
    acc[l] += kL2 ? shifted * shifted : q[i] * lo[i];
    const float f = shifted * scale[i];
    folded[i] = f;
    const float af = std::fabs(f);
    mx[l] = mx[l] < af ? af : mx[l];
  };
#if defined(__SSE2__)
  // The same lanes in two SSE registers (the compiler does not vectorise the loop below by
  // itself): the same operations per lane, so the same results as the portable loop (the
  // values are finite, where max and the comparison above agree).
  __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps(), mx0 = _mm_setzero_ps(), mx1 = _mm_setzero_ps();
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  for (; d + kLanes <= dim; d += kLanes) {
    const __m128 q0 = _mm_loadu_ps(q + d), q1 = _mm_loadu_ps(q + d + 4);
    const __m128 l0 = _mm_loadu_ps(lo + d), l1 = _mm_loadu_ps(lo + d + 4);
    const __m128 s0 = kL2 ? _mm_sub_ps(q0, l0) : q0;
    const __m128 s1 = kL2 ? _mm_sub_ps(q1, l1) : q1;
    acc0 = _mm_add_ps(acc0, kL2 ? _mm_mul_ps(s0, s0) : _mm_mul_ps(q0, l0));
    acc1 = _mm_add_ps(acc1, kL2 ? _mm_mul_ps(s1, s1) : _mm_mul_ps(q1, l1));
    const __m128 f0 = _mm_mul_ps(s0, _mm_loadu_ps(scale + d));
    const __m128 f1 = _mm_mul_ps(s1, _mm_loadu_ps(scale + d + 4));
    _mm_storeu_ps(folded + d, f0);
    _mm_storeu_ps(folded + d + 4, f1);
    mx0 = _mm_max_ps(mx0, _mm_and_ps(f0, abs_mask));
    mx1 = _mm_max_ps(mx1, _mm_and_ps(f1, abs_mask));
  }
  _mm_storeu_ps(acc, acc0);
  _mm_storeu_ps(acc + 4, acc1);
  _mm_storeu_ps(mx, mx0);
  _mm_storeu_ps(mx + 4, mx1);
#else
  for (; d + kLanes <= dim; d += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) step(d + l, l);
  }
#endif
  for (std::size_t l = 0; d < dim; ++d, ++l) step(d, l);
  constant = sum_lanes(acc);
  amax = 0;
  for (std::size_t l = 0; l < kLanes; ++l) amax = std::max(amax, mx[l]);
}

}  // namespace

void Sq8Codes::prepare(const float* q, Sq8Query& out) const {
  // The folded query goes into qi's own storage first (stride int16 = stride / 2 floats is
  // too small), so it uses a per-thread float buffer: no allocation per query once grown.
  out.qi.resize(stride_);
  out.folded.resize(dim_);
  const bool l2 = metric_ == Metric::kL2;
  float constant = 0, amax = 0;
  float* folded = out.folded.data();
  if (l2) {
    fold_query<true>(q, lo_.data(), scale_.data(), dim_, folded, constant, amax);
  } else {
    fold_query<false>(q, lo_.data(), scale_.data(), dim_, folded, constant, amax);
  }
  const std::int32_t limit = std::min(kSq8QueryMax, sq8_query_limit(stride_));
  const float a = amax > 0 ? amax / static_cast<float>(limit) : 0.0f;
  const float inv = a > 0 ? 1.0f / a : 0.0f;
  const float flim = static_cast<float>(limit);
  std::int16_t* qi = out.qi.data();
  for (std::size_t d = 0; d < dim_; ++d) {
    float v = folded[d] * inv;
    v = v < -flim ? -flim : v;
    v = v > flim ? flim : v;
    qi[d] = static_cast<std::int16_t>(static_cast<std::int32_t>(round_small(v)));
  }
  std::fill(out.qi.begin() + static_cast<std::ptrdiff_t>(dim_), out.qi.end(), std::int16_t{0});
  out.q8.resize(stride_);
  for (std::size_t d = 0; d < stride_; ++d) out.q8[d] = static_cast<std::int8_t>(qi[d]);
  if (l2) {
    out.c0 = constant;
    out.c1 = -2.0f * a;
    out.c2 = 1.0f;
  } else {
    out.c0 = 1.0f - constant;
    out.c1 = -a;
    out.c2 = 0.0f;
  }
}

std::size_t Sq8Codes::memory_bytes() const {
  return codes_.heap_bytes() + terms_.capacity() * sizeof(float) + 3 * dim_ * sizeof(float);
}

void Sq8Codes::save(BinaryWriter& w) const {
  w.u64(dim_);
  w.u64(stride_);
  w.u8(trained() ? 1 : 0);
  if (trained()) {
    w.array(lo_.data(), dim_);
    w.array(scale_.data(), dim_);
  }
  w.u64(slots_);
  // Aligned from version 7 on, so that load reads the codes in place.
  if (w.version() >= Index::kFormatVersionAligned) w.pad_to(kSq8Align);
  w.array(codes_.data(), slots_ * stride_);
}

void Sq8Codes::load(BinaryReader& r) {
  const std::uint64_t dim = r.u64();
  const std::uint64_t stride = r.u64();
  if (dim != dim_ || stride != stride_) r.fail("sq8 section: dimension or stride does not match the index");
  const std::uint8_t trained_flag = r.u8();
  if (trained_flag > 1) r.fail("sq8 section: trained flag is not 0 or 1");
  std::vector<float> lo, scale;
  if (trained_flag) {
    r.array(lo, dim_);
    r.array(scale, dim_);
  }
  const std::uint64_t slots = r.u64();
  if (slots > r.remaining() / stride_) r.fail("sq8 section: code count exceeds the file");
  if (!trained_flag && slots != 0) r.fail("sq8 section: codes stored for an untrained quantizer");
  Sq8Codes fresh(dim_, metric_);
  if (trained_flag) {
    try {
      fresh.set_params(std::move(lo), std::move(scale));
    } catch (const InvalidArgument& e) {
      r.fail(std::string("sq8 section: ") + e.what());
    }
  }
  // Version 7 aligns the codes to a 64-byte file offset: from a mapped file they are read in
  // place (checked, not copied), so that a reopen neither copies them nor has the kernel zero
  // the pages of a copy; the first write copies them to the heap (mapped_array.h).
  if (r.version() >= Index::kFormatVersionAligned) r.skip_padding(kSq8Align);
  r.require(slots * stride_, 1);
  const unsigned char* src = r.here();
  const bool in_place = r.bytes()->mapped() && reinterpret_cast<std::uintptr_t>(src) % kSq8Align == 0;
  if (in_place) {
    fresh.codes_.use_mapped(r.bytes(), src, slots * stride_);
    if (metric_ == Metric::kL2) fresh.terms_.resize(slots, 0.0f);
    fresh.slots_ = slots;
  } else {
    fresh.resize(slots);
  }
  r.skip(slots * stride_, 1);
  // Copied (unless read in place) and checked a block of rows at a time (the checks read rows
  // still in cache), on the hardware's threads once the codes pass 4 MiB; the first failure is
  // rethrown here.
  constexpr std::size_t kBlockRows = 1024;
  const std::size_t blocks = (slots + kBlockRows - 1) / kBlockRows;
  const std::size_t threads = slots * stride_ >= (std::size_t{4} << 20) ? 0 : 1;
  std::uint8_t* dst = in_place ? nullptr : fresh.codes_.mutable_data();
  parallel_for(blocks, threads, [&](std::size_t b, std::size_t) {
    const std::size_t begin = b * kBlockRows;
    const std::size_t end = std::min<std::size_t>(slots, begin + kBlockRows);
    if (dst != nullptr && end > begin) {
      std::memcpy(dst + begin * stride_, src + begin * stride_, (end - begin) * stride_);
    }
    for (std::size_t s = begin; s < end; ++s) {
      const std::uint8_t* c = fresh.code(static_cast<std::uint32_t>(s));
      for (std::size_t d = dim_; d < stride_; ++d) {
        if (c[d] != 0) r.fail("sq8 section: nonzero padding byte in a code row");
      }
      if (metric_ == Metric::kL2) {
        float term = 0;
        for (std::size_t d = 0; d < dim_; ++d) {
          const float v = fresh.scale_[d] * static_cast<float>(c[d]);
          term += v * v;
        }
        fresh.terms_[s] = term;
      }
    }
  });
  *this = std::move(fresh);
}

}  // namespace kbcore
