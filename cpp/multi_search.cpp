#include "multi_search.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>

#include "errors.h"
#include "parallel.h"

namespace kbcore {
namespace {

std::mutex pool_mutex;
std::shared_ptr<ThreadPool> pool_instance;  // guarded by pool_mutex

std::size_t default_threads() {
  const std::size_t hardware = std::max<std::size_t>(1, std::thread::hardware_concurrency());
  return std::min(hardware, kMaxSearchThreads);
}

void run_one(SearchTask& task) {
  if (task.index == nullptr || task.query == nullptr) throw InvalidArgument("a search task has no index or query");
  GroupParams& params = task.params;
  params.threads = 1;
  if (params.group_by.empty()) {
    task.ids.assign(params.k, -1);
    task.distances.assign(params.k, 0.0F);
    task.index->search(task.query, 1, params, task.ids.data(), task.distances.data());
    return;
  }
  std::vector<Index::GroupPage> pages = task.index->search_groups(task.query, 1, params);
  if (!pages.empty()) task.page = std::move(pages.front());
}

}  // namespace

void search_many(std::vector<SearchTask>& tasks, ThreadPool& pool, std::size_t threads) {
  // k is checked before any task runs: a bad one fails the call before output is sized.
  for (const SearchTask& task : tasks) {
    if (task.params.k == 0) throw InvalidArgument("k must be positive, got 0");
  }
  pool.run(
      tasks.size(), [&tasks](std::size_t i) { run_one(tasks[i]); }, threads);
}

std::shared_ptr<ThreadPool> search_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (!pool_instance) pool_instance = std::make_shared<ThreadPool>(default_threads() - 1);
  return pool_instance;
}

void set_search_threads(std::size_t threads) {
  if (threads > kMaxThreads) {
    throw InvalidArgument("search threads must be at most " + std::to_string(kMaxThreads) + ", got " +
                          std::to_string(threads));
  }
  if (threads == 0) threads = default_threads();
  auto fresh = std::make_shared<ThreadPool>(threads - 1);
  std::shared_ptr<ThreadPool> old;
  {
    std::lock_guard<std::mutex> lock(pool_mutex);
    old = std::move(pool_instance);
    pool_instance = std::move(fresh);
  }
  // `old` is joined here unless a call still holds it (then when that call ends).
}

std::size_t search_threads() { return search_pool()->workers() + 1; }

}  // namespace kbcore
