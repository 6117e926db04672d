// search_many against one Index::search / search_groups call per index, on pools of several
// sizes; the persistent pool under concurrent callers and its first-error rethrow.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"
#include "hybrid_search.h"
#include "index.h"
#include "multi_search.h"
#include "parallel.h"
#include "test_util.h"
#include "thread_pool.h"

using namespace kbcore_test;

namespace {

constexpr std::size_t kDim = 10;

std::unique_ptr<kbcore::Index> make_index(std::size_t n, std::uint64_t seed) {
  auto index = std::make_unique<kbcore::Index>(config(kDim, kbcore::IndexKind::kHnsw));
  const auto x = clustered(n, kDim, seed);
  std::vector<std::int64_t> ids(n), doc(n);
  std::vector<std::uint8_t> valid(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int64_t>(seed * 100000 + i);
    doc[i] = static_cast<std::int64_t>(i % 37);
  }
  index->add(x.data(), ids.data(), n, 1, {int_column("doc", doc, valid)});
  return index;
}

}  // namespace

KBCORE_TEST(search_many_equals_one_search_per_index) {
  std::vector<std::unique_ptr<kbcore::Index>> indexes;
  for (std::uint64_t s = 1; s <= 4; ++s) indexes.push_back(make_index(300 + 50 * s, s));
  const auto q = clustered(1, kDim, 99);
  kbcore::set_search_threads(4);  // a fixed size: every call may use the pool's workers
  for (std::size_t threads : {1, 2, 4}) {
    kbcore::ThreadPool pool(threads - 1);
    std::vector<kbcore::SearchTask> tasks(2 * indexes.size());
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      tasks[i].index = indexes[i % indexes.size()].get();
      tasks[i].query = q.data();
      tasks[i].params.k = 7;
      if (i >= indexes.size()) {
        tasks[i].params.group_by = "doc";
        tasks[i].params.group_size = 2;
      }
    }
    kbcore::search_many(tasks, pool);
    for (std::size_t i = 0; i < indexes.size(); ++i) {
      std::vector<std::int64_t> ids(7);
      std::vector<float> dist(7);
      indexes[i]->search(q.data(), 1, params(7, 0, 1), ids.data(), dist.data());
      CHECK(tasks[i].ids == ids);
      CHECK(tasks[i].distances == dist);
      const auto pages = indexes[i]->search_groups(q.data(), 1, group_params(7, "doc", 2, 0, 1));
      const auto& page = tasks[indexes.size() + i].page;
      CHECK(page.size() == 7);
      CHECK(page.ids == pages[0].ids);
      CHECK(page.distances == pages[0].distances);
      CHECK(page.part_ids == pages[0].part_ids);
      CHECK(page.key_ints == pages[0].key_ints);
    }
  }
  kbcore::set_search_threads(0);
}

KBCORE_TEST(hybrid_rrf_equals_both_searches_then_rrf_fuse) {
  const std::size_t n = 600;
  kbcore::Index index(config(kDim, kbcore::IndexKind::kHnsw));
  const auto x = clustered(n, kDim, 21);
  const char* words[] = {"tide", "moon", "rock", "salt", "wave", "reef", "sand", "kelp"};
  std::vector<std::int64_t> ids(n);
  std::vector<std::optional<std::string>> texts(n);
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int64_t>(7 * i + 3);
    texts[i] = std::string(words[i % 8]) + " " + words[(i * 5 + 1) % 8] + " " + words[(i / 3) % 8];
  }
  index.add(x.data(), ids.data(), n, 1, {}, &texts);
  const auto q = clustered(1, kDim, 22);
  for (std::size_t threads : {1, 2, 3}) {
    kbcore::ThreadPool pool(threads - 1);
    for (std::size_t k : {1, 10, 50, 1000}) {
      const kbcore::HybridRrf got =
          kbcore::search_hybrid_rrf(index, q.data(), "moon kelp", k, 0, nullptr, 60.0, pool, threads);
      kbcore::SearchParams params;
      params.k = k;
      params.threads = 1;
      std::vector<std::int64_t> vid(k, -1);
      std::vector<float> vdist(k);
      index.search(q.data(), 1, params, vid.data(), vdist.data());
      const auto text = index.search_text("moon kelp", k);
      std::vector<std::int64_t> tid;
      std::vector<float> tscore;
      for (const auto& [id, score] : text) {
        tid.push_back(id);
        tscore.push_back(score);
      }
      const auto want = kbcore::rrf_fuse(vid.data(), vdist.data(), k, tid.data(), tscore.data(), tid.size(), 60.0);
      CHECK(got.fused.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        CHECK(got.fused[i].id == want[i].id && got.fused[i].score == want[i].score);
      }
      CHECK(got.vector_hits ==
            static_cast<std::size_t>(std::count_if(vid.begin(), vid.end(), [](auto v) { return v >= 0; })));
      CHECK(got.text_hits == text.size());
    }
    std::vector<float> bad(kDim, std::numeric_limits<float>::quiet_NaN());
    CHECK(throws<kbcore::InvalidArgument>(
        [&] { kbcore::search_hybrid_rrf(index, bad.data(), "moon", 10, 0, nullptr, 60.0, pool, threads); }));
    CHECK(throws<kbcore::InvalidArgument>(
        [&] { kbcore::search_hybrid_rrf(index, q.data(), "moon", 0, 0, nullptr, 60.0, pool, threads); }));
    CHECK(throws<kbcore::InvalidArgument>(
        [&] { kbcore::search_hybrid_rrf(index, q.data(), "moon", 10, 0, nullptr, -1.0, pool, threads); }));
  }
}

