#pragma once
// Visited sets for graph traversal. An epoch counter makes "clear" O(1): a slot is visited
// when its mark equals the current epoch (the hnswlib trick). A pool hands one set to each
// concurrent search so that searches never share mutable state.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "aligned.h"

namespace kbcore {

/// One visited set over slots [0, capacity). Not thread-safe; owned by one search at a time.
class VisitedSet {
 public:
  /// Starts a new traversal over at least `capacity` slots. O(1) amortised.
  void reset(std::size_t capacity) {
    if (marks_.size() < capacity) marks_.resize(capacity, 0);
    if (++epoch_ == 0) {  // wrapped: every stale mark could alias the new epoch
      std::fill(marks_.begin(), marks_.end(), 0);
      epoch_ = 1;
    }
  }
  /// Marks `slot`; returns true if it was already marked in this traversal.
  bool test_and_set(std::uint32_t slot) {
    const bool seen = marks_[slot] == epoch_;
    marks_[slot] = epoch_;
    return seen;
  }
  bool test(std::uint32_t slot) const { return marks_[slot] == epoch_; }

  /// The marks and epoch as plain locals for a hot loop: through the set, the compiler must
  /// reload epoch_ after every store to a mark (both are uint16, so they may alias). Valid
  /// until the next reset().
  struct View {
    std::uint16_t* marks;
    std::uint16_t epoch;
    bool test_and_set(std::uint32_t slot) const {
      const bool seen = marks[slot] == epoch;
      marks[slot] = epoch;
      return seen;
    }
  };
  View view() { return View{marks_.data(), epoch_}; }

 private:
  AlignedVector<std::uint16_t> marks_;  // huge-page backed from 2M slots (aligned.h)
  std::uint16_t epoch_ = 0;
};

/// A thread-safe pool of visited sets. acquire() returns a handle that gives the set back.
/// Each thread first reuses its own cached set (no lock on the hot path); a nested or
/// concurrent acquire on the same thread falls back to the shared, mutex-guarded free list.
class VisitedPool {
 public:
  class Handle {
   public:
    Handle(VisitedPool* pool, std::unique_ptr<VisitedSet> set) : pool_(pool), set_(std::move(set)) {}
    Handle(Handle&&) = default;
    Handle& operator=(Handle&&) = delete;
    Handle(const Handle&) = delete;
    ~Handle() {
      if (set_) pool_->release(std::move(set_));
    }
    VisitedSet& operator*() { return *set_; }
    VisitedSet* operator->() { return set_.get(); }

   private:
    VisitedPool* pool_;
    std::unique_ptr<VisitedSet> set_;
  };

  /// A visited set reset for `capacity` slots. Thread-safe.
  Handle acquire(std::size_t capacity) {
    std::unique_ptr<VisitedSet> set;
    if (thread_cache()) {
      set = std::move(thread_cache());
    } else {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        set = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!set) set = std::make_unique<VisitedSet>();
    set->reset(capacity);
    return Handle(this, std::move(set));
  }

 private:
  void release(std::unique_ptr<VisitedSet> set) {
    if (!thread_cache()) {
      thread_cache() = std::move(set);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(set));
  }
  // One cached set per thread, shared by every pool: epochs make a set safe to reuse for any
  // index, since reset() grows it and starts a fresh epoch.
  static std::unique_ptr<VisitedSet>& thread_cache() {
    thread_local std::unique_ptr<VisitedSet> cache;
    return cache;
  }
  std::mutex mutex_;
  std::vector<std::unique_ptr<VisitedSet>> free_;
};

}  // namespace kbcore
