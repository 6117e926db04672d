#pragma once
// Dictionary encoding of strings: StringTable maps byte strings to dense uint32 ids (the BM25
// vocabulary); StringDict encodes metadata strings and computes each one's ISO-8601 instant
// (if it parses as one) once, when it is interned.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kbcore {

/// Seconds since the Unix epoch (UTC) of an ISO-8601 date or date-time, or nullopt.
/// Accepts YYYY-MM-DD, then optionally 'T' or ' ' and HH:MM[:SS[.frac]], then optionally
/// 'Z' or +HH:MM / -HH:MM / +HHMM. No offset means UTC; a date alone means midnight UTC.
std::optional<double> parse_iso8601(std::string_view s);

/// True if s is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
/// U+10FFFF), the strings Python's strict decoder accepts. O(|s|).
bool is_valid_utf8(std::string_view s);

/// 64-bit hash of a byte string (not keyed, not persisted). O(|s|).
std::uint64_t hash_bytes(std::string_view s);

/// Maps byte strings to dense ids 0..size()-1 in insertion order. Open addressing with linear
/// probing over a power-of-two table kept at most half full; the bytes of all strings live in
/// one arena, so lookups take string_views and interning allocates only when a buffer grows.
/// Not synchronised: const methods may run concurrently, intern/clear need exclusive access.
class StringTable {
 public:
  /// Id of s and whether it was added by this call. Amortised O(|s|) expected.
  /// Throws InvalidArgument past 2^32 - 2 strings.
  std::pair<std::uint32_t, bool> intern(std::string_view s);
  /// Id of s if present. O(|s|) expected.
  std::optional<std::uint32_t> find(std::string_view s) const;
  /// The string of `id` (< size()); valid until the next intern or clear.
  std::string_view str(std::uint32_t id) const {
    const std::size_t begin = id == 0 ? 0 : ends_[id - 1];
    return std::string_view(bytes_.data() + begin, ends_[id] - begin);
  }
  std::size_t size() const { return ends_.size(); }
  /// Makes room for n strings in total of `bytes` bytes without rehashing.
  void reserve(std::size_t n, std::size_t bytes = 0);
  void clear();
  std::size_t memory_bytes() const;

 private:
  void rehash(std::size_t capacity);

  std::string bytes_;                // every string, back to back
  std::vector<std::uint64_t> ends_;  // end offset in bytes_ of each id (its start is the previous end)
  // Per table slot: the hash's high 32 bits << 32 | (id + 1); 0 = empty. The home slot of an
  // entry is (its high hash bits & mask), so a rehash needs no string.
  std::vector<std::uint64_t> slots_;
};

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
