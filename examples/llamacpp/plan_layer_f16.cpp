// The integration's one translation unit that instantiates fairkv::cpu::plan for every policy fairkv::dispatch
// names over f16 keys (plan_layer_f16.hpp): the library adapter's planner (fairkv/llamacpp/compress_state.hpp) on
// the runner's pool.
#include "plan_layer_f16.hpp"

#include "fairkv/llamacpp/compress_state.hpp"

namespace llama {

fairkv::result plan_layer(const fairkv::policy_spec& spec, const f16_layer_inputs& in,
                          std::span<const fairkv::segment> segments, std::span<const int32_t> whitelist,
                          fairkv::keep_target target, fairkv::keep_plan& out, const pool_executor& ex) {
  return fairkv::llamacpp::inline_planner<pool_executor>{ex}(spec, in, segments, whitelist, target, out);
}

}  // namespace llama
