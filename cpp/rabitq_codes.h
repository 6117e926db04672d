#pragma once
// RaBitQ codes (Gao & Long, SIGMOD 2024) with the multi-bit extension (Gao et al., SIGMOD 2025):
// a graph traversal reads one short code row per visited node and estimates its distance
// without bias, with a per-row error bound; the float32 row stays for the exact re-rank.
//
// Training keeps the centroid c of a sample. A row x is stored as r = P(x - c) with P a random
// orthogonal transform of the padded dimension (seeded sign flips and fast Walsh-Hadamard
// transforms, O(D log D) per vector), its norm |r| and the unit vector o = r / |r| quantized to
// `bits` bits per dimension: u_d in [0, 2^bits), standing for y_d = u_d + 1/2 - 2^(bits-1), with
// the scale chosen to maximise <y, o> / |y|. The estimator
//   <o, q'> ~= <y, q'> / <y, o>
// is unbiased (over the random rotation) with standard deviation about
// sqrt(1 - ip^2) / ip / sqrt(D - 1) * |q'| where ip = <y, o> / |y|, so a row's error bound is
// a stored constant times a per-query one. A query q is rotated once (q' = P q for inner
// product / cosine, P (q - c) for L2), rounded to int16 with one per-query factor, and every
// distance is an exact integer dot product of that query with the code plus per-query and
// per-row float constants:
//   inner product / cosine: 1 - <x, q> ~= 1 - <c, q> - F_x (a * dot(qi, u) + kappa * sum q')
//   squared L2:             |x - q|^2  ~= |r|^2 + |q'|^2 - 2 F_x (a * dot(qi, u) + kappa * sum q')
// with F_x = |r| / <y, o> and kappa = 1/2 - 2^(bits-1). The integer sum is exact, so every SIMD
// level gives bit-identical distances.
//
// Code containers (bytes per row of the padded dimension D, a multiple of 64):
//   bits 1:     one bit per dimension (D / 8 bytes)
//   bits 2..4:  a nibble per dimension (D / 2 bytes); in each 64-dimension block of 32 bytes,
//               byte j holds dimension j in its low nibble and dimension j + 32 in its high one
//   bits 5..8:  a byte per dimension (D bytes)
// Each row is the code followed by its float constants (F_x, |r|^2, E_x), padded with zeros to
// a multiple of 64 bytes, so one visited node is one contiguous, cache-line-aligned read.
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

inline constexpr unsigned kRabitqMinBits = 1;
inline constexpr unsigned kRabitqMaxBits = 8;
/// The bits of a RaBitQ index created without an explicit choice.
inline constexpr unsigned kRabitqDefaultBits = 4;
/// Row (and padded-dimension) alignment in bytes / dimensions.
inline constexpr std::size_t kRabitqAlign = 64;
/// The constant of the error bound (the paper's epsilon_0): |estimate - exact| <= bound holds
/// for all but a vanishing share of rows. The error is close to Gaussian with the standard
/// deviation above, so epsilon_0 counts standard deviations: the paper's 1.9 leaves about 5.7%
/// of rows outside the bound (measured in test_rabitq), 3.0 about 0.3%.
inline constexpr float kRabitqEpsilon0 = 3.0f;

/// sum_d qi[d] * u[d] over the padded dimension for one code row (the container is the
/// kernel's), exact in int32.
using RabitqDotFn = std::int32_t (*)(const std::int16_t* qi, const std::uint8_t* code, std::size_t padded_dim);
/// The same for four rows: out[j] = dot(qi, codes[j]).
using RabitqDot4Fn = void (*)(const std::int16_t* qi, const std::uint8_t* const* codes, std::size_t padded_dim,
                              std::int32_t* out);

struct RabitqKernels {
  RabitqDotFn dot;
  RabitqDot4Fn dot4;
  const char* name;  ///< "scalar" | "avx2" | "avx512"
};

/// Kernels for a container (1, 4 or 8: bits 1, 2..4, 5..8) at a SIMD level supported_simd_levels() lists.
const RabitqKernels& rabitq_kernels_for(unsigned container_bits, SimdLevel level);

