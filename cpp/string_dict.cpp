#include "string_dict.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "errors.h"

namespace kbcore {
namespace {

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

bool digits(std::string_view s, std::size_t pos, std::size_t n, int& out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  out = v;
  return true;
}

bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

}  // namespace

std::optional<double> parse_iso8601(std::string_view s) {
  int y, mo, d;
  if (s.size() < 10 || !digits(s, 0, 4, y) || s[4] != '-' || !digits(s, 5, 2, mo) || s[7] != '-' ||
      !digits(s, 8, 2, d)) {
    return std::nullopt;
  }
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] + (mo == 2 && leap(y) ? 1 : 0)) return std::nullopt;
  double secs = static_cast<double>(days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d))) * 86400.0;
  std::size_t pos = 10;
  if (pos == s.size()) return secs;
  if (s[pos] != 'T' && s[pos] != 't' && s[pos] != ' ') return std::nullopt;
  ++pos;
  int h, mi, se = 0;
  if (!digits(s, pos, 2, h) || pos + 2 >= s.size() || s[pos + 2] != ':' || !digits(s, pos + 3, 2, mi)) {
    return std::nullopt;
  }
  pos += 5;
  double frac = 0;
  if (pos < s.size() && s[pos] == ':') {
    if (!digits(s, pos + 1, 2, se)) return std::nullopt;
    pos += 3;
    if (pos < s.size() && (s[pos] == '.' || s[pos] == ',')) {
      ++pos;
      double scale = 0.1;
      const std::size_t start = pos;
      while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
        frac += (s[pos] - '0') * scale;
        scale /= 10;
        ++pos;
      }
      if (pos == start) return std::nullopt;
    }
  }
  if (h > 24 || mi > 59 || se > 60 || (h == 24 && (mi != 0 || se != 0 || frac != 0))) return std::nullopt;
  secs += h * 3600.0 + mi * 60.0 + se + frac;
  if (pos == s.size()) return secs;
  if (s[pos] == 'Z' || s[pos] == 'z') return pos + 1 == s.size() ? std::optional<double>(secs) : std::nullopt;
  if (s[pos] != '+' && s[pos] != '-') return std::nullopt;
  const int sign = s[pos] == '+' ? 1 : -1;
  int oh, om = 0;
  if (!digits(s, pos + 1, 2, oh)) return std::nullopt;
  pos += 3;
  if (pos < s.size()) {
    if (s[pos] == ':') ++pos;
    if (!digits(s, pos, 2, om)) return std::nullopt;
    pos += 2;
  }
  if (pos != s.size() || oh > 23 || om > 59) return std::nullopt;
  return secs - sign * (oh * 3600.0 + om * 60.0);
}

namespace {

std::uint64_t mix64(std::uint64_t x) {
  // splitmix64's finaliser (Steele, Lea & Flood 2014): every input bit reaches every output bit.
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

constexpr std::uint64_t kIdMask = 0xFFFFFFFFull;

std::uint64_t load8(const char* p) {
  std::uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// a == b for two strings of n bytes each; inline for the short strings of a vocabulary.
bool same_bytes(const char* a, const char* b, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (load8(a + i) != load8(b + i)) return false;
  }
  for (; i < n; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return false;
    for (std::size_t j = 2; j < len; ++j) {
      if (p[i + j] < 0x80 || p[i + j] > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

std::uint64_t hash_bytes(std::string_view s) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) h = mix64(h ^ load8(s.data() + i));
  // The tail byte by byte: a variable-length memcpy would be a library call per string.
  std::uint64_t w = 0;
  for (std::size_t k = 0; i + k < s.size(); ++k) {
    w |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
  }
  return mix64(h ^ w);
}

std::optional<std::uint32_t> StringTable::find(std::string_view s) const {
  if (slots_.empty()) return std::nullopt;
  const std::uint64_t tag = hash_bytes(s) >> 32;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = tag & mask;; i = (i + 1) & mask) {
    const std::uint64_t e = slots_[i];
    if (e == 0) return std::nullopt;
    if ((e >> 32) == tag) {
      const std::string_view t = str(static_cast<std::uint32_t>((e & kIdMask) - 1));
      if (t.size() == s.size() && same_bytes(t.data(), s.data(), s.size())) {
        return static_cast<std::uint32_t>((e & kIdMask) - 1);
      }
    }
  }
}

std::pair<std::uint32_t, bool> StringTable::intern(std::string_view s) {
  const std::uint64_t tag = hash_bytes(s) >> 32;
  if (2 * (size() + 1) > slots_.size()) rehash(std::max<std::size_t>(16, 2 * slots_.size()));
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = tag & mask;
  for (;; i = (i + 1) & mask) {
    const std::uint64_t e = slots_[i];
    if (e == 0) break;
    if ((e >> 32) == tag) {
      const auto id = static_cast<std::uint32_t>((e & kIdMask) - 1);
      const std::string_view t = str(id);
      if (t.size() == s.size() && same_bytes(t.data(), s.data(), s.size())) return {id, false};
    }
  }
  if (size() >= kIdMask - 1) throw InvalidArgument("too many distinct strings (at most 4,294,967,294)");
  const auto id = static_cast<std::uint32_t>(size());
  bytes_.append(s.data(), s.size());
  ends_.push_back(bytes_.size());
  slots_[i] = (tag << 32) | (static_cast<std::uint64_t>(id) + 1);
  return {id, true};
}

void StringTable::rehash(std::size_t capacity) {
  std::vector<std::uint64_t> slots(capacity, 0);
  const std::size_t mask = capacity - 1;
  for (const std::uint64_t e : slots_) {
    if (e == 0) continue;
    std::size_t i = (e >> 32) & mask;
    while (slots[i] != 0) i = (i + 1) & mask;
    slots[i] = e;
  }
  slots_ = std::move(slots);
}

void StringTable::reserve(std::size_t n, std::size_t bytes) {
  ends_.reserve(n);
  if (bytes > 0) bytes_.reserve(bytes);
  std::size_t capacity = std::max<std::size_t>(16, slots_.size());
  while (capacity < 2 * n) capacity *= 2;
  if (capacity != slots_.size()) rehash(capacity);
}

void StringTable::clear() {
  bytes_.clear();
  ends_.clear();
  slots_.clear();
}

std::size_t StringTable::memory_bytes() const {
  return bytes_.capacity() + ends_.capacity() * sizeof(std::uint64_t) + slots_.capacity() * sizeof(std::uint64_t);
}

std::uint32_t StringDict::intern(std::string_view s) {
  const auto it = ids_.find(std::string(s));
  if (it != ids_.end()) return it->second;
  if (strings_.size() >= std::numeric_limits<std::uint32_t>::max() - 1) {
    throw InvalidArgument("too many distinct metadata strings");
  }
  const auto id = static_cast<std::uint32_t>(strings_.size());
  strings_.emplace_back(s);
  const auto t = parse_iso8601(s);
  instants_.push_back(t ? *t : std::numeric_limits<double>::quiet_NaN());
  ids_.emplace(strings_.back(), id);
  return id;
}

std::optional<std::uint32_t> StringDict::find(std::string_view s) const {
  const auto it = ids_.find(std::string(s));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::size_t StringDict::memory_bytes() const {
  std::size_t b = 0;
  for (const auto& s : strings_) b += 2 * (s.capacity() + sizeof(std::string)) + 3 * sizeof(void*) + 8;
  return b;
}

}  // namespace kbcore
