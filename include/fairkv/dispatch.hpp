// The one place where runtime choices (policy names from a CLI or a config file) become compile-time policies.
// `dispatch(spec, f)` calls f(policy<...>{...}) with the instantiation the spec names, so only the call sites
// that really need runtime choice pay for instantiating the combinations.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "fairkv/allocators/debias.hpp"
#include "fairkv/allocators/fair.hpp"
#include "fairkv/allocators/fair_paper.hpp"
#include "fairkv/allocators/prioritized.hpp"
#include "fairkv/allocators/uniform.hpp"
#include "fairkv/allocators/whitelist.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/scorers/external.hpp"
#include "fairkv/scorers/h2o.hpp"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/scorers/snapkv.hpp"
#include "fairkv/scorers/streaming_llm.hpp"
#include "fairkv/scorers/tova.hpp"
#include "fairkv/selectors/head_adaptive.hpp"
#include "fairkv/selectors/per_head.hpp"
#include "fairkv/selectors/union_heads.hpp"
#include "fairkv/status.hpp"

namespace fairkv {

// external: the caller's scores (layer_inputs::scores), see scorers/external.hpp.
enum class scorer_kind : std::uint8_t { knorm, streaming_llm, snapkv, tova, h2o, external };
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

[[nodiscard]] inline result parse(std::string_view name, scorer_kind& out) noexcept {
  if (name == "knorm") out = scorer_kind::knorm;
  else if (name == "streaming_llm") out = scorer_kind::streaming_llm;
  else if (name == "snapkv") out = scorer_kind::snapkv;
  else if (name == "tova") out = scorer_kind::tova;
  else if (name == "h2o" || name == "observed_attention") out = scorer_kind::h2o;
  else if (name == "external") out = scorer_kind::external;
  else
    return result::error(status::invalid_argument,
                         "unknown scorer '%.*s' (knorm, streaming_llm, snapkv, tova, h2o, external)",
                         static_cast<int>(name.size()), name.data());
  return {};
}

[[nodiscard]] inline result parse(std::string_view name, selection_kind& out) noexcept {
  if (name == "per_head") out = selection_kind::per_head;
  else if (name == "union_heads" || name == "union") out = selection_kind::union_heads;  // "union": the old name
  else if (name == "head_adaptive") out = selection_kind::head_adaptive;
  else
    return result::error(status::invalid_argument, "unknown selector '%.*s' (per_head, union_heads, head_adaptive)",
                         static_cast<int>(name.size()), name.data());
  return {};
}

[[nodiscard]] inline result parse(std::string_view name, allocator_kind& out) noexcept {
  if (name == "uniform") out = allocator_kind::uniform;
  else if (name == "whitelist") out = allocator_kind::whitelist;
  else if (name == "fair") out = allocator_kind::fair;
  else if (name == "fair_with_whitelist") out = allocator_kind::fair_with_whitelist;
  else if (name == "debias") out = allocator_kind::debias;
  else if (name == "fair_paper") out = allocator_kind::fair_paper;
  else if (name == "prioritized") out = allocator_kind::prioritized;
  else
    return result::error(status::invalid_argument,
                         "unknown allocator '%.*s' (uniform, whitelist, fair, fair_with_whitelist, debias, fair_paper, "
                         "prioritized)",
                         static_cast<int>(name.size()), name.data());
  return {};
}

namespace detail {

template <class S, class Sel, class F>
decltype(auto) dispatch_allocator(const policy_spec& spec, S s, Sel sel, F&& f) {
  const allocators::protection protect{spec.sinks, spec.boundary};
  switch (spec.allocator) {
    case allocator_kind::whitelist: return f(policy<S, Sel, allocators::whitelist>{s, sel, {}});
    case allocator_kind::fair: return f(policy<S, Sel, allocators::fair>{s, sel, {protect}});
    case allocator_kind::fair_with_whitelist:
      return f(policy<S, Sel, allocators::fair_with_whitelist>{s, sel, {protect}});
    case allocator_kind::debias: return f(policy<S, Sel, allocators::debias>{s, sel, {spec.lambda, protect}});
    case allocator_kind::fair_paper:
      return f(policy<S, Sel, allocators::fair_paper>{s, sel, {{spec.paper_sinks, spec.boundary}}});
    case allocator_kind::prioritized:
      return f(policy<S, Sel, allocators::prioritized>{s, sel, {spec.priorities, spec.remainder_priority, protect}});
    case allocator_kind::uniform: break;
  }
  return f(policy<S, Sel, allocators::uniform>{s, sel, {}});
}

template <class S, class F>
decltype(auto) dispatch_selector(const policy_spec& spec, S s, F&& f) {
  switch (spec.selector) {
    case selection_kind::union_heads: return dispatch_allocator(spec, s, selectors::union_heads{}, f);
    case selection_kind::head_adaptive:
      return dispatch_allocator(spec, s, selectors::head_adaptive{spec.alpha_safeguard}, f);
    case selection_kind::per_head: break;
  }
  return dispatch_allocator(spec, s, selectors::per_head{}, f);
}

}  // namespace detail

// f must return the same type for every policy (typically fairkv::result).
template <class F>
decltype(auto) dispatch(const policy_spec& spec, F&& f) {
  switch (spec.scorer) {
    case scorer_kind::streaming_llm: {
      scorers::streaming_llm<> s{};
      s.n_sink = spec.n_sink;
      return detail::dispatch_selector(spec, s, f);
    }
    case scorer_kind::snapkv: {
      scorers::snapkv<> s{};
      s.window = spec.window;
      s.kernel = spec.kernel;
      return detail::dispatch_selector(spec, s, f);
    }
    case scorer_kind::tova: return detail::dispatch_selector(spec, scorers::tova{}, f);
    case scorer_kind::h2o: return detail::dispatch_selector(spec, scorers::h2o{}, f);
    case scorer_kind::external: return detail::dispatch_selector(spec, scorers::external{}, f);
    case scorer_kind::knorm: break;
  }
  return detail::dispatch_selector(spec, scorers::knorm{}, f);
}

}  // namespace fairkv
