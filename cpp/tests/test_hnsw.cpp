// HNSW through Index: recall against brute force, removal, save/load, and bad input; and the
// search walk (graph_search.h) driven by a scorer of the test's own.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "errors.h"
#include "graph_search.h"
#include "index.h"
#include "test_util.h"

using namespace kbcore_test;

KBCORE_TEST(hnsw_recall_delete_and_reload) {
  const std::size_t n = 1500, dim = 24, k = 10;
  auto x = clustered(n, dim, 7);
  std::vector<std::int64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>(i * 3 + 1);
  kbcore::Index index(config(dim, kbcore::IndexKind::kHnsw));
  index.add(x.data(), ids.data(), n, 2);
  CHECK(index.size() == n);
  auto q = clustered(50, dim, 8);
  std::vector<std::int64_t> out_ids(50 * k);
  std::vector<float> out_d(50 * k);
  index.search(q.data(), 50, params(k, 0, 2), out_ids.data(), out_d.data());
  double r = 0;
  for (std::size_t i = 0; i < 50; ++i) {
    std::vector<std::int64_t> got(out_ids.begin() + i * k, out_ids.begin() + (i + 1) * k);
    r += recall(got, exact_topk(x, ids, q.data() + i * dim, dim, k));
  }
  CHECK(r / 50 > 0.9);
  // Remove a third; removed ids never come back; the rest stays findable.
  std::vector<std::int64_t> gone;
  for (std::size_t i = 0; i < n; i += 3) gone.push_back(ids[i]);
  index.remove(gone.data(), gone.size(), 2);
  CHECK(index.size() == n - gone.size());
  index.search(q.data(), 50, params(k, 0, 1), out_ids.data(), out_d.data());
  std::set<std::int64_t> gone_set(gone.begin(), gone.end());
  for (auto id : out_ids) CHECK(!gone_set.count(id));
  CHECK(throws<kbcore::NotFound>([&] { index.remove(gone.data(), 1, 1); }));
  // Save, reload, same answers.
  const std::string path = "kbcore_test_index.bin";
  index.save(path);
  auto loaded = kbcore::Index::load(path);
  std::vector<std::int64_t> ids2(50 * k);
  std::vector<float> d2(50 * k);
  loaded->search(q.data(), 50, params(k, 0, 1), ids2.data(), d2.data());
  CHECK(ids2 == out_ids);
  // Truncations and a flipped byte are FormatErrors, never crashes.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  for (std::size_t cut : {std::size_t{0}, std::size_t{5}, std::size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(cut));
    CHECK(throws<kbcore::FormatError>([&] { kbcore::Index::load(path); }));
  }
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  CHECK(throws<kbcore::FormatError>([&] { kbcore::Index::load(path); }));
  std::remove(path.c_str());
}

KBCORE_TEST(bad_input_changes_nothing) {
  kbcore::Index index(config(4, kbcore::IndexKind::kHnsw));
  std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, NAN};
  std::vector<std::int64_t> ids = {1, 2};
  CHECK(throws<kbcore::InvalidArgument>([&] { index.add(v.data(), ids.data(), 2, 1); }));
  CHECK(index.size() == 0);
  v[7] = 8;
  ids[1] = 1;
  CHECK(throws<kbcore::InvalidArgument>([&] { index.add(v.data(), ids.data(), 2, 1); }));
  CHECK(index.size() == 0);
  std::vector<std::int64_t> out(3);
  std::vector<float> d(3);
  index.search(v.data(), 1, params(3, 0, 1), out.data(), d.data());
  CHECK(out[0] == -1 && std::isinf(d[0]));
}

// Two-thread builds of data with many identical vectors leave nodes that no level-0 walk
// reaches; the reachability repair used to append such a node twice to one list (once
// through a node it had just linked), and load refused the saved file ("repeated link in
// one list"). Every build must save a file that loads.
KBCORE_TEST(two_thread_builds_of_duplicate_vectors_save_files_that_load) {
  const std::size_t n = 1500, dim = 4;
  const std::string path = "kbcore_test_dup_build.bin";
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<float> x(n * dim);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 3) - 1);  // 81 distinct rows
    for (std::size_t i = 0; i < n; ++i) x[i * dim] += 3.0f;                     // no zero rows
    std::vector<std::int64_t> ids(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>(i);
    kbcore::IndexConfig c = config(dim, kbcore::IndexKind::kHnsw);
    c.hnsw.M = 4;
    c.hnsw.ef_construction = 16;
    c.hnsw.seed = seed;
    kbcore::Index index(c);
    index.add(x.data(), ids.data(), n, 2);
    index.save(path);
    bool loaded = false;
    try {
      loaded = kbcore::Index::load(path)->size() == n;
    } catch (const kbcore::FormatError& e) {
      std::fprintf(stderr, "seed %llu: %s\n", static_cast<unsigned long long>(seed), e.what());
    }
    CHECK(loaded);
  }
  std::remove(path.c_str());
}

