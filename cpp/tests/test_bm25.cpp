// BM25 text search against the formula computed by brute force, with removals, rewrites
// (stale postings and compaction) and a filter.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "index.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kbcore_test;

namespace {

// Okapi BM25 with Lucene's idf (bm25_index.h), computed from scratch per query.
std::map<std::int64_t, double> oracle(const std::map<std::int64_t, std::string>& docs, const std::string& query) {
  const double k1 = 1.2, b = 0.75;
  std::map<std::int64_t, std::map<std::string, int>> tf;
  std::map<std::string, int> df;
  double total = 0;
  for (const auto& [id, text] : docs) {
    auto& t = tf[id];
    const auto toks = kbcore::tokenize(text);
    total += static_cast<double>(toks.size());
    for (const auto& w : toks) ++t[w];
    for (const auto& [w, c] : t) ++df[w];
  }
  std::map<std::int64_t, double> out;
  if (docs.empty()) return out;
  const double n = static_cast<double>(docs.size()), avgdl = total / n;
  auto terms = kbcore::tokenize(query, true);
  std::sort(terms.begin(), terms.end());
  terms.erase(std::unique(terms.begin(), terms.end()), terms.end());
  for (const auto& [id, t] : tf) {
    double dl = 0;
    for (const auto& [w, c] : t) dl += c;
    double s = 0;
    bool hit = false;
    for (const auto& w : terms) {
      const auto it = t.find(w);
      if (it == t.end()) continue;
      hit = true;
      const double idf = std::log(1.0 + (n - df[w] + 0.5) / (df[w] + 0.5));
      s += idf * it->second * (k1 + 1) / (it->second + k1 * (1 - b + b * dl / avgdl));
    }
    if (hit) out[id] = s;
  }
  return out;
}

}  // namespace

KBCORE_TEST(bm25_scores_agree_with_the_formula_after_removes_and_rewrites) {
  const std::size_t n = 400, dim = 4;
  std::mt19937 rng(31);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"};
  const auto text = [&] {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 9);
    for (int i = 0; i < len; ++i) t += std::string(words[rng() % 8]) + (i % 3 ? " " : ", ");
    return t;
  };
  const auto x = clustered(n, dim, 32);
  std::vector<std::int64_t> ids(n);
  std::vector<std::optional<std::string>> texts(n);
  std::map<std::int64_t, std::string> docs;
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int64_t>(i);
    if (i % 5 != 0) {
      texts[i] = text();
      docs[ids[i]] = *texts[i];
    }
  }
  kbcore::Index index(config(dim, kbcore::IndexKind::kFlat));
  index.add(x.data(), ids.data(), n, 2, {}, &texts);
  const auto compare = [&](const std::string& q) {
    const auto want = oracle(docs, q);
    const auto got = index.search_text(q, n, nullptr);
    CHECK(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const auto it = want.find(got[i].first);
      CHECK(it != want.end());
      CHECK(std::fabs(it->second - got[i].second) < 1e-3 * std::max(1.0, it->second));
      if (i > 0) CHECK(got[i - 1].second >= got[i].second);
    }
  };
  compare("alpha");
  compare("beta gamma theta");
  compare("nothing");
  // Remove a third and rewrite another third (stale postings, then a compaction).
  std::vector<std::int64_t> gone;
  for (std::size_t i = 1; i < n; i += 3) gone.push_back(ids[i]);
  index.remove(gone.data(), gone.size(), 1);
  for (auto id : gone) docs.erase(id);
  std::vector<std::int64_t> again;
  std::vector<float> again_x;
  std::vector<std::optional<std::string>> again_t;
  for (std::size_t i = 2; i < n; i += 3) {
    again.push_back(ids[i]);
    again_x.insert(again_x.end(), x.begin() + static_cast<std::ptrdiff_t>(i * dim),
                   x.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
    again_t.push_back(text());
    docs[ids[i]] = *again_t.back();
  }
  index.add(again_x.data(), again.data(), again.size(), 1, {}, &again_t);
  compare("alpha");
  compare("delta eps zeta");
  CHECK(index.text_documents() == docs.size());
  // Save and load keep the scores.
  const std::string path = "kbcore_test_bm25.kbi";
  index.save(path);
  const auto loaded = kbcore::Index::load(path);
  const auto a = index.search_text("gamma eta", 20, nullptr);
  const auto b = loaded->search_text("gamma eta", 20, nullptr);
  CHECK(a == b);
  std::remove(path.c_str());
}
