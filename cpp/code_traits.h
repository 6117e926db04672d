#pragma once
// What every code type declares about itself (its CodeTraits specialisation, next to the type):
// the primary template and the description of a parameter. The registry of the types is
// code_types.h.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kbcore {

/// One parameter of a code type: its name, its accepted range and its value when not given.
/// Stored in the file's code tag (format version 5) by name with its value.
struct CodeParam {
  const char* name;
  std::int64_t min;
  std::int64_t max;
  std::int64_t fallback;
};

/// Values of a code type's parameters by name, in the order the type declares them.
using CodeParamValues = std::vector<std::pair<std::string, std::int64_t>>;

/// The value of `name` in `values` (`fallback` if absent).
inline std::int64_t code_param(const CodeParamValues& values, const std::string& name, std::int64_t fallback) {
  for (const auto& [n, v] : values) {
    if (n == name) return v;
  }
  return fallback;
}

/// Specialised for each code type, with (see Sq8Codes' for a full one):
///   kName         the name users pass as quantization= and the file's code tag holds
///   kLegacyId     its quantization byte in format versions 2 to 4 (0: none, a newer type)
///   Query         its prepared query (one per thread lives in SearchScratch::code_queries)
///   Kernels       its distance kernels; kernels(codes) returns those of the active SIMD level
///   kBounded      true if it has a per-row error_bound(query, slot) (re-rank by bound)
///   kTrainRows    rows an index holds when it first trains the codes
///   params()      its parameters (CodeParam), in the order they are stored
///   make(dim, metric, seed, values)   a codes object for resolved parameter values
///   values(codes)                      the parameter values of a codes object
///   default_rerank(ef, k)              the re-rank depth when none is configured
/// and the type itself has prepare, distance, distance4, code, stride, train, resize, encode,
/// trained, slot_count, memory_bytes, save and load (sq8_codes.h).
template <typename Codes>
struct CodeTraits;

}  // namespace kbcore
