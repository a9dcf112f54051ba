// SPDX-License-Identifier: Apache-2.0
/// The CPU thread pool shared by the CPU ops. `parallel_for` splits [0, n) into fixed contiguous chunks
/// that depend only on n and the pool size, and every index is computed by exactly one task, so results
/// are independent of scheduling. Ops must keep each row's arithmetic inside one task (row invariance):
/// parallelise over rows, never split a reduction across tasks.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera {

class ThreadPool {
 public:
  /// `num_threads` = 0: the hardware concurrency (or TESSERA_NUM_THREADS if set).
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(ThreadPool const&) = delete;
  ThreadPool& operator=(ThreadPool const&) = delete;

  int size() const;
  /// Calls fn(begin, end) over disjoint chunks covering [0, n); blocks until all are done.
  /// Runs inline when n < min_chunk or the pool has one thread. Exceptions propagate to the caller.
  void parallel_for(int64_t n, std::function<void(int64_t, int64_t)> const& fn, int64_t min_chunk = 1);

  /// The process-wide pool used by the CPU backend.
  static ThreadPool& global();

 private:
  struct Impl;
  Impl* impl_;
};

/// Shorthand for ThreadPool::global().parallel_for.
inline void parallel_for(int64_t n, std::function<void(int64_t, int64_t)> const& fn, int64_t min_chunk = 1) {
  ThreadPool::global().parallel_for(n, fn, min_chunk);
}

}  // namespace tessera
