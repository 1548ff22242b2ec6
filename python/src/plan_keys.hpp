// The body of plan_keys<T>: every built-in scorer over keys (and queries) of element type T, through
// fairkv::dispatch. Included once per element type so the instantiations compile in parallel.
#pragma once

#include <span>

#include "fairkv/cpu/plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "request.hpp"

namespace fairkv::python {

template <class T>
result plan_keys(const plan_request& r, keep_plan& out) noexcept {
  layer_inputs<kv_view<const T>, T> in{typed<T>(r.keys)};
  if (r.queries.data != nullptr) in.queries = typed<T>(r.queries);
  in.scale = r.scale;
  return dispatch(r.spec, [&](const auto& pol) -> result {
    using S = typename std::remove_cvref_t<decltype(pol)>::scorer_type;
    if constexpr (S::source == score_source::external) {
      return result::error(status::internal_error, "external scores reached the keys path");
    } else {
      return cpu::plan(pol, in, std::span<const segment>(r.segments), std::span<const std::int32_t>(r.whitelist),
                       r.target, out);
    }
  });
}

}  // namespace fairkv::python
