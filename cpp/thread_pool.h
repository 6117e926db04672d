#pragma once
// A small persistent pool of std::thread workers (no OpenMP, no thread per call): the
// per-call cost of handing a few tasks to threads that already exist is a queue push and a
// wake-up, against the tens of microseconds of starting a thread. The caller of run() takes
// items too, so a call finishes even when every worker is busy with another caller's items
// (never a hang waiting for the pool), and the first exception is rethrown on the caller.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kbcore {

/// How long run() polls for items still running on workers before it sleeps on a condition
/// variable (the caller's share of a small batch ends first, the workers' soon after).
inline constexpr std::chrono::microseconds kSpinWait{100};

/// How long a worker that just ran a batch polls for the next one before it sleeps: the gap
/// between two searches of a query loop (the caller's Python work) is shorter.
inline constexpr std::chrono::microseconds kWorkerSpin{300};

/// How long a worker woken by ThreadPool::wake() polls for a batch before it sleeps again:
/// about what the caller does before its search (embedding a query: ~0.25 ms), with margin.
inline constexpr std::chrono::microseconds kWakeSpin{1000};

/// A hint to the core that this thread is busy-waiting (x86 PAUSE), else nothing.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// A fixed set of worker threads serving run() calls from any number of threads.
/// Thread-safe: run() may be called concurrently. The destructor joins every worker.
class ThreadPool {
 public:
  /// A pool with `workers` threads (0 is valid: run() then works on the caller alone). If the
  /// system refuses a thread, the pool keeps those already started.
  explicit ThreadPool(std::size_t workers) {
    threads_.reserve(workers);
    try {
      for (std::size_t w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
    } catch (...) {
      // std::system_error from std::thread: fewer workers, never a crash.
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      stopping_.store(true);  // a polling worker stops polling at once
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  /// Number of worker threads (the caller of run() works besides them).
  std::size_t workers() const { return threads_.size(); }

  /// Workers polling for the next batch right now: runnable for the scheduler (they count in
  /// /proc/loadavg) but free to take a batch at once.
  std::size_t spinning() const { return spinning_.load(std::memory_order_relaxed); }

  /// Wakes sleeping workers (one if `workers` is 1, else all) so that they poll for a batch
  /// for `spin` (at most, then sleep again): a caller that will call run() soon, after work
  /// of its own (embedding a query), hands its batch to workers already awake instead of
  /// paying their wake-up (tens of microseconds on a virtual machine, as long as a search)
  /// at run(). No system call when no worker sleeps. Thread-safe; a hint only.
  void wake(std::size_t workers = 0, std::chrono::microseconds spin = kWakeSpin) {
    if (threads_.empty()) return;
    const std::int64_t until = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(spin).count();
    std::int64_t seen = warm_until_.load(std::memory_order_relaxed);
    while (seen < until && !warm_until_.compare_exchange_weak(seen, until, std::memory_order_relaxed)) {}
    // A worker about to sleep sees the new generation (it counts itself in sleeping_ before
    // it reads the generation, this call the other way round: one of them sees the other's
    // write); one asleep is notified below.
    wake_gen_.fetch_add(1);
    if (sleeping_.load() == 0) return;  // none asleep: no system call
    {
      // Between a worker's test of the generation and its sleep the mutex is held: after
      // this lock, it sleeps (and gets the notification) or has seen the new generation.
      std::lock_guard<std::mutex> lock(mutex_);
    }
    if (workers == 1) {
      wake_.notify_one();
    } else {
      wake_.notify_all();
    }
  }

  /// Calls fn(i) for i in [0, n), on the caller and up to min(n, threads) - 1 workers
  /// (threads = 0: every worker); returns when every call has finished. After an exception,
  /// items not yet started are skipped and the first exception is rethrown here.
  template <typename Fn>
  void run(std::size_t n, Fn&& fn, std::size_t threads = 0) {
    if (n == 0) return;
    std::size_t helpers = std::min(n - 1, threads_.size());
    if (threads != 0) helpers = std::min(helpers, threads - 1);
    if (helpers == 0) {
      for (std::size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    // The batch outlives this call if a worker dequeues a helper job late: the job then finds
    // no item left and never touches `fn` (which lives on this stack frame only while an item
    // can still be claimed: this call waits for every claimed item).
    auto batch = std::make_shared<Batch>();
    batch->n = n;
    batch->item = [&fn](std::size_t i) { fn(i); };
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (std::size_t h = 0; h < helpers; ++h) jobs_.emplace_back(batch);
      queued_.store(jobs_.size(), std::memory_order_release);
    }
    if (helpers == 1) {
      wake_.notify_one();
    } else {
      wake_.notify_all();
    }
    batch->drain();
    // An item still running on a worker usually ends within tens of microseconds, about what
    // a futex wake-up of this thread costs: look for a while before sleeping.
    const auto give_up = std::chrono::steady_clock::now() + kSpinWait;
    while (batch->finished.load(std::memory_order_acquire) != n && std::chrono::steady_clock::now() < give_up) {
      cpu_relax();
    }
    std::unique_lock<std::mutex> lock(batch->mutex);
    batch->done_cv.wait(lock, [&] { return batch->done == batch->n; });
    batch->item = nullptr;  // no item is left to claim: drop the reference to fn
    if (batch->error) std::rethrow_exception(batch->error);
  }

 private:
  struct Batch {
    std::size_t n = 0;
    std::function<void(std::size_t)> item;
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mutex;  // guards done, error
    std::condition_variable done_cv;
    std::size_t done = 0;
    std::atomic<std::size_t> finished{0};  // a copy of done, read without the mutex
    std::exception_ptr error;

    /// Claims and runs items until none is left; counts each claimed item as done.
    void drain() {
      for (;;) {
        const std::size_t i = next.fetch_add(1);
        if (i >= n) return;
        std::exception_ptr caught;
        if (!failed.load(std::memory_order_relaxed)) {
          try {
            item(i);
          } catch (...) {
            caught = std::current_exception();
            failed.store(true);
          }
        }
        std::lock_guard<std::mutex> lock(mutex);
        if (caught && !error) error = caught;
        finished.store(done + 1, std::memory_order_release);
        if (++done == n) done_cv.notify_all();
      }
    }
  };

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void work() {
    bool served = false;     // this worker ran a batch since it last slept
    bool woken = false;      // ... or wake() woke it
    std::uint64_t seen = 0;  // the wake() generation this worker last acted on
    for (;;) {
      std::shared_ptr<Batch> batch;
      if (served || woken) {
        // Calls come in bursts (a query loop), or wake() announced one: look for the next
        // batch for a while before sleeping, since waking a sleeping worker takes tens of
        // microseconds, as long as a one-query search. A worker that has served nothing and
        // was not woken does not spin.
        spinning_.fetch_add(1, std::memory_order_relaxed);
        const std::int64_t served_until =
            served ? now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(kWorkerSpin).count() : 0;
        while (queued_.load(std::memory_order_acquire) == 0 && !stopping_.load(std::memory_order_relaxed) &&
               now_ns() < std::max(served_until, warm_until_.load(std::memory_order_relaxed))) {
          std::this_thread::yield();  // on a busy core, the other runnable tasks go first
        }
        spinning_.fetch_sub(1, std::memory_order_relaxed);
      }
      {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return stop_ || !jobs_.empty() || wake_gen_.load() != seen; });
        sleeping_.fetch_sub(1);
        seen = wake_gen_.load();  // a batch answers a wake() too
        if (jobs_.empty()) {
          if (stop_) return;  // nothing left
          woken = true;       // the wait ended for a wake()
          served = false;
          continue;
        }
        woken = false;
        batch = std::move(jobs_.front());
        jobs_.pop_front();
        queued_.store(jobs_.size(), std::memory_order_release);
      }
      batch->drain();
      served = true;
    }
  }

  std::mutex mutex_;  // guards jobs_, stop_
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Batch>> jobs_;
  std::atomic<std::size_t> queued_{0};       // jobs_.size(), read without the mutex by spinning workers
  std::atomic<std::size_t> spinning_{0};     // workers in their polling loop
  std::atomic<std::uint64_t> wake_gen_{0};   // wake() calls so far
  std::atomic<std::size_t> sleeping_{0};     // workers in wake_.wait (or about to be)
  std::atomic<std::int64_t> warm_until_{0};  // steady clock ns until which woken workers poll
  bool stop_ = false;
  std::atomic<bool> stopping_{false};  // stop_, read without the mutex by polling workers
  std::vector<std::thread> threads_;
};

}  // namespace kbcore
