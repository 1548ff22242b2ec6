#include "plan_by_spec.hpp"

#include "fairkv/cpu/plan.hpp"
#include "fairkv/dispatch.hpp"

namespace fairkv_test {

fairkv::result plan_by_spec(const executor_ref& ex, const fairkv::policy_spec& spec, const float_inputs& in,
                            std::span<const fairkv::segment> segments, std::span<const std::int32_t> whitelist,
                            const fairkv::keep_target& target, fairkv::keep_plan& out) {
  return fairkv::dispatch(spec, [&](const auto& pol) {
    return fairkv::cpu::plan(ex, pol, in, segments, whitelist, target, out);
  });
}

}  // namespace fairkv_test
