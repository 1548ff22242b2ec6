// A fork-join pool for the forward pass: parallel_for(n, f) splits [0, n) into one contiguous share per thread
// (the caller's thread takes share 0) and returns when all are done.
//
// Why not OpenMP: a token needs ~150 fork-joins, and libgomp's default waiting spins for a long time before
// sleeping. When the cores are shared with other work (CI, a laptop), a spinning thread steals the time slice
// its partner needs to reach the barrier, and two threads become several times slower than one (measured:
// 2.3 tok/s spinning vs 43 tok/s sleeping on a loaded 2-core machine). Here a waiting thread spins for about
// a millisecond and then sleeps on a futex (C++20 atomic wait). The spin must outlast the gap between two
// fork-joins of one token (a matvec of the next weight), otherwise every fork-join pays a futex wake-up: with
// 300 pauses (~20 us) two threads decoded no faster than one on an idle 2-core machine (45.6 vs 46.5 tok/s);
// with 20000 pauses two threads reach 82.9 tok/s (docs/benchmarks.md). Under load the waste is bounded by the
// spin, unlike libgomp's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace llama {

class thread_pool {
 public:
  explicit thread_pool(int n_threads) : n_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { worker(i); });
  }
  ~thread_pool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const noexcept { return n_; }

  // f(begin, end) on contiguous shares of [0, n); shares are empty when n < threads. Not reentrant.
  template <class F>
  void parallel_for(int64_t n, F&& f) {
    if (n <= 0) return;
    if (n_ == 1 || n == 1) {
      f(int64_t{0}, n);
      return;
    }
    const std::function<void(int)> job = [&](int tid) {
      const int64_t b = n * tid / n_, e = n * (tid + 1) / n_;
      if (b < e) f(b, e);
    };
    job_ = &job;
    pending_.store(n_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    job(0);
    for (int spin = 0;; ++spin) {
      const int left = pending_.load(std::memory_order_acquire);
      if (left == 0) break;
      if (spin < spin_limit) {
        pause();
      } else {
        pending_.wait(left, std::memory_order_acquire);
      }
    }
    job_ = nullptr;
  }

 private:
  static constexpr int spin_limit = 20000;  // ~0.5-1.5 ms (pause is 40-140 cycles)

  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }

  void worker(int tid) {
    uint32_t seen = 0;
    for (;;) {
      for (int spin = 0; generation_.load(std::memory_order_acquire) == seen; ++spin) {
        if (spin < spin_limit) pause();
        else generation_.wait(seen, std::memory_order_acquire);
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      (*job_)(tid);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* job_ = nullptr;
};

}  // namespace llama
