#pragma once
// SQ8: per-dimension affine 8-bit scalar quantization of the stored rows, so that a graph
// traversal reads dim bytes per visited node instead of 4 * dim (the float32 row stays for
// the exact re-rank of the best candidates).
//
// A row x is encoded per dimension d as c_d = clamp(round((x_d - lo_d) / scale_d), 0, 255)
// with lo/scale trained from a sample (min/max per dimension); values outside the trained
// range are clipped. A query is folded with the scales (in float32, not clipped to any
// trained range) and rounded to integers in [-127, 127] with one per-query factor a, and the
// distance comes from an exact integer dot product of that query with the uint8 code plus
// per-query and per-row constants:
//   inner product / cosine: dot(q, x) ~= sum_d q_d lo_d + a * sum_d qi_d c_d
//   squared L2:             |q - x|^2 ~= |q - lo|^2 - 2 a * sum_d qi_d c_d + |scale * c|^2
// The integer sum is exact, so every SIMD level (scalar, AVX2 and AVX-512 on the query
// widened to int16, AVX-512 VNNI on it as int8) gives bit-identical distances; the query's
// range is bounded so that the int32 sum cannot overflow.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "aligned.h"
#include "code_traits.h"
#include "distance.h"
#include "mapped_array.h"

namespace kbcore {

class BinaryReader;
class BinaryWriter;

/// Codes are padded with zeros to a multiple of this many bytes (one cache line), so the
/// kernels need no tail and every row starts on a cache line.
inline constexpr std::size_t kSq8Align = 64;

/// sum_i q[i] * c[i] for i < stride (stride a multiple of kSq8Align), exact in int32.
using Sq8DotFn = std::int32_t (*)(const std::int16_t* q, const std::uint8_t* code, std::size_t stride);
/// The same for four codes at once: out[j] = dot(q, codes[j]).
using Sq8Dot4Fn = void (*)(const std::int16_t* q, const std::uint8_t* const* codes, std::size_t stride,
                           std::int32_t* out);

/// sum_i q[i] * c[i] for a query whose entries fit in int8 (|q[i]| <= kSq8QueryMax).
using Sq8DotI8Fn = std::int32_t (*)(const std::int8_t* q, const std::uint8_t* code, std::size_t stride);
using Sq8Dot4I8Fn = void (*)(const std::int8_t* q, const std::uint8_t* const* codes, std::size_t stride,
                             std::int32_t* out);

struct Sq8Kernels {
  Sq8DotFn dot;
  Sq8Dot4Fn dot4;
  const char* name;  ///< "scalar" | "avx2" | "avx512" | "avx512vnni"
  /// The same sums from an int8 copy of the query, where the level multiplies uint8 by int8
  /// directly (AVX-512 VNNI's VPDPBUSD: 64 codes per instruction, none widened); nullptr
  /// elsewhere. Equal to dot / dot4 on the same query values.
  Sq8DotI8Fn dot_i8;
  Sq8Dot4I8Fn dot4_i8;
};

/// Kernels of a SIMD level (AVX-512 uses VNNI when the CPU reports avx512vnni). The level
/// must be one supported_simd_levels() lists.
const Sq8Kernels& sq8_kernels_for(SimdLevel level);
/// Kernels of the level currently in use (active_simd_level()).
inline const Sq8Kernels& sq8_active_kernels() { return sq8_kernels_for(active_simd_level()); }

namespace detail {
const Sq8Kernels& sq8_scalar_kernels();
#if defined(KBCORE_HAVE_X86_KERNELS)
const Sq8Kernels& sq8_avx2_kernels();
const Sq8Kernels& sq8_avx512_kernels();
const Sq8Kernels& sq8_avx512vnni_kernels();
#endif
}  // namespace detail

/// Bytes of one padded code row for `dim` dimensions.
inline std::size_t sq8_stride(std::size_t dim) { return (dim + kSq8Align - 1) / kSq8Align * kSq8Align; }

/// Largest |entry| of a prepared query: queries are rounded to int8's symmetric range, so that
/// a uint8 x int8 instruction takes them as they are. Rounding the query this coarsely instead
/// of to int16 moved SciFact's recall@10 by at most 0.0016 at ef 10-48 (the codes' own
/// rounding dominates), and halved the instructions per code row under AVX-512 VNNI.
inline constexpr std::int32_t kSq8QueryMax = 127;

/// A query prepared for one quantizer: distance(code, term) = c0 + c1 * dot(qi, code) + c2 * term.
struct Sq8Query {
  AlignedVector<std::int16_t> qi;  ///< stride entries, zero-padded, |qi| <= kSq8QueryMax
  AlignedVector<std::int8_t> q8;   ///< the same values as int8 (for the dot_i8 kernels)
  std::vector<float> folded;       ///< prepare's scratch: the query folded with the scales
  float c0 = 0, c1 = 0, c2 = 0;
};

/// Per-dimension affine quantizer and the codes of every slot.
class Sq8Codes {
 public:
  Sq8Codes(std::size_t dim, Metric metric);

