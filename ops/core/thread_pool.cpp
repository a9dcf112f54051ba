// SPDX-License-Identifier: Apache-2.0
/// Fixed-size thread pool with static chunking (see thread_pool.hpp for the determinism contract).
#include "tessera/core/thread_pool.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

struct ThreadPool::Impl {
  std::vector<std::thread> workers;
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::function<void(int64_t, int64_t)> const* fn = nullptr;
  int64_t n = 0, chunk = 0, num_chunks = 0, next = 0, done = 0;
  uint64_t generation = 0;
  bool stop = false;
  std::exception_ptr error;
  std::mutex call_mu;  // one parallel_for at a time; nested calls run inline

  void run_chunks() {
    for (;;) {
      int64_t c;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (next >= num_chunks) return;
        c = next++;
      }
      int64_t b = c * chunk, e = std::min(n, b + chunk);
      try {
        (*fn)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!error) error = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu);
      if (++done == num_chunks) cv_done.notify_all();
    }
  }
};

static thread_local bool tl_inside_pool = false;

ThreadPool::ThreadPool(int num_threads) : impl_(new Impl) {
  if (num_threads <= 0) {
    if (char const* env = std::getenv("TESSERA_NUM_THREADS")) num_threads = std::atoi(env);
    if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  for (int i = 1; i < num_threads; ++i) {
    impl_->workers.emplace_back([this] {
      tl_inside_pool = true;
      uint64_t seen = 0;
      for (;;) {
        {
          std::unique_lock<std::mutex> lk(impl_->mu);
          impl_->cv_work.wait(lk, [&] { return impl_->stop || impl_->generation != seen; });
          if (impl_->stop) return;
          seen = impl_->generation;
        }
        impl_->run_chunks();
      }
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv_work.notify_all();
  for (auto& t : impl_->workers) t.join();
  delete impl_;
}

int ThreadPool::size() const { return static_cast<int>(impl_->workers.size()) + 1; }

void ThreadPool::parallel_for(int64_t n, std::function<void(int64_t, int64_t)> const& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int threads = size();
  if (threads == 1 || n < 2 * std::max<int64_t>(1, min_chunk) || tl_inside_pool) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(impl_->call_mu);
  int64_t chunks = std::min<int64_t>(threads * 4, (n + min_chunk - 1) / std::max<int64_t>(1, min_chunk));
  int64_t chunk = (n + chunks - 1) / chunks;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->fn = &fn;
    impl_->n = n;
    impl_->chunk = chunk;
    impl_->num_chunks = (n + chunk - 1) / chunk;
    impl_->next = 0;
    impl_->done = 0;
    impl_->error = nullptr;
    ++impl_->generation;
  }
  impl_->cv_work.notify_all();
  tl_inside_pool = true;
  impl_->run_chunks();
  tl_inside_pool = false;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(impl_->mu);
    impl_->cv_done.wait(lk, [&] { return impl_->done == impl_->num_chunks; });
    err = impl_->error;
    impl_->fn = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

}  // namespace tessera
