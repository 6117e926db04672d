#pragma once
// Tokenization for the BM25 text index. Works on UTF-8 without external libraries:
// - alphabetic and other non-CJK scripts: maximal runs of letters, digits and combining
//   marks are words, lower-cased (ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic,
//   fullwidth ASCII folded to ASCII);
// - Chinese, Japanese (kana) and Korean (Hangul): each maximal run of such characters yields
//   its overlapping character bigrams, so a query matches text without a word segmenter.
//   Documents also index every character alone, so that a one-character query (a run of one
//   character, which a query tokenizes as that character) still matches inside longer runs.
// Limits: no stemming, no stop words, no Unicode normalisation (NFC and NFD spellings differ),
// and scripts written without spaces other than CJK (e.g. Thai) are not segmented.
// Invalid UTF-8 bytes are treated as separators.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kbcore {

/// Tokens as one byte buffer: token j is bytes[ends[j-1], ends[j]) (the first starts at 0).
/// Reusing one buffer across texts avoids a heap allocation per token.
struct TokenBuffer {
  std::string bytes;
  std::vector<std::size_t> ends;
  std::size_t size() const { return ends.size(); }
  std::string_view operator[](std::size_t j) const {
    const std::size_t begin = j == 0 ? 0 : ends[j - 1];
    return std::string_view(bytes.data() + begin, ends[j] - begin);
  }
  void clear() {
    bytes.clear();
    ends.clear();
  }
};

/// Replaces the contents of `out` with the tokens of `text`, exactly those of
/// tokenize(text, for_query) in the same order. O(|text|).
void tokenize_into(std::string_view text, bool for_query, TokenBuffer& out);

/// Tokens of `text` in order (see the file comment): document tokens, or query tokens when
/// `for_query` (CJK runs longer than one character give bigrams only). O(|text|).
std::vector<std::string> tokenize(std::string_view text, bool for_query = false);

}  // namespace kbcore
