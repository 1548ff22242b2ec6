// A policy chosen at run time: the kinds of its three parts (named by the registry, registry.hpp) and the
// parameters the built-ins take. fairkv::dispatch turns it into the compile-time fairkv::policy it names.
#pragma once

#include <cstdint>
#include <span>

#include "fairkv/allocators/prioritized.hpp"
#include "fairkv/selector.hpp"

namespace fairkv {

// The enumerators are the registry's keys: each has exactly one entry there (checked at compile time).
// external: the caller's scores (layer_inputs::scores), see scorers/external.hpp.
enum class scorer_kind : std::uint8_t { knorm, streaming_llm, snapkv, tova, h2o, external, random };
enum class allocator_kind : std::uint8_t {
  uniform,
  whitelist,
  fair,
  fair_with_whitelist,
  debias,
  fair_paper,
  prioritized
};

struct policy_spec {
  scorer_kind scorer = scorer_kind::knorm;
  selection_kind selector = selection_kind::per_head;
  allocator_kind allocator = allocator_kind::uniform;
  std::int32_t window = 64;       // snapkv
  std::int32_t kernel = 5;        // snapkv
  std::int32_t n_sink = 4;        // streaming_llm
  std::uint32_t seed = 0;         // random
  float alpha_safeguard = 0.20f;  // head_adaptive
  float lambda = 1.0f;            // debias
  std::int32_t sinks = 4;         // fair, fair_with_whitelist, debias: leading tokens always kept (allocators/protection.hpp)
  std::int32_t paper_sinks = 0;   // fair_paper: the paper keeps no sinks explicitly
  std::int32_t boundary = 0;      // segment-aware allocators: tokens kept at each end of every segment
  // prioritized: a weight and a floor per caller segment (empty: weight 1, floor 0), and for the tokens outside
  // every segment. The span is read when the plan is made; it must outlive the calls made with this spec.
  std::span<const segment_priority> priorities{};
  segment_priority remainder_priority{};
};

}  // namespace fairkv
