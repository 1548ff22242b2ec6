// External scores: the caller's [batch, heads, tokens] scores decide, every allocator and selector applies.
#include <span>

#include "fairkv/cpu/plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "request.hpp"

namespace fairkv::python {

result plan_scores(const plan_request& r, keep_plan& out) noexcept {
  policy_spec spec = r.spec;
  spec.scorer = scorer_kind::external;
  const auto in = scores_only(r.scores);
  // Only the external scorer is instantiated: the selector and allocator are dispatched as usual.
  return detail::dispatch_selector(spec, scorers::external{}, [&](const auto& pol) -> result {
    return cpu::plan(pol, in, std::span<const segment>(r.segments), std::span<const std::int32_t>(r.whitelist),
                     r.target, out);
  });
}

}  // namespace fairkv::python
