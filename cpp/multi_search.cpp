#include "multi_search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "errors.h"
#include "parallel.h"

namespace kbcore {
namespace {

std::mutex pool_mutex;
std::shared_ptr<ThreadPool> pool_instance;  // guarded by pool_mutex
std::atomic<bool> pool_auto{true};          // the default size: only the idle threads per call

// The last idle_threads() answer and when it was read (steady clock, ns; 0 = never).
std::atomic<std::int64_t> idle_read_ns{0};
std::atomic<std::size_t> idle_cached{1};
constexpr std::int64_t kIdleRefreshNs = 20'000'000;

std::size_t default_threads() { return std::min(hardware_threads(), kMaxSearchThreads); }

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

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
  if (threads == 0) threads = pool_threads(tasks.size(), pool);
  pool.run(
      tasks.size(), [&tasks](std::size_t i) { run_one(tasks[i]); }, threads);
}

std::size_t pool_threads(std::size_t tasks, const ThreadPool& pool) {
  return tasks > 1 && pool_auto.load(std::memory_order_relaxed) ? idle_threads(pool.spinning()) : 0;
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
  pool_auto.store(threads == 0);
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

void wake_search_pool(std::size_t tasks) {
  if (tasks < 2) return;
  const std::shared_ptr<ThreadPool> pool = search_pool();
  const std::size_t threads = pool_threads(tasks, *pool);  // 0: every worker
  const std::size_t helpers = std::min(threads == 0 ? pool->workers() : threads - 1, tasks - 1);
  if (helpers > 0) pool->wake(helpers);
}

std::size_t search_threads() { return search_pool()->workers() + 1; }

std::size_t running_tasks(const char* loadavg) {
  double one = 0, five = 0, fifteen = 0;
  unsigned long running = 0, total = 0;
  if (std::sscanf(loadavg, "%lf %lf %lf %lu/%lu", &one, &five, &fifteen, &running, &total) != 5) return 0;
  return static_cast<std::size_t>(running);
}

std::size_t idle_of(std::size_t running, std::size_t polling, std::size_t hardware) {
  if (running == 0) return hardware;  // unreadable: as if idle
  // The caller is runnable itself: at least one task stays counted.
  running = running > polling ? running - polling : 1;
  return running > hardware ? 1 : hardware - running + 1;
}

std::size_t idle_threads(std::size_t polling) {
  const std::int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const std::int64_t last = idle_read_ns.load(std::memory_order_relaxed);
  if (last != 0 && now - last < kIdleRefreshNs) return idle_cached.load(std::memory_order_relaxed);
  const std::size_t hardware = hardware_threads();
  std::size_t idle = hardware;
  // /proc/loadavg's fourth field counts the runnable tasks now, this thread included.
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen("/proc/loadavg", "r"));
  if (file) {
    char text[128] = {};
    const std::size_t got = std::fread(text, 1, sizeof(text) - 1, file.get());
    text[got] = '\0';
    idle = idle_of(running_tasks(text), polling, hardware);
  }
  idle_cached.store(idle, std::memory_order_relaxed);
  idle_read_ns.store(now, std::memory_order_relaxed);
  return idle;
}

}  // namespace kbcore