  std::size_t dim() const { return dim_; }
  std::size_t stride() const { return stride_; }
  Metric metric() const { return metric_; }
  bool trained() const { return !lo_.empty(); }
  const std::vector<float>& lo() const { return lo_; }
  const std::vector<float>& scale() const { return scale_; }

  /// Trains lo/scale from n rows (row-major, dim floats each; at most `max_sample` of them,
  /// evenly strided, are read). A dimension whose sample is constant gets scale 0 (every code
  /// 0, decoded exactly). Throws InvalidArgument when n == 0 or a value is not finite.
  void train(const float* rows, std::size_t n, std::size_t max_sample = 65536);
  /// Sets a trained state directly (persistence); validates sizes and values.
  void set_params(std::vector<float> lo, std::vector<float> scale);

  /// Grows the code array to `slots` rows (new rows zero). Not thread-safe.
  void resize(std::size_t slots);
  /// Renumbers the code rows: row i takes the row of slot new_to_old[i] (a permutation of
  /// 0..slot_count()-1, as Index::reorder makes; sizes checked, InvalidArgument), the codes
  /// the rows would be encoded to again, moved (in place on the heap; copied once when read in
  /// place from a loaded file). Not thread-safe.
  void permute_slots(const std::vector<std::uint32_t>& new_to_old);
  std::size_t slot_count() const { return slots_; }
  /// Encodes `x` (dim floats) into slot s (< slot_count()); requires trained().
  void encode(std::uint32_t s, const float* x);
  /// Encodes into caller memory (stride bytes) and returns the row's |scale * c|^2 term.
  float encode_to(const float* x, std::uint8_t* out) const;
  const std::uint8_t* code(std::uint32_t s) const { return codes_.data() + static_cast<std::size_t>(s) * stride_; }
  /// True while the codes are read in place from the mapped index file (load of a format
  /// version 7 file; the first write copies them to the heap).
  bool codes_in_place() const { return codes_.in_place(); }
  /// Codes read in place are copied to the heap (as the first write would); else a no-op.
  void copy_codes_to_heap() { (void)codes_.mutable_data(); }
  /// Per-row constant (|scale * c|^2 for L2, 0 otherwise).
  float term(std::uint32_t s) const { return metric_ == Metric::kL2 ? terms_[s] : 0.0f; }
  /// Decodes slot s into dim floats (tests, diagnostics).
  void decode(std::uint32_t s, float* out) const;

