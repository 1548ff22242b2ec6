// llama::plan_layer over llama.cpp's f16 keys, compiled once in plan_layer_f16.cpp (examples/llama/plan_layer.hpp
// says why), in the integration's target so that the runner alone never compiles it.
#pragma once

#include <cstdint>
#include <span>

#include "fairkv/dtype.hpp"
#include "plan_layer.hpp"

namespace llama {

using f16_layer_inputs = fairkv::layer_inputs<fairkv::kv_view<const fairkv::half_t>>;

// fairkv::cpu::plan(ex, <the policy spec names>, in, segments, whitelist, target, out).
[[nodiscard]] fairkv::result plan_layer(const fairkv::policy_spec& spec, const f16_layer_inputs& in,
                                        std::span<const fairkv::segment> segments,
                                        std::span<const int32_t> whitelist, fairkv::keep_target target,
                                        fairkv::keep_plan& out, const pool_executor& ex = {});

}  // namespace llama