/// Bits of the container that holds codes of `bits` bits (1, 4 or 8).
inline unsigned rabitq_container_bits(unsigned bits) { return bits <= 1 ? 1u : bits <= 4 ? 4u : 8u; }
/// The padded dimension (a multiple of kRabitqAlign).
inline std::size_t rabitq_padded_dim(std::size_t dim) { return (dim + kRabitqAlign - 1) / kRabitqAlign * kRabitqAlign; }
/// Largest |qi| for a container and padded dimension so that sum |qi| * (2^container_bits - 1)
/// over padded_dim entries fits in int32 (at most 32767).
inline std::int32_t rabitq_query_limit(unsigned container_bits, std::size_t padded_dim) {
  const std::int64_t max_code = (std::int64_t{1} << container_bits) - 1;
  const std::int64_t lim = std::int64_t{2147483647} / (max_code * static_cast<std::int64_t>(padded_dim));
  return static_cast<std::int32_t>(lim < 32767 ? lim : 32767);
}

namespace detail {
/// Of one level's three kernel sets, the one for a container (1: `bits`, 4: `nibble`, 8:
/// `byte`); throws InvalidArgument for any other container.
const RabitqKernels& rabitq_pick_container(unsigned container_bits, const RabitqKernels& bits,
                                           const RabitqKernels& nibble, const RabitqKernels& byte);
/// The kernels of one level for a container (1, 4 or 8); rabitq_kernels_for dispatches.
const RabitqKernels& rabitq_scalar_kernels(unsigned container_bits);
#if defined(KBCORE_HAVE_X86_KERNELS)
const RabitqKernels& rabitq_avx2_kernels(unsigned container_bits);
const RabitqKernels& rabitq_avx512_kernels(unsigned container_bits);
/// v <- H diag(f) v (H the unnormalised Walsh-Hadamard transform of n >= 64 floats, a power of
/// two) in AVX2; the same floats as the portable transform in rabitq_codes.cpp.
void rabitq_fwht_avx2(float* v, const float* f, std::size_t n);
#endif
}  // namespace detail

/// A query prepared for one quantizer (see the header comment for the formula).
struct RabitqQuery {
  AlignedVector<std::int16_t> qi;  ///< padded_dim entries
  std::vector<float> rotated;      ///< prepare's scratch: the rotated query
  float c0 = 0;                    ///< 1 - <c, q> (IP / cosine) or |q'|^2 (L2)
  float c1 = 0;                    ///< -a (IP / cosine) or -2a (L2): multiplies F_x * dot
  float c2 = 0;                    ///< -kappa * sum q' (IP / cosine) or -2 kappa * sum q' (L2): multiplies F_x
  float err = 0;                   ///< error bound of row x = err * E_x
};

/// The quantizer (centroid, rotation) and the code rows of every slot.
class RabitqCodes {
 public:
  /// File offset alignment of the saved rows (format version 7), so that load reads them in
  /// place at the alignment the heap gives them.
  static constexpr std::size_t kRowsAlign = 64;
  /// bits in [kRabitqMinBits, kRabitqMaxBits]; the rotation is drawn from `seed`. Throws
  /// InvalidArgument for dim 0 or bits out of range.
  RabitqCodes(std::size_t dim, Metric metric, unsigned bits, std::uint64_t seed);

  std::size_t dim() const { return dim_; }
  std::size_t padded_dim() const { return padded_; }
  unsigned bits() const { return bits_; }
  Metric metric() const { return metric_; }
  /// Bytes of one row (code and constants, a multiple of 64).
  std::size_t stride() const { return stride_; }
  bool trained() const { return trained_; }
  const std::vector<float>& centroid() const { return centroid_; }

  /// Trains the centroid from n rows (row-major, dim floats each; at most `max_sample` of them,
  /// evenly strided, are read). Throws InvalidArgument when n == 0 or a value is not finite.
  void train(const float* rows, std::size_t n, std::size_t max_sample = 65536);

  /// Grows (or shrinks) the row array to `slots` rows (new rows zero). Not thread-safe.
  void resize(std::size_t slots);
  /// Renumbers the rows: row i takes the row of slot new_to_old[i] (a permutation of
  /// 0..slot_count()-1, as Index::reorder makes; sizes checked, InvalidArgument), the rows
  /// encoding would write again, moved (in place on the heap; copied once when read in place
  /// from a loaded file). Not thread-safe.
  void permute_slots(const std::vector<std::uint32_t>& new_to_old);
  std::size_t slot_count() const { return slots_; }
  /// Encodes x (dim finite floats; for cosine already normalised) into slot s < slot_count();
  /// requires trained(). Thread-safe for distinct slots.
  void encode(std::uint32_t s, const float* x);
  /// The row of slot s (stride bytes, 64-byte aligned).
  const std::uint8_t* code(std::uint32_t s) const { return rows_.data() + static_cast<std::size_t>(s) * stride_; }
  /// True while the rows are read in place from the mapped index file (load of a format
  /// version 7 file; the first write copies them to the heap).
  bool codes_in_place() const { return rows_.in_place(); }
  /// Codes read in place are copied to the heap (as the first write would); else a no-op.
  void copy_codes_to_heap() { (void)rows_.mutable_data(); }
  /// The approximate vector a row stands for, c + P^T (F_x y) (tests, diagnostics).
  void decode(std::uint32_t s, float* out) const;