  /// Prepares q (dim floats; for cosine already normalised) for distance().
  void prepare(const float* q, Sq8Query& out) const;
  /// Approximate distance of slot s to a prepared query under the metric.
  float distance(const Sq8Kernels& k, const Sq8Query& q, std::uint32_t s) const {
    const std::int32_t dot =
        k.dot_i8 != nullptr ? k.dot_i8(q.q8.data(), code(s), stride_) : k.dot(q.qi.data(), code(s), stride_);
    return q.c0 + q.c1 * static_cast<float>(dot) + q.c2 * term(s);
  }
  /// Distances of four slots.
  void distance4(const Sq8Kernels& k, const Sq8Query& q, const std::uint32_t* slots, float* out) const {
    const std::uint8_t* rows[4] = {code(slots[0]), code(slots[1]), code(slots[2]), code(slots[3])};
    std::int32_t dots[4];
    if (k.dot4_i8 != nullptr) {
      k.dot4_i8(q.q8.data(), rows, stride_, dots);
    } else {
      k.dot4(q.qi.data(), rows, stride_, dots);
    }
    if (metric_ == Metric::kL2) {
      for (int j = 0; j < 4; ++j) out[j] = q.c0 + q.c1 * static_cast<float>(dots[j]) + q.c2 * terms_[slots[j]];
    } else {  // term() is 0 (and c2 too): the same sum, without a term per row
      for (int j = 0; j < 4; ++j) out[j] = q.c0 + q.c1 * static_cast<float>(dots[j]) + q.c2 * 0.0f;
    }
  }

  /// Bytes held (codes, terms, parameters).
  std::size_t memory_bytes() const;
  /// Writes parameters and the codes of the first slot_count() slots.
  void save(BinaryWriter& w) const;
  /// Reads what save wrote; validates sizes, finiteness and that every padding byte is zero.
  /// From a mapped file of format version 7 on, the codes are read in place (not copied).
  void load(BinaryReader& r);

 private:
  std::size_t dim_;
  std::size_t stride_;
  Metric metric_;
  std::vector<float> lo_, scale_, inv_scale_;
  std::size_t slots_ = 0;
  MappedArray<std::uint8_t> codes_;  // slots_ * stride_, 64-byte aligned
  std::vector<float> terms_;         // per slot, L2 only
};

/// Re-rank depth when none is configured: the candidate list up to max(2k, 16) rows. The codes'
/// ordering errors move a true top-k row only a few places (on SciFact chunks a depth of 12
/// already gave the recall@10 of re-ranking the whole list at every ef from 16 to 64), so the
/// deeper rows of a long list would only be read from the float32 rows to be dropped.
inline std::size_t sq8_default_rerank(std::size_t ef, std::size_t k) {
  return std::min(std::max(ef, k), std::max<std::size_t>(2 * k, 16));
}

/// SQ8 as a code type (code_traits.h). It has no parameters.
template <>
struct CodeTraits<Sq8Codes> {
  static constexpr const char* kName = "sq8";
  static constexpr std::uint8_t kLegacyId = 1;
  using Query = Sq8Query;
  using Kernels = Sq8Kernels;
  static constexpr bool kBounded = false;
  static constexpr std::size_t kTrainRows = 1000;
  static std::vector<CodeParam> params() { return {}; }
  static Sq8Codes make(std::size_t dim, Metric metric, std::uint64_t /*seed*/, const CodeParamValues& /*values*/) {
    return Sq8Codes(dim, metric);
  }
  static CodeParamValues values(const Sq8Codes& /*codes*/) { return {}; }
  static const Kernels& kernels(const Sq8Codes& /*codes*/) { return sq8_active_kernels(); }
  static std::size_t default_rerank(std::size_t ef, std::size_t k) { return sq8_default_rerank(ef, k); }
};

/// Largest |qi| for a stride so that sum |qi| * 255 over stride entries fits in int32.
inline std::int32_t sq8_query_limit(std::size_t stride) {
  const std::int64_t lim = static_cast<std::int64_t>(2147483647) / (255 * static_cast<std::int64_t>(stride));
  return static_cast<std::int32_t>(lim < 32767 ? lim : 32767);
}

}  // namespace kbcore
