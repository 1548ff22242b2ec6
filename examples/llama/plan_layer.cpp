// The one translation unit that instantiates fairkv::cpu::plan for every policy fairkv::dispatch names, with the
// runner's executor, over f32 keys (plan_layer.hpp says why).
#include "plan_layer.hpp"

#include "fairkv/cpu/plan.hpp"

namespace llama {

fairkv::result plan_layer(const fairkv::policy_spec& spec, const f32_layer_inputs& in,
                          std::span<const fairkv::segment> segments, std::span<const int32_t> whitelist,
                          fairkv::keep_target target, fairkv::keep_plan& out, const pool_executor& ex) {
  return fairkv::dispatch(spec, [&](const auto& pol) {
    return fairkv::cpu::plan(ex, pol, in, segments, whitelist, target, out);
  });
}

}  // namespace llama