  /// The kernels of this container at the active SIMD level.
  const RabitqKernels& kernels() const { return rabitq_kernels_for(rabitq_container_bits(bits_), active_simd_level()); }
  /// Prepares q (dim floats; for cosine already normalised). No allocation once out is grown.
  void prepare(const float* q, RabitqQuery& out) const;
  /// Estimated distance of slot s under the metric (cosine: 1 - <x, q>).
  float distance(const RabitqKernels& k, const RabitqQuery& q, std::uint32_t s) const;
  /// Distances of four slots (the same values distance() gives).
  void distance4(const RabitqKernels& k, const RabitqQuery& q, const std::uint32_t* slots, float* out) const;
  /// Half-width of the estimate's confidence interval for slot s (distance units, >= 0).
  float error_bound(const RabitqQuery& q, std::uint32_t s) const;

  /// Bytes held (rows, centroid, rotation).
  std::size_t memory_bytes() const;
  /// Writes bits, seed, centroid and the rows of the first slot_count() slots.
  void save(BinaryWriter& w) const;
  /// Reads what save wrote; validates dimension, bits, sizes, finiteness of every constant,
  /// that codes use only their bits and that every padding byte is zero (BinaryReader::fail
  /// otherwise). The rotation is regenerated from the stored seed.
  void load(BinaryReader& r);

 private:
  std::size_t dim_;
  std::size_t padded_;
  unsigned bits_;
  Metric metric_;
  std::uint64_t seed_;
  std::size_t code_bytes_;  // bytes of the code part of a row
  std::size_t stride_;
  bool trained_ = false;
  std::vector<float> centroid_;  // dim entries once trained
  // The rotation's per-round factors (kRounds x padded_ floats): the random sign (+-1), times
  // 1 / sqrt(block) inside the round's Walsh-Hadamard block (the transform's normalisation).
  std::vector<float> signs_;
  std::size_t slots_ = 0;
  MappedArray<std::uint8_t> rows_;  // slots_ * stride_, 64-byte aligned

  void rotate(float* v) const;          // v <- P v (padded_ floats, in place)
  void rotate_inverse(float* v) const;  // v <- P^T v
  float estimate(std::int32_t dot, const RabitqQuery& q, const std::uint8_t* row) const;
};

/// Re-rank depth of a RaBitQ search when none is configured: the whole candidate list, of which
/// only the rows whose lower bound (estimate - error bound) can still beat the k-th exact
/// distance are read. The list is at least 2k long (max(ef, 2k)): at ef = k a list of coarse
/// estimates has no slack for their ordering errors (4-bit codes at 48 dimensions lost up to 0.09
/// recall@10 against float32 at ef = k = 10; with 2k, the bound still reads about k rows).
inline std::size_t rabitq_default_rerank(std::size_t ef, std::size_t k) { return ef > 2 * k ? ef : 2 * k; }

/// RaBitQ as a code type (code_traits.h).
template <>
struct CodeTraits<RabitqCodes> {
  static constexpr const char* kName = "rabitq";
  static constexpr std::uint8_t kLegacyId = 2;
  using Query = RabitqQuery;
  using Kernels = RabitqKernels;
  static constexpr bool kBounded = true;
  static constexpr std::size_t kTrainRows = 1000;
  static std::vector<CodeParam> params() { return {{"bits", kRabitqMinBits, kRabitqMaxBits, kRabitqDefaultBits}}; }
  static RabitqCodes make(std::size_t dim, Metric metric, std::uint64_t seed, const CodeParamValues& values) {
    return RabitqCodes(dim, metric, static_cast<unsigned>(code_param(values, "bits", kRabitqDefaultBits)), seed);
  }
  static CodeParamValues values(const RabitqCodes& c) { return {{"bits", c.bits()}}; }
  static const Kernels& kernels(const RabitqCodes& c) { return c.kernels(); }
  static std::size_t default_rerank(std::size_t ef, std::size_t k) { return rabitq_default_rerank(ef, k); }
};

}  // namespace kbcore