// One limit (kMaxEf) for the constructor, set_ef_search, search and load: a value the
// constructor accepts is one a saved file holds and load accepts; beyond it, InvalidArgument.
KBCORE_TEST(parameters_beyond_the_shared_limit_are_refused_at_construction) {
  const auto make = [](std::size_t efc, std::size_t ef, std::size_t rerank) {
    kbcore::IndexConfig c = config(4, kbcore::IndexKind::kHnsw);
    c.hnsw.ef_construction = efc;
    c.ef_search = ef;
    c.quantization = "sq8";
    c.rerank = rerank;
    return std::make_unique<kbcore::Index>(c);
  };
  CHECK(throws<kbcore::InvalidArgument>([&] { make(kbcore::kMaxEf + 1, 64, 0); }));
  CHECK(throws<kbcore::InvalidArgument>([&] { make(64, kbcore::kMaxEf + 1, 0); }));
  CHECK(throws<kbcore::InvalidArgument>([&] { make(64, 64, kbcore::kMaxEf + 1); }));
  auto index = make(kbcore::kMaxEf, kbcore::kMaxEf, kbcore::kMaxEf);
  CHECK(throws<kbcore::InvalidArgument>([&] { index->set_ef_search(kbcore::kMaxEf + 1); }));
  std::vector<float> v = {1, 2, 3, 4, 2, 3, 4, 5};
  std::vector<std::int64_t> ids = {1, 2};
  index->add(v.data(), ids.data(), 2, 1);
  std::vector<std::int64_t> out(2);
  std::vector<float> d(2);
  CHECK(throws<kbcore::InvalidArgument>(
      [&] { index->search(v.data(), 1, params(kbcore::kMaxEf + 1, 0, 1), out.data(), d.data()); }));
  CHECK(throws<kbcore::InvalidArgument>(
      [&] { index->search(v.data(), 1, params(2, kbcore::kMaxEf + 1, 1), out.data(), d.data()); }));
  // At the limit: searches are bounded by the two rows; the file loads.
  index->search(v.data(), 1, params(2, kbcore::kMaxEf, 1), out.data(), d.data());
  CHECK(out[0] == 1 && out[1] == 2);
  const std::string path = "kbcore_test_limits.bin";
  index->save(path);
  CHECK(kbcore::Index::load(path)->ef_search() == kbcore::kMaxEf);
  std::remove(path.c_str());
}

namespace {
// A Scorer (graph_search.h) that forwards to RowScorer and counts how often each slot is scored.
struct CountingScorer {
  kbcore::RowScorer inner;
  std::map<kbcore::Slot, int>* scored;  // a pointer: the walk copies its scorer
  float one(kbcore::Slot s) const {
    ++(*scored)[s];
    return inner.one(s);
  }
  void block(std::uint32_t* slots, std::size_t m, float* out) const {
    for (std::size_t j = 0; j < m; ++j) ++(*scored)[slots[j]];
    inner.block(slots, m, out);
  }
  void prefetch(kbcore::Slot s) const { inner.prefetch(s); }
};
}  // namespace

KBCORE_TEST(the_walk_takes_any_scorer_and_descends_scoring_each_slot_once) {
  const std::size_t n = 2000, dim = 16, ef = 32;
  const auto x = clustered(n, dim, 21);
  kbcore::VectorStore store(dim);
  store.reserve_more(n);
  std::vector<kbcore::Slot> slots(n);
  for (std::size_t i = 0; i < n; ++i) slots[i] = store.allocate(static_cast<std::int64_t>(i), x.data() + i * dim);
  kbcore::HnswIndex g(store, kbcore::Metric::kL2, kbcore::HnswParams{8, 64, 5});
  g.insert_batch(slots, 1);
  const auto q = clustered(20, dim, 22);
  const kbcore::Kernels& kern = kbcore::active_kernels();
  for (std::size_t i = 0; i < 20; ++i) {
    const float* qi = q.data() + i * dim;
    std::map<kbcore::Slot, int> scored;
    const CountingScorer sc{kbcore::RowScorer(store, kbcore::Metric::kL2, kern, qi), &scored};
    // The descent never scores a slot twice (a slot once scored cannot beat the current one).
    kbcore::GraphSearch::entry_point(g, sc);
    CHECK(!scored.empty());
    for (const auto& [slot, times] : scored) CHECK(times == 1);
    // A third scorer drives the same walk as the float32 search, to the same answer.
    std::vector<kbcore::Scored> got = kbcore::GraphSearch::search(g, sc, ef, kbcore::AcceptAll{}, nullptr);
    std::sort_heap(got.begin(), got.end());
    const std::vector<kbcore::Scored> want = g.search(qi, ef, ef);
    CHECK(got.size() == want.size());
    for (std::size_t j = 0; j < got.size(); ++j) CHECK(got[j].slot == want[j].slot && got[j].dist == want[j].dist);
    // The expanding walk with a list as long as the rows reaches every row: the exact top 10.
    std::vector<kbcore::Scored> all = kbcore::GraphSearch::expanding(
        g, sc, n, nullptr, [](const std::vector<kbcore::Scored>&) { return false; }, nullptr);
    CHECK(all.size() == n);
    std::sort_heap(all.begin(), all.end());
    std::vector<std::int64_t> top;
    for (std::size_t j = 0; j < 10; ++j) top.push_back(static_cast<std::int64_t>(all[j].slot));
    std::vector<std::int64_t> ids(n);
    for (std::size_t j = 0; j < n; ++j) ids[j] = static_cast<std::int64_t>(j);
    CHECK(recall(top, exact_topk(x, ids, qi, dim, 10)) == 1.0);
  }
}

