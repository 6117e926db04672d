#pragma once
// One query against several indexes at once (retrieval over several knowledge bases): the
// per-index searches run concurrently on a persistent ThreadPool, so a caller that released
// the GIL pays one hand-off instead of one Python round trip per index.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "index.h"
#include "search_plan.h"
#include "thread_pool.h"

namespace kbcore {

/// One search of search_many: `index` and `query` (index->dim() floats) are borrowed and must
/// outlive the call. An empty params.group_by asks for a plain k-NN search into ids /
/// distances (params.k each, padded with -1 / +inf); otherwise a grouped search into page.
/// params.threads is ignored (each search runs on one thread).
struct SearchTask {
  const Index* index = nullptr;
  const float* query = nullptr;
  GroupParams params;
  std::vector<std::int64_t> ids;
  std::vector<float> distances;
  Index::GroupPage page;
};

/// Runs every task, concurrently on `pool` (the caller takes tasks too; at most `threads`
/// threads, 0 = the pool's workers and the caller). Each task is what Index::search /
/// Index::search_groups of one query would return. Throws the first task's error (the others
/// may or may not have run). Each index is only read (shared lock).
void search_many(std::vector<SearchTask>& tasks, ThreadPool& pool, std::size_t threads = 0);

/// Default size of the search pool: the threads working on one search_many call, the
/// caller included (hardware threads, at most this many).
inline constexpr std::size_t kMaxSearchThreads = 8;

/// The process's search pool (made on first use with min(hardware threads,
/// kMaxSearchThreads) - 1 workers, or as set_search_threads last said). Thread-safe; a caller
/// keeps its shared_ptr for the whole call, so a pool replaced meanwhile is joined only after.
std::shared_ptr<ThreadPool> search_pool();

/// Replaces the search pool by one where `threads` threads (the caller included) work on one
/// call: 1 = serial, 0 = the default, which also takes only the idle hardware threads of the
/// moment (idle_threads()): on a machine whose cores are all busy, handing searches to a
/// worker that then waits for a core costs more than it saves. Throws InvalidArgument above
/// kMaxThreads.
void set_search_threads(std::size_t threads);

/// The runnable tasks in the text of /proc/loadavg ("0.50 0.40 0.30 3/512 1234" gives 3), or
/// 0 when the text does not parse.
std::size_t running_tasks(const char* loadavg);

/// The hardware threads a call may use when `running` tasks are runnable (this thread
/// included; 0: unknown, then all of them), `polling` of them this process's idle pool
/// workers (not counted), on `hardware` threads: at least 1. O(1).
std::size_t idle_of(std::size_t running, std::size_t polling, std::size_t hardware);

/// Hardware threads a call may use now, the caller included: those not taken by the other
/// runnable tasks of the machine (/proc/loadavg, read at most every 20 ms), at least 1; the
/// hardware threads where that file cannot be read. `polling` runnable threads of this
/// process that give their core up to a call (a pool's workers waiting for a batch,
/// ThreadPool::spinning()) are left out of the count. Thread-safe.
std::size_t idle_threads(std::size_t polling = 0);

/// Threads that a call of `tasks` concurrent searches on the search pool uses, the caller
/// included, as search_many decides: idle_threads() under the default pool size (when
/// tasks > 1; `pool`'s polling workers count as idle), else 0 (the pool's workers and the
/// caller). Thread-safe.
std::size_t pool_threads(std::size_t tasks, const ThreadPool& pool);

/// Announces a search_many call of `tasks` searches soon (after the caller's own work, such as
/// embedding the query): wakes the search pool's workers that call would use (as many as
/// pool_threads allows, at most tasks - 1), which then poll for it for up to kWakeSpin
/// instead of being woken by the call itself. Nothing when tasks < 2 or no core is idle.
/// Thread-safe; O(1) (a futex wake-up when a worker sleeps).
void wake_search_pool(std::size_t tasks);

/// Threads working on one search_many call, the caller included.
std::size_t search_threads();

}  // namespace kbcore
