// A std::thread executor for fairkv's CPU backend (cpu/executor.hpp), shared by the executor tests and the CPU
// benchmark: a persistent pool whose run(n, f) hands out indices to its threads and the caller's in no fixed
// order (so a task that depended on another's scratch or on the order would show), one thread running inline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "fairkv/cpu/executor.hpp"

namespace fairkv_testing {

class thread_executor {
 public:
  explicit thread_executor(int threads) : n_(threads) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { work(); });
  }
  ~thread_executor() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  std::int64_t concurrency() const noexcept { return n_; }
  void run(std::int64_t n, fairkv::cpu::task_ref f) const {
    if (n_ == 1) {
      for (std::int64_t i = 0; i < n; ++i) f(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      job_ = &f;
      count_ = n;
      next_.store(0);
      done_ = 0;
      ++generation_;
    }
    cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(m_);
    done_cv_.wait(lock, [&] { return done_ == count_; });
    job_ = nullptr;
  }

 private:
  void drain() const {
    std::int64_t mine = 0;
    for (std::int64_t i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) {
      (*job_)(i);
      ++mine;
    }
    if (mine == 0) return;
    std::lock_guard<std::mutex> lock(m_);
    done_ += mine;
    if (done_ == count_) done_cv_.notify_all();
  }
  void work() const {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
        if (stop_) return;
        seen = generation_;
      }
      drain();
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  mutable std::mutex m_;
  mutable std::condition_variable cv_, done_cv_;
  mutable const fairkv::cpu::task_ref* job_ = nullptr;
  mutable std::int64_t count_ = 0, done_ = 0;
  mutable std::atomic<std::int64_t> next_{0};
  mutable std::uint64_t generation_ = 0;
  bool stop_ = false;
};
static_assert(fairkv::cpu::executor<thread_executor>);

}  // namespace fairkv_testing