namespace {
// A Scorer whose distances are RowScorer's rounded down to whole units: many neighbours tie
// (as code distances, integer sums, do), the case where the unfiltered walk's sorted list must
// keep the evicted nodes that tie the worst result.
struct TyingScorer {
  kbcore::RowScorer inner;
  std::map<kbcore::Slot, int>* scored;
  float one(kbcore::Slot s) const {
    ++(*scored)[s];
    return std::floor(inner.one(s));
  }
  void block(std::uint32_t* slots, std::size_t m, float* out) const {
    for (std::size_t j = 0; j < m; ++j) ++(*scored)[slots[j]];
    inner.block(slots, m, out);
    for (std::size_t j = 0; j < m; ++j) out[j] = std::floor(out[j]);
  }
  void prefetch(kbcore::Slot s) const { inner.prefetch(s); }
};
}  // namespace

KBCORE_TEST(the_unfiltered_walk_expands_what_the_filtered_walk_admitting_all_expands) {
  // AcceptAll walks one sorted list (layer0_pool), any other accept the two heaps (layer0):
  // with every slot admitted both must score the same slots and return the same results,
  // ties included, at lists shorter and longer than the sorted list's limit.
  const std::size_t n = 3000, dim = 16;
  const auto x = clustered(n, dim, 31);
  kbcore::VectorStore store(dim);
  store.reserve_more(n);
  std::vector<kbcore::Slot> slots(n);
  for (std::size_t i = 0; i < n; ++i) slots[i] = store.allocate(static_cast<std::int64_t>(i), x.data() + i * dim);
  kbcore::HnswIndex g(store, kbcore::Metric::kL2, kbcore::HnswParams{8, 64, 7});
  g.insert_batch(slots, 1);
  const auto q = clustered(30, dim, 32);
  const kbcore::Kernels& kern = kbcore::active_kernels();
  const auto admit_all = [](kbcore::Slot) { return true; };
  std::size_t ties = 0;
  for (std::size_t i = 0; i < 30; ++i) {
    const float* qi = q.data() + i * dim;
    for (std::size_t ef : {1, 2, 10, 33, 100, 300, 1100}) {
      std::map<kbcore::Slot, int> scored_pool, scored_heaps;
      std::size_t evals_pool = 0, evals_heaps = 0;
      const TyingScorer a{kbcore::RowScorer(store, kbcore::Metric::kL2, kern, qi), &scored_pool};
      const TyingScorer b{kbcore::RowScorer(store, kbcore::Metric::kL2, kern, qi), &scored_heaps};
      std::vector<kbcore::Scored> got = kbcore::GraphSearch::search(g, a, ef, kbcore::AcceptAll{}, &evals_pool);
      std::vector<kbcore::Scored> want = kbcore::GraphSearch::search(g, b, ef, admit_all, &evals_heaps);
      CHECK(std::is_heap(got.begin(), got.end()));
      std::sort_heap(got.begin(), got.end());
      std::sort_heap(want.begin(), want.end());
      CHECK(evals_pool == evals_heaps);
      CHECK(scored_pool == scored_heaps);
      CHECK(got.size() == want.size());
      for (std::size_t j = 0; j < got.size() && j < want.size(); ++j) {
        CHECK(got[j].slot == want[j].slot && got[j].dist == want[j].dist);
      }
      for (std::size_t j = 1; j < want.size(); ++j) ties += want[j].dist == want[j - 1].dist;
    }
  }
  CHECK(ties > 0);  // the rounding made ties, so the test covers them
}
