// Budgets proportional to group sizes, integer by largest remainder, summing exactly to n_keep, with a lower
// bound per group (its whitelisted tokens). A group whose proportional share falls below its bound is pinned at
// the bound and the rest is shared again among the others (water-filling), so forced tokens are charged to the
// group they sit in and the unforced groups stay proportional among themselves.
#pragma once

#include <cstdint>
#include <span>

namespace fairkv::allocators::detail {

// out[g] for g < sizes.size(). Preconditions (checked by the backend): sizes[g] > 0, forced[g] <= sizes[g],
// sum(forced) <= n_keep <= sum(sizes). Ties in the remainder go to the lower group index, for determinism.
//
// proportional_budgets_from: the same, with some groups pinned by the caller beforehand: out[g] >= 0 is a pinned
// budget (charged to n_keep and left as it is), out[g] == proportional_active a group to share. The shares of the
// active groups then stay within their sizes as long as the pinned budgets leave them no more than their total.
inline constexpr std::int64_t proportional_active = -1;

inline void proportional_budgets_from(std::int64_t n_keep, std::span<const std::int64_t> sizes,
                                      std::span<const std::int64_t> forced, std::span<std::int64_t> out) noexcept {
  const std::size_t groups = sizes.size();
  // A negative out[g] marks a group still shared proportionally (not pinned at its forced count).
  constexpr std::int64_t active = proportional_active, topped_up = -2;
  for (;;) {
    std::int64_t budget = n_keep, active_size = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      if (out[g] >= 0)
        budget -= out[g];
      else
        active_size += sizes[g];
    }
    if (active_size == 0) return;
    bool pinned_any = false;
    for (std::size_t g = 0; g < groups; ++g) {
      // share < forced  <=>  budget * size < forced * active_size (exact in 64 bits: all factors < 2^31)
      if (out[g] < 0 && budget * sizes[g] < forced[g] * active_size) {
        out[g] = forced[g];
        pinned_any = true;
      }
    }
    if (pinned_any) continue;
    // Floors, then the leftovers (fewer than the active groups) one each by largest remainder.
    std::int64_t left = budget;
    for (std::size_t g = 0; g < groups; ++g)
      if (out[g] == active) left -= budget * sizes[g] / active_size;
    for (; left > 0; --left) {
      std::size_t best = groups;
      std::int64_t best_rem = -1;
      for (std::size_t g = 0; g < groups; ++g) {
        const std::int64_t rem = budget * sizes[g] % active_size;
        if (out[g] == active && rem > best_rem) {
          best_rem = rem;
          best = g;
        }
      }
      out[best] = topped_up;
    }
    for (std::size_t g = 0; g < groups; ++g)
      if (out[g] < 0) out[g] = budget * sizes[g] / active_size + (out[g] == topped_up ? 1 : 0);
    return;
  }
}

inline void proportional_budgets(std::int64_t n_keep, std::span<const std::int64_t> sizes,
                                 std::span<const std::int64_t> forced, std::span<std::int64_t> out) noexcept {
  for (std::size_t g = 0; g < sizes.size(); ++g) out[g] = proportional_active;
  proportional_budgets_from(n_keep, sizes, forced, out);
}

}  // namespace fairkv::allocators::detail
