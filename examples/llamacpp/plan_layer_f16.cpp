// The integration's one translation unit that instantiates fairkv::cpu::plan for every policy fairkv::dispatch
// names over f16 keys (plan_layer_f16.hpp).
#include "plan_layer_f16.hpp"

#include "fairkv/cpu/plan.hpp"

namespace llama {

fairkv::result plan_layer(const fairkv::policy_spec& spec, const f16_layer_inputs& in,
                          std::span<const fairkv::segment> segments, std::span<const int32_t> whitelist,
                          fairkv::keep_target target, fairkv::keep_plan& out, const pool_executor& ex) {
  return fairkv::dispatch(spec, [&](const auto& pol) {
    return fairkv::cpu::plan(ex, pol, in, segments, whitelist, target, out);
  });
}

}  // namespace llama
