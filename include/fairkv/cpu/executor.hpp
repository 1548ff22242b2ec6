// The CPU backend's optional parallelism: the engine passes an executor (a `parallel_for` over its own thread pool)
// and the planner hands it independent tasks; fairkv starts no thread of its own. Every task owns its rows of the
// output and its slice of the workspace, so the results are bit-identical to the serial executor's whatever the
// executor runs concurrently and in which order.
//
//   struct my_pool_executor {
//     my_pool* pool;
//     std::int64_t concurrency() const noexcept { return pool->threads(); }
//     void run(std::int64_t n, fairkv::cpu::task_ref f) const { pool->parallel_for(n, [&](std::int64_t i) { f(i); }); }
//   };
//   fairkv::cpu::plan(my_pool_executor{&pool}, policy, inputs, segments, whitelist, ratio, plan);
//
// Layers are the engine's business: plans of different layers share nothing but the caller's buffers, so an engine
// that wants them in parallel calls the planner per layer from its own threads with one workspace per thread.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <exception>
#include <type_traits>

#include "fairkv/status.hpp"

namespace fairkv::cpu {

// A non-owning callable f(i), cheap to copy into any pool's job type. Calls never throw.
class task_ref {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, task_ref> && std::is_invocable_v<const F&, std::int64_t>)
  task_ref(const F& f) noexcept  // NOLINT: implicit on purpose, like std::function_ref
      : obj_(&f), call_([](const void* o, std::int64_t i) noexcept { (*static_cast<const F*>(o))(i); }) {}
  void operator()(std::int64_t i) const noexcept { call_(obj_, i); }

 private:
  const void* obj_;
  void (*call_)(const void*, std::int64_t) noexcept;
};

// What the planner asks of an executor: run(n, f) calls f(i) once for every i in [0, n), possibly concurrently,
// and returns (or throws) only when every call it started has returned; concurrency() bounds how many run at once
// (>= 1). The planner makes at most concurrency() tasks per run, and sizes its per-task scratch by it, so the size
// query and the run must see the same concurrency.
template <class E>
concept executor = requires(const E& e, std::int64_t n, task_ref f) {
  { e.concurrency() } -> std::convertible_to<std::int64_t>;
  e.run(n, f);
};

// The default: one task after the other on the calling thread.
struct serial_executor {
  [[nodiscard]] constexpr std::int64_t concurrency() const noexcept { return 1; }
  void run(std::int64_t n, task_ref f) const noexcept {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
};
static_assert(executor<serial_executor>);

namespace detail {

// The tasks the planner uses for `items` independent items: at most the executor's concurrency, at least 1.
template <executor E>
[[nodiscard]] std::int64_t task_count(const E& ex, std::int64_t items) noexcept {
  std::int64_t c = 1;
  try {
    c = static_cast<std::int64_t>(ex.concurrency());
  } catch (...) {
    c = 1;
  }
  if (c < 1) c = 1;
  return items < 1 ? 1 : (c < items ? c : items);
}

// Items [0, items) split into `tasks` contiguous shares; f(task, item) for each. An executor that throws is a bug
// in the engine's code, reported as status::internal_error instead of escaping the noexcept planner; so is one that
// returns without running every task exactly once (a pool that drops jobs): without the count the planner would
// return ok over rows no task wrote. One relaxed increment per task, at most concurrency() of them per run.
template <executor E, class F>
[[nodiscard]] result for_shares(const E& ex, std::int64_t tasks, std::int64_t items, const F& f) noexcept {
  std::atomic<std::int64_t> ran{0}, stray{0};
  auto share = [&](std::int64_t task) {
    if (task < 0 || task >= tasks) {  // a share outside [0, tasks) would index past the per-task scratch
      stray.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const std::int64_t b = items * task / tasks, e = items * (task + 1) / tasks;
    for (std::int64_t i = b; i < e; ++i) f(task, i);
    ran.fetch_add(1, std::memory_order_relaxed);
  };
  if (tasks <= 1) {
    share(0);
    return {};
  }
  try {
    ex.run(tasks, task_ref(share));
  } catch (const std::exception& e) {
    return result::error(status::internal_error, "the executor threw: %s", e.what());
  } catch (...) {
    return result::error(status::internal_error, "the executor threw");
  }
  // run() returned, so every call it made has returned (the concept's contract): the counts are final.
  if (const std::int64_t n = ran.load(std::memory_order_acquire), s = stray.load(std::memory_order_acquire);
      n != tasks || s != 0)
    return result::error(status::internal_error,
                         "the executor ran %lld calls for %lld tasks and %lld outside [0, %lld): run(n, f) must call "
                         "f(i) once for every i in [0, n)",
                         static_cast<long long>(n), static_cast<long long>(tasks), static_cast<long long>(s),
                         static_cast<long long>(tasks));
  return {};
}

// Work that writes the caller's memory in place (compaction) cannot report a failing executor the way planning
// does: rows already moved cannot be put back without a copy of the cache. So every share is claimed before it
// runs (a repeated call does nothing) and, after run() returns or throws, the calling thread runs the shares the
// executor did not: every item is processed exactly once whatever the executor does, and the memory ends exactly
// as a serial run leaves it. The cost is one atomic fetch_or per share. Shares are capped at max_claimed_shares
// (compaction is bound by memory bandwidth long before that many threads).
inline constexpr std::int64_t max_claimed_shares = 1024;

template <executor E, class F>
void for_shares_exactly_once(const E& ex, std::int64_t tasks, std::int64_t items, const F& f) noexcept {
  if (tasks > max_claimed_shares) tasks = max_claimed_shares;
  std::atomic<std::uint64_t> claimed[max_claimed_shares / 64] = {};
  auto share = [&](std::int64_t task) {
    if (task < 0 || task >= tasks) return;
    const std::uint64_t bit = std::uint64_t{1} << (task % 64);
    if (claimed[task / 64].fetch_or(bit, std::memory_order_acq_rel) & bit) return;
    const std::int64_t b = items * task / tasks, e = items * (task + 1) / tasks;
    for (std::int64_t i = b; i < e; ++i) f(task, i);
  };
  if (tasks > 1) {
    try {
      ex.run(tasks, task_ref(share));
    } catch (...) {  // the shares it did not run are run below
    }
  }
  for (std::int64_t task = 0; task < tasks; ++task) share(task);
}

}  // namespace detail
}  // namespace fairkv::cpu
