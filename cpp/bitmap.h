#pragma once
// A fixed-size bitset over slots, the compiled form of a filter: bit s is set when slot s passes.
#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#endif

namespace kbcore {

/// Portable bit tricks (GCC/Clang builtins, MSVC intrinsics).
inline int popcount64(std::uint64_t x) {
#if defined(_MSC_VER) && !defined(__clang__)
  return static_cast<int>(__popcnt64(x));
#elif defined(__POPCNT__)
  return __builtin_popcountll(x);
#else
  // The portable baseline has no POPCNT instruction, and the builtin then calls a libgcc
  // routine per word; this SWAR form stays inline and vectorises in word loops.
  x = x - ((x >> 1) & 0x5555555555555555ULL);
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
  return static_cast<int>((x * 0x0101010101010101ULL) >> 56);
#endif
}
inline int ctz64(std::uint64_t x) {
#if defined(_MSC_VER) && !defined(__clang__)
  unsigned long i;
  _BitScanForward64(&i, x);
  return static_cast<int>(i);
#else
  return __builtin_ctzll(x);
#endif
}

class Bitmap {
 public:
  Bitmap() = default;
  /// n bits, all clear (or all set).
  explicit Bitmap(std::size_t n, bool value = false) : n_(n), words_((n + 63) / 64, value ? ~std::uint64_t{0} : 0) {
    trim();
  }
  std::size_t size() const { return n_; }
  bool test(std::size_t i) const { return (words_[i >> 6] >> (i & 63)) & 1u; }
  void set(std::size_t i) { words_[i >> 6] |= std::uint64_t{1} << (i & 63); }
  void reset(std::size_t i) { words_[i >> 6] &= ~(std::uint64_t{1} << (i & 63)); }
  /// Grows to n bits (new bits clear).
  void resize(std::size_t n) {
    n_ = n;
    words_.resize((n + 63) / 64, 0);
    trim();
  }
  /// Number of set bits. O(n / 64).
  std::size_t count() const {
    std::size_t c = 0;
    for (std::uint64_t w : words_) c += static_cast<std::size_t>(popcount64(w));
    return c;
  }
  Bitmap& operator&=(const Bitmap& o) {
    for (std::size_t i = 0; i < words_.size(); ++i) words_[i] &= o.words_[i];
    return *this;
  }
  Bitmap& operator|=(const Bitmap& o) {
    for (std::size_t i = 0; i < words_.size(); ++i) words_[i] |= o.words_[i];
    return *this;
  }
  /// this = this AND NOT o.
  Bitmap& subtract(const Bitmap& o) {
    for (std::size_t i = 0; i < words_.size(); ++i) words_[i] &= ~o.words_[i];
    return *this;
  }
  /// Calls fn(slot) for every set bit in increasing order.
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (std::size_t w = 0; w < words_.size(); ++w) {
      std::uint64_t bits = words_[w];
      while (bits) {
        const int b = ctz64(bits);
        fn(static_cast<std::uint32_t>((w << 6) + static_cast<std::size_t>(b)));
        bits &= bits - 1;
      }
    }
  }
  /// this = this AND mask (same size); returns the number of set bits. One O(n / 64) pass.
  std::size_t and_count(const Bitmap& mask) {
    std::size_t c = 0;
    for (std::size_t i = 0; i < words_.size(); ++i) {
      words_[i] &= mask.words_[i];
      c += static_cast<std::size_t>(popcount64(words_[i]));
    }
    return c;
  }
  /// The set bits in increasing order; `count` must be count() (it sizes the output).
  /// O(n / 64 + count); words holding at most one bit, the common case of a selective
  /// filter, take no data-dependent branch (a for_each loop mispredicts on most words).
  std::vector<std::uint32_t> to_slots(std::size_t count) const {
    return extract(count, [this](std::size_t w) { return words_[w]; });
  }
  const std::vector<std::uint64_t>& words() const { return words_; }

 private:
  // The set bits of word(0), word(1), ... in increasing order, at most `bound` of them. One
  // unconditional store per word (the buffer has a slot of slack beyond `bound`, and every
  // store is bounded by it even if `bound` were too small); a loop only for the other bits of a
  // word holding several, rare when few rows pass. Measured 1.3x to 1.6x faster than two
  // unconditional stores per word and than skipping zero words with a branch (19k and 100k
  // slots, 1 % and 3 % set).
  template <typename Word>
  std::vector<std::uint32_t> extract(std::size_t bound, Word word) const {
    std::vector<std::uint32_t> out(bound + 1);
    std::uint32_t* p = out.data();
    std::size_t k = 0;
    constexpr std::uint64_t kTop = std::uint64_t{1} << 63;  // keeps ctz defined on 0
    for (std::size_t w = 0; w < words_.size() && k <= bound; ++w) {
      std::uint64_t bits = word(w);
      const auto base = static_cast<std::uint32_t>(w << 6);
      p[k] = base + static_cast<std::uint32_t>(ctz64(bits | kTop));
      k += bits != 0;
      bits &= bits - 1;
      for (; bits != 0 && k < bound; bits &= bits - 1) p[k++] = base + static_cast<std::uint32_t>(ctz64(bits));
    }
    out.resize(std::min(k, bound));
    return out;
  }
  void trim() {
    if (n_ % 64 != 0 && !words_.empty()) words_.back() &= (std::uint64_t{1} << (n_ % 64)) - 1;
  }
  std::size_t n_ = 0;
  std::vector<std::uint64_t> words_;
};

}  // namespace kbcore
