// One layer's fairkv plan for the policy a runtime spec names, compiled once for the whole runner.
//
// fairkv::dispatch instantiates fairkv::cpu::plan for every scorer x selector x allocator it can name (126
// policies). Written inline in the runner's headers, every translation unit that includes them (the runner, its
// tests and bench, the llama.cpp integration) compiled all of them at -O3; declared here and defined in
// plan_layer.cpp, they are compiled once (docs/design-notes.md has the build times); the llama.cpp integration's f16
// keys have their own unit (examples/llamacpp/plan_layer_f16.cpp), so the runner alone never compiles them. The
// result, message and plan are those of
//   fairkv::dispatch(spec, [&](const auto& pol) { return fairkv::cpu::plan(ex, pol, in, ...); }).
#pragma once

#include <cstdint>
#include <span>

#include "fairkv/budget.hpp"
#include "fairkv/dispatch.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/cpu/executor.hpp"
#include "fairkv/views/kv_view.hpp"
#include "thread_pool.hpp"

namespace llama {

// The runner's thread pool as fairkv's executor (fairkv/cpu/executor.hpp): compression's KV heads become tasks of
// the same fork-join pool as the forward pass, so no second set of threads competes for the cores. Without a pool
// it runs the tasks in order on the calling thread, as fairkv::cpu::serial_executor does (one executor type keeps
// the compiled planning to one instantiation per key type).
struct pool_executor {
  thread_pool* pool = nullptr;
  [[nodiscard]] int64_t concurrency() const noexcept { return pool != nullptr ? pool->size() : 1; }
  void run(int64_t n, fairkv::cpu::task_ref f) const {
    if (pool == nullptr) {
      for (int64_t i = 0; i < n; ++i) f(i);
      return;
    }
    pool->parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) f(i);
    });
  }
};
static_assert(fairkv::cpu::executor<pool_executor>);

using f32_layer_inputs = fairkv::layer_inputs<fairkv::kv_view<const float>>;

// fairkv::cpu::plan(ex, <the policy spec names>, in, segments, whitelist, target, out).
[[nodiscard]] fairkv::result plan_layer(const fairkv::policy_spec& spec, const f32_layer_inputs& in,
                                        std::span<const fairkv::segment> segments,
                                        std::span<const int32_t> whitelist, fairkv::keep_target target,
                                        fairkv::keep_plan& out, const pool_executor& ex = {});

}  // namespace llama
