#pragma once
// parallel_for over std::thread (no OpenMP): work is handed out in chunks from an atomic
// counter; the first exception thrown by any worker is captured and rethrown on the
// caller's thread after every worker has joined.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kbcore {

/// The most threads one call starts (or the hardware threads, if more): a request beyond the
/// cores only adds stacks (8 MiB of address space each), and `threads` comes from the user.
inline constexpr std::size_t kMaxThreads = 256;

/// The hardware threads (at least 1), read once per process: std::thread::hardware_concurrency
/// opens and reads /sys/devices/system/cpu/online on every call (three system calls, about as
/// long as the rest of a one-query search's per-call work together).
inline std::size_t hardware_threads() {
  static const std::size_t hardware = std::max<std::size_t>(1, std::thread::hardware_concurrency());
  return hardware;
}

/// Number of threads to use for a request of `threads` (0 = all hardware threads) over n items:
/// at most n and at most max(kMaxThreads, hardware threads). O(1), no system call.
inline std::size_t resolve_threads(std::size_t threads, std::size_t n) {
  const std::size_t hardware = hardware_threads();
  if (threads == 0) threads = hardware;
  return std::max<std::size_t>(1, std::min({threads, n, std::max(kMaxThreads, hardware)}));
}

/// Calls fn(i, worker) for i in [0, n) on `threads` threads (worker in [0, threads)).
/// The calling thread is worker 0. Rethrows the first exception after all workers finish.
/// If the system refuses a thread (process limits, address space), the workers already
/// started share the work: fewer threads, never a crash.
template <typename Fn>
void parallel_for(std::size_t n, std::size_t threads, Fn&& fn, std::size_t chunk = 1) {
  threads = resolve_threads(threads, n);
  if (threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i, std::size_t{0});
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<bool> failed{false};
  auto worker = [&](std::size_t w) {
    try {
      for (;;) {
        if (failed.load(std::memory_order_relaxed)) return;
        const std::size_t begin = next.fetch_add(chunk);
        if (begin >= n) return;
        const std::size_t end = std::min(n, begin + chunk);
        for (std::size_t i = begin; i < end; ++i) fn(i, w);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed.store(true);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  try {
    for (std::size_t w = 1; w < threads; ++w) pool.emplace_back(worker, w);
  } catch (...) {
    // std::system_error from std::thread: leaving here with joinable threads in `pool` would
    // call std::terminate. The threads started (and this one) take every chunk anyway.
  }
  worker(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace kbcore
