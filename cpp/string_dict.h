#pragma once
// Dictionary encoding of metadata strings: each distinct string gets a dense uint32 id, and
// its ISO-8601 instant (if it parses as one) is computed once, when it is interned.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kbcore {

/// Seconds since the Unix epoch (UTC) of an ISO-8601 date or date-time, or nullopt.
/// Accepts YYYY-MM-DD, then optionally 'T' or ' ' and HH:MM[:SS[.frac]], then optionally
/// 'Z' or +HH:MM / -HH:MM / +HHMM. No offset means UTC; a date alone means midnight UTC.
std::optional<double> parse_iso8601(std::string_view s);

class StringDict {
 public:
  /// Id of s, adding it if new. O(|s|) expected.
  std::uint32_t intern(std::string_view s);
  /// Id of s if present.
  std::optional<std::uint32_t> find(std::string_view s) const;
  const std::string& str(std::uint32_t id) const { return strings_[id]; }
  /// ISO-8601 instant of string id, NaN if it is not a date.
  double instant(std::uint32_t id) const { return instants_[id]; }
  std::size_t size() const { return strings_.size(); }
  std::size_t memory_bytes() const;

 private:
  std::vector<std::string> strings_;
  std::vector<double> instants_;
  std::unordered_map<std::string, std::uint32_t> ids_;
};

}  // namespace kbcore
