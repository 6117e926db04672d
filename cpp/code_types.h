#pragma once
// The registry of code types: the compressed row formats a quantized index walks its graph on.
// A type is a class with its CodeTraits (code_traits.h) listed once, in CodeStore below; the
// index, the search executors, the per-thread scratch, the file format's code tag and the
// Python listing (_core.code_types()) all follow from that list.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>

#include "code_traits.h"
#include "errors.h"
#include "rabitq_codes.h"
#include "sq8_codes.h"

namespace kbcore {

/// The codes of a quantized index: one of the registered types. Add a type here.
using CodeStore = std::variant<Sq8Codes, RabitqCodes>;

/// The tag for_each_code_type passes: CodeTypeTag<Codes>::type is the type.
template <typename Codes>
struct CodeTypeTag {
  using type = Codes;
};

namespace detail {
template <typename V>
struct CodeQueriesOf;
template <typename... Ts>
struct CodeQueriesOf<std::variant<Ts...>> {
  using type = std::tuple<typename CodeTraits<Ts>::Query...>;
};
template <typename F, std::size_t... I>
void for_each_code_type(F&& f, std::index_sequence<I...>) {
  (f(CodeTypeTag<std::variant_alternative_t<I, CodeStore>>{}), ...);
}
}  // namespace detail

/// One prepared query of each code type (a thread's, in SearchScratch::code_queries).
using CodeQueries = detail::CodeQueriesOf<CodeStore>::type;

/// Calls f(CodeTypeTag<Codes>{}) for each registered type, in registry order.
template <typename F>
void for_each_code_type(F&& f) {
  detail::for_each_code_type(f, std::make_index_sequence<std::variant_size_v<CodeStore>>{});
}

/// Whether `name` is a registered code type.
inline bool is_code_type(const std::string& name) {
  bool found = false;
  for_each_code_type([&](auto t) { found = found || name == CodeTraits<typename decltype(t)::type>::kName; });
  return found;
}

/// The registered names, quoted and comma-separated (for messages).
inline std::string code_type_names() {
  std::string out;
  for_each_code_type([&](auto t) {
    out += (out.empty() ? "'" : ", '") + std::string(CodeTraits<typename decltype(t)::type>::kName) + "'";
  });
  return out;
}

/// The parameters of code type `name` completed with their defaults, in declaration order.
/// Throws InvalidArgument naming the problem for an unknown type, a parameter the type does
/// not declare, or a value out of its range. `fail` reports instead when given (file loads).
template <typename Fail>
CodeParamValues resolve_code_params(const std::string& name, const CodeParamValues& given, const Fail& fail) {
  if (!is_code_type(name)) fail("unknown code type '" + name + "'; this build knows " + code_type_names());
  CodeParamValues out;
  for_each_code_type([&](auto t) {
    using Traits = CodeTraits<typename decltype(t)::type>;
    if (name != Traits::kName) return;
    const auto params = Traits::params();
    for (std::size_t i = 0; i < given.size(); ++i) {
      const std::string& n = given[i].first;
      for (std::size_t j = 0; j < i; ++j) {
        if (given[j].first == n) fail(n + " given twice");
      }
      bool known = false;
      for (const CodeParam& p : params) known = known || n == p.name;
      if (!known) fail(n + " does not apply to quantization='" + name + "'");
    }
    for (const CodeParam& p : params) {
      const std::int64_t v = code_param(given, p.name, p.fallback);
      if (v < p.min || v > p.max) {
        fail(std::string(p.name) + " must be in [" + std::to_string(p.min) + ", " + std::to_string(p.max) + "], got " +
             std::to_string(v));
      }
      out.emplace_back(p.name, v);
    }
  });
  return out;
}
inline CodeParamValues resolve_code_params(const std::string& name, const CodeParamValues& given) {
  return resolve_code_params(name, given, [](const std::string& m) { throw InvalidArgument(m); });
}

/// A codes object of type `name` (registered) with resolved parameter values.
inline CodeStore make_code_store(const std::string& name, std::size_t dim, Metric metric, std::uint64_t seed,
                                 const CodeParamValues& values) {
  std::optional<CodeStore> out;
  for_each_code_type([&](auto t) {
    using Codes = typename decltype(t)::type;
    if (!out && name == CodeTraits<Codes>::kName)
      out.emplace(std::in_place_type<Codes>, CodeTraits<Codes>::make(dim, metric, seed, values));
  });
  if (!out) throw InvalidArgument("unknown code type '" + name + "'; this build knows " + code_type_names());
  return std::move(*out);
}

/// The name of the type a CodeStore holds.
inline std::string code_type_name(const CodeStore& codes) {
  return std::visit([](const auto& c) { return std::string(CodeTraits<std::decay_t<decltype(c)>>::kName); }, codes);
}

}  // namespace kbcore