KBCORE_TEST(search_many_rethrows_a_failing_search) {
  const auto index = make_index(200, 5);
  const auto q = clustered(1, kDim, 6);
  std::vector<float> bad(kDim, std::numeric_limits<float>::quiet_NaN());
  kbcore::ThreadPool pool(1);
  std::vector<kbcore::SearchTask> tasks(3);
  for (auto& t : tasks) {
    t.index = index.get();
    t.query = q.data();
    t.params.k = 3;
  }
  tasks[1].query = bad.data();
  CHECK(throws<kbcore::InvalidArgument>([&] { kbcore::search_many(tasks, pool); }));
  tasks[1].query = q.data();
  tasks[2].params.k = 0;
  CHECK(throws<kbcore::InvalidArgument>([&] { kbcore::search_many(tasks, pool); }));
  tasks[2].params.k = 3;
  kbcore::search_many(tasks, pool);  // the pool still serves after a failure
  CHECK(tasks[0].ids == tasks[2].ids);
}

KBCORE_TEST(thread_pool_serves_concurrent_callers) {
  kbcore::ThreadPool pool(2);
  std::atomic<std::size_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 200; ++r) pool.run(5, [&](std::size_t i) { total += i + 1; });
    });
  }
  for (auto& t : callers) t.join();
  CHECK(total.load() == 4U * 200U * 15U);
  CHECK(throws<std::runtime_error>([&] {
    pool.run(6, [](std::size_t i) {
      if (i == 3) throw std::runtime_error("item 3");
    });
  }));
}

KBCORE_TEST(search_threads_are_configurable) {
  kbcore::set_search_threads(1);
  CHECK(kbcore::search_threads() == 1);
  kbcore::set_search_threads(3);
  CHECK(kbcore::search_threads() == 3);
  CHECK(throws<kbcore::InvalidArgument>([] { kbcore::set_search_threads(kbcore::kMaxThreads + 1); }));
  kbcore::set_search_threads(0);
  CHECK(kbcore::search_threads() >= 1);
}

KBCORE_TEST(idle_threads_leave_out_polling_pool_workers) {
  CHECK(kbcore::idle_of(0, 0, 2) == 2);  // /proc/loadavg unreadable
  CHECK(kbcore::idle_of(1, 0, 2) == 2);  // the caller alone
  CHECK(kbcore::idle_of(2, 0, 2) == 1);  // one other runnable task
  CHECK(kbcore::idle_of(2, 1, 2) == 2);  // ... that is this process's polling worker
  CHECK(kbcore::idle_of(3, 1, 2) == 1);
  CHECK(kbcore::idle_of(9, 1, 2) == 1);
  CHECK(kbcore::idle_of(1, 3, 8) == 8);  // never fewer than the caller counted
  CHECK(kbcore::idle_of(4, 1, 8) == 6);
}

KBCORE_TEST(running_tasks_reads_the_fourth_field_of_loadavg) {
  CHECK(kbcore::running_tasks("0.50 0.40 0.30 3/512 1234\n") == 3);
  CHECK(kbcore::running_tasks("12.01 7.70 5.50 17/2048 99") == 17);
  CHECK(kbcore::running_tasks("") == 0);
  CHECK(kbcore::running_tasks("0.50 0.40 0.30 x/512 1234") == 0);
  const std::size_t idle = kbcore::idle_threads();
  CHECK(idle >= 1 && idle <= std::max<std::size_t>(1, std::thread::hardware_concurrency()));
}

KBCORE_TEST(thread_pool_wake_sets_sleeping_workers_polling) {
  kbcore::ThreadPool none(0);
  none.wake();  // no worker: nothing to do
  auto owned = std::make_unique<kbcore::ThreadPool>(2);
  kbcore::ThreadPool& pool = *owned;
  CHECK(pool.spinning() == 0);  // a worker that has served nothing sleeps
  // A long poll, so that a loaded machine still schedules the worker within it.
  pool.wake(1, std::chrono::milliseconds(2000));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  while (pool.spinning() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  CHECK(pool.spinning() >= 1);
  std::atomic<std::size_t> total{0};
  pool.run(6, [&](std::size_t i) { total += i + 1; });
  CHECK(total.load() == 21U);
  pool.wake();  // every worker, then the pool is destroyed while they poll: no wait for the poll
  const auto t0 = std::chrono::steady_clock::now();
  owned.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1000));
}

KBCORE_TEST(wake_search_pool_keeps_search_many_answers) {
  std::vector<std::unique_ptr<kbcore::Index>> indexes;
  for (std::uint64_t s = 1; s <= 3; ++s) indexes.push_back(make_index(300, s));
  const auto q = clustered(1, kDim, 7);
  for (std::size_t threads : {1, 2, 0}) {
    kbcore::set_search_threads(threads);
    std::vector<kbcore::SearchTask> tasks(indexes.size());
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      tasks[i].index = indexes[i].get();
      tasks[i].query = q.data();
      tasks[i].params.k = 5;
    }
    kbcore::wake_search_pool(0);  // fewer than two searches: nothing to announce
    kbcore::wake_search_pool(1);
    kbcore::wake_search_pool(tasks.size());
    kbcore::search_many(tasks, *kbcore::search_pool());
    for (const auto& t : tasks) {
      std::vector<std::int64_t> ids(5);
      std::vector<float> dist(5);
      kbcore::SearchParams params;
      params.k = 5;
      params.threads = 1;
      t.index->search(q.data(), 1, params, ids.data(), dist.data());
      CHECK(t.ids == ids && t.distances == dist);
    }
  }
  kbcore::set_search_threads(0);
}
