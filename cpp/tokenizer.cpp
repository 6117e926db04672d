#include "tokenizer.h"

#include <cstdint>

namespace kbcore {
namespace {

// Decodes one UTF-8 code point at s[i]; returns it and advances i. Invalid sequences give
// 0xFFFFFFFF and advance by one byte.
std::uint32_t next_cp(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int len = 0;
  std::uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    ++i;
    return 0xFFFFFFFFu;
  }
  if (i + static_cast<std::size_t>(len) > s.size()) {
    ++i;
    return 0xFFFFFFFFu;
  }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return 0xFFFFFFFFu;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms and surrogates.
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return 0xFFFFFFFFu;
  }
  i += static_cast<std::size_t>(len);
  return cp;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_cjk(std::uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0xF900 && c <= 0xFAFF) ||
         (c >= 0x20000 && c <= 0x2FFFF) ||                                // Han
         (c >= 0x3040 && c <= 0x309F) || (c >= 0x30A0 && c <= 0x30FF) ||  // kana
         (c >= 0x31F0 && c <= 0x31FF) || (c >= 0xFF66 && c <= 0xFF9F) ||  // kana ext., halfwidth
         (c >= 0xAC00 && c <= 0xD7AF) || (c >= 0x1100 && c <= 0x11FF) ||  // Hangul
         (c >= 0x3130 && c <= 0x318F);
}

// Folds case and width; returns 0 for a separator.
std::uint32_t word_char(std::uint32_t c) {
  if (c < 0x80) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return c;
    return 0;
  }
  if (c == 0xFFFFFFFFu) return 0;
  if (c >= 0xFF10 && c <= 0xFF5A) return word_char(c - 0xFEE0);  // fullwidth ASCII
  if (c < 0xC0) return (c == 0xAA || c == 0xB5 || c == 0xBA) ? c : 0;
  if (c <= 0xFF) {
    if (c == 0xD7 || c == 0xF7) return 0;
    return (c <= 0xDE) ? c + 32 : c;
  }
  if (c >= 0x100 && c <= 0x17F) {
    // Latin Extended-A: mostly upper/lower pairs at even/odd (odd/even from U+0139).
    if (c == 0x130) return 'i';
    if (c == 0x178) return 0xFF;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
    if (c == 0x138 || c == 0x149 || c == 0x17F) return c;
    return (c % 2 == 0) ? c + 1 : c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;  // Greek capitals
  if (c == 0x3C2) return 0x3C3;                               // final sigma
  if (c >= 0x410 && c <= 0x42F) return c + 32;                // Cyrillic capitals
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  // Punctuation and symbol blocks are separators; everything else is part of a word.
  if ((c >= 0x2000 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F) || (c >= 0xFE30 && c <= 0xFE4F) ||
      (c >= 0xFF00 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) ||
      (c >= 0xFF5B && c <= 0xFF65) || (c >= 0xE000 && c <= 0xF8FF) || (c >= 0xFFF0 && c <= 0xFFFF) ||
      (c >= 0x1F000 && c <= 0x1FAFF) || c == 0x37E || c == 0x387 || (c >= 0x55A && c <= 0x55F) || c == 0x589 ||
      (c >= 0x5BE && c <= 0x5C6 && c != 0x5BF && c != 0x5C1 && c != 0x5C2 && c != 0x5C4 && c != 0x5C5) ||
      (c >= 0x60C && c <= 0x61F) || c == 0x6D4 || (c >= 0x964 && c <= 0x965) || c == 0xE3F ||
      (c >= 0xE4F && c <= 0xE5B)) {
    return 0;
  }
  return c;
}

}  // namespace

void tokenize_into(std::string_view text, bool for_query, TokenBuffer& out) {
  out.clear();
  std::string& bytes = out.bytes;
  std::vector<std::size_t>& ends = out.ends;
  // The word being read is appended to `bytes` in place and ends where it stops growing; a
  // CJK run is buffered as code points (it yields characters and bigrams). A word and a CJK
  // run are never open at once: each flushes the other before it starts.
  std::vector<std::uint32_t> cjk;
  std::size_t word_start = 0;
  const auto flush_word = [&] {
    if (bytes.size() > word_start) ends.push_back(bytes.size());
    word_start = bytes.size();
  };
  const auto flush_cjk = [&] {
    if (cjk.size() == 1 || (!for_query && !cjk.empty())) {
      for (std::uint32_t c : cjk) {
        append_utf8(bytes, c);
        ends.push_back(bytes.size());
      }
    }
    for (std::size_t j = 0; j + 1 < cjk.size(); ++j) {
      append_utf8(bytes, cjk[j]);
      append_utf8(bytes, cjk[j + 1]);
      ends.push_back(bytes.size());
    }
    cjk.clear();
    word_start = bytes.size();
  };
  bytes.reserve(text.size());
  ends.reserve(text.size() / 6 + 1);
  std::size_t i = 0;
  while (i < text.size()) {
    // ASCII fast path: most text in most knowledge bases.
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      ++i;
      if (!cjk.empty()) flush_cjk();
      if ((b >= 'a' && b <= 'z') || (b >= '0' && b <= '9')) {
        bytes.push_back(static_cast<char>(b));
      } else if (b >= 'A' && b <= 'Z') {
        bytes.push_back(static_cast<char>(b + 32));
      } else {
        flush_word();
      }
      continue;
    }
    const std::uint32_t c = next_cp(text, i);
    if (c != 0xFFFFFFFFu && is_cjk(c)) {
      flush_word();
      cjk.push_back(c);
      continue;
    }
    if (!cjk.empty()) flush_cjk();
    const std::uint32_t w = word_char(c);
    if (w == 0) {
      flush_word();
    } else {
      append_utf8(bytes, w);
    }
  }
  flush_word();
  flush_cjk();
}

std::vector<std::string> tokenize(std::string_view text, bool for_query) {
  TokenBuffer buf;
  tokenize_into(text, for_query, buf);
  std::vector<std::string> out;
  out.reserve(buf.size());
  for (std::size_t j = 0; j < buf.size(); ++j) out.emplace_back(buf[j]);
  return out;
}

}  // namespace kbcore
