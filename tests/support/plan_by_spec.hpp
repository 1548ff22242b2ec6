// cpu::plan for a policy chosen at run time (fairkv::dispatch), compiled once for the core suite in
// plan_by_spec.cpp: every policy of the registry is instantiated there once, for float keys and queries (or
// external scores) and any executor, instead of in every test that varies the policy. Tests that need
// another key type or a planner entry point of their own dispatch themselves.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "fairkv/budget.hpp"
#include "fairkv/cpu/executor.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy_spec.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv_test {

// Any executor behind one type, so the planner is instantiated once for all of them. Non-owning; calls go to the
// executor as they are (its exceptions, dropped or repeated tasks included: the planner's handling is under test).
class executor_ref {
 public:
  template <fairkv::cpu::executor E>
    requires(!std::is_same_v<E, executor_ref>)
  executor_ref(const E& e) noexcept  // NOLINT: implicit, like task_ref
      : obj_(&e),
        concurrency_([](const void* o) -> std::int64_t { return static_cast<const E*>(o)->concurrency(); }),
        run_([](const void* o, std::int64_t n, fairkv::cpu::task_ref f) { static_cast<const E*>(o)->run(n, f); }) {}
  [[nodiscard]] std::int64_t concurrency() const { return concurrency_(obj_); }
  void run(std::int64_t n, fairkv::cpu::task_ref f) const { run_(obj_, n, f); }

 private:
  const void* obj_;
  std::int64_t (*concurrency_)(const void*);
  void (*run_)(const void*, std::int64_t, fairkv::cpu::task_ref);
};

using float_inputs = fairkv::layer_inputs<fairkv::kv_view<const float>, float>;

[[nodiscard]] fairkv::result plan_by_spec(const executor_ref& ex, const fairkv::policy_spec& spec,
                                          const float_inputs& in, std::span<const fairkv::segment> segments,
                                          std::span<const std::int32_t> whitelist, const fairkv::keep_target& target,
                                          fairkv::keep_plan& out);
// Serially: the same planner behind executor_ref (concurrency 1), so the policies are instantiated once.
[[nodiscard]] inline fairkv::result plan_by_spec(const fairkv::policy_spec& spec, const float_inputs& in,
                                                 std::span<const fairkv::segment> segments,
                                                 std::span<const std::int32_t> whitelist,
                                                 const fairkv::keep_target& target, fairkv::keep_plan& out) {
  return plan_by_spec(executor_ref(fairkv::cpu::serial_executor{}), spec, in, segments, whitelist, target, out);
}

}  // namespace fairkv_test
