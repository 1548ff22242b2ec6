// Debiasing between the policy's own allocation (lambda = 0: each segment keeps what the plain policy would
// keep of it) and fair (lambda = 1): budget_g = (1 - lambda) * own_g + lambda * fair_g, made integer by largest
// remainder so each head still keeps exactly n_keep. Within a segment, tokens are chosen on segment-local scores,
// as under fair, so lambda = 1 is exactly `fair_with_whitelist` with the same protection; at lambda = 0 the
// per-segment counts are exactly the plain policy's (and so is the kept set, for scorers that are not attention-based).
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

#include "fairkv/allocator.hpp"
#include "fairkv/allocators/detail/proportional.hpp"
#include "fairkv/allocators/protection.hpp"

namespace fairkv::allocators {

struct debias {
  static constexpr bool uses_segments = true;
  static constexpr bool uses_whitelist = true;
  static constexpr bool segment_local = true;
  static constexpr bool needs_own_allocation = true;
  static constexpr const char* name = "debias";

  float lambda = 1.0f;
  protection protect{};  // sinks and boundary tokens, forced like the whitelist (allocators/protection.hpp)

  [[nodiscard]] result allocate(const allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    if (!(lambda >= 0.f && lambda <= 1.f))
      return result::error(status::invalid_argument, "debias.lambda = %g is outside [0, 1]", static_cast<double>(lambda));
    const auto g = static_cast<std::size_t>(ctx.groups());
    // The fair target is the same for every head.
    std::span<std::int64_t> fair_row = ctx.scratch.first(g);
    detail::proportional_budgets(ctx.n_keep, ctx.sizes, ctx.forced, fair_row, ctx.scratch.subspan(g, g));
    for (std::int64_t h = 0; h < ctx.heads; ++h) {
      auto target = [&](std::size_t i) {
        return (1.0 - lambda) * static_cast<double>(ctx.own[h * g + i]) +
               static_cast<double>(lambda) * static_cast<double>(fair_row[i]);
      };
      std::int64_t given = 0;
      for (std::size_t i = 0; i < g; ++i) {
        budgets[h * g + i] = static_cast<std::int64_t>(std::floor(target(i)));
        given += budgets[h * g + i];
      }
      // The leftover tokens (fewer than the groups) one each to the largest fractional parts, lower group index
      // on ties: one selection over the groups that can take one, not a scan per token.
      const std::int64_t left = ctx.n_keep - given;
      if (left <= 0) continue;
      std::span<std::int64_t> order = ctx.scratch.subspan(g, g);
      auto frac = [&](std::int64_t i) {
        return target(static_cast<std::size_t>(i)) - static_cast<double>(budgets[h * g + static_cast<std::size_t>(i)]);
      };
      std::size_t n = 0;
      for (std::size_t i = 0; i < g; ++i)
        if (frac(static_cast<std::int64_t>(i)) > 0.0 && budgets[h * g + i] < ctx.sizes[i])
          order[n++] = static_cast<std::int64_t>(i);
      if (static_cast<std::size_t>(left) > n)
        return result::error(status::internal_error, "debias: could not distribute the budget");
      detail::take_largest(order, n, left, frac);
      for (std::int64_t i = 0; i < left; ++i) ++budgets[h * g + static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
    }
    return {};
  }
};
static_assert(SegmentAllocator<debias>);

}  // namespace fairkv::allocators
