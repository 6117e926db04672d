#include "string_dict.h"

#include <cmath>
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
