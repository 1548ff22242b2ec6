// The budget steps of every planner's host front end: which tokens are forced (whitelist, then the allocator's
// protected tokens) and how many each group may keep per head (the allocator, checked). The backends differ only
// in how they record a forced token (the CPU a mask, the CUDA backend a sorted list), so they report the same
// statuses with the same messages.
#pragma once

#include <cstdint>
#include <span>

#include "fairkv/allocator.hpp"
#include "fairkv/allocators/protection.hpp"
#include "fairkv/budget.hpp"
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv::detail {

// Forces sequence `seq`'s tokens (L tokens, budget n_keep = target.n_keep(L)) into an empty forced set: the
// whitelist (validated), whose distinct positions must fit the budget, then the protection's boundary tokens and
// sinks. `add(t)` forces t and returns false if it was forced already; `forced` receives the number of distinct
// forced tokens. `target` only words the messages.
template <class Add>
[[nodiscard]] result force_tokens(std::span<const std::int32_t> whitelist, const allocators::protection& protect,
                                  std::span<const segment> segments, std::int64_t L, std::int64_t n_keep,
                                  std::int64_t seq, const keep_target& target, std::int64_t& forced,
                                  Add&& add) noexcept {
  forced = 0;
  for (const std::int32_t t : whitelist) forced += add(t) ? 1 : 0;
  if (forced > n_keep)
    return result::error(status::budget_exceeded,
                         "the whitelist holds %lld distinct positions but sequence %lld keeps only %lld of its %lld "
                         "tokens at %s",
                         static_cast<long long>(forced), static_cast<long long>(seq), static_cast<long long>(n_keep),
                         static_cast<long long>(L), describe_target(target).text);
  return add_protected(protect, segments, L, n_keep, seq, target, forced, add);
}

// Budgets per (head, group) from the allocator, checked so that a user-written allocator cannot produce an
// inconsistent plan: every budget in [ctx.forced[g], ctx.sizes[g]], each head's budgets summing to ctx.n_keep.
template <class A>
[[nodiscard]] result allocate_budgets(const A& allocator, const allocation_context& ctx,
                                      std::span<std::int64_t> budgets) noexcept {
  FAIRKV_TRY(allocator.allocate(ctx, budgets));
  const std::int64_t groups = ctx.groups();
  for (std::int64_t h = 0; h < ctx.heads; ++h) {
    std::int64_t sum = 0;
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t v = budgets[static_cast<std::size_t>(h * groups + g)];
      const std::int64_t lo = ctx.forced[static_cast<std::size_t>(g)], hi = ctx.sizes[static_cast<std::size_t>(g)];
      if (v < lo || v > hi)
        return result::error(status::internal_error,
                             "allocator '%s' gave head %lld, group %lld a budget of %lld outside [%lld, %lld]", A::name,
                             static_cast<long long>(h), static_cast<long long>(g), static_cast<long long>(v),
                             static_cast<long long>(lo), static_cast<long long>(hi));
      sum += v;
    }
    if (sum != ctx.n_keep)
      return result::error(status::internal_error, "allocator '%s' gave head %lld %lld tokens instead of %lld", A::name,
                           static_cast<long long>(h), static_cast<long long>(sum),
                           static_cast<long long>(ctx.n_keep));
  }
  return {};
}

}  // namespace fairkv::detail
