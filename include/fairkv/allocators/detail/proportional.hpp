// Budgets proportional to group sizes, integer by largest remainder, summing exactly to n_keep, with a lower
// bound per group (its whitelisted tokens). A group whose proportional share falls below its bound is pinned at
// the bound and the rest is shared again among the others (water-filling), so forced tokens are charged to the
// group they sit in and the unforced groups stay proportional among themselves.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

namespace fairkv::allocators::detail {

// out[g] for g < sizes.size(). Preconditions (checked by the backend): sizes[g] > 0, forced[g] <= sizes[g],
// sum(forced) <= n_keep <= sum(sizes). Ties in the remainder go to the lower group index, for determinism.
//
// proportional_budgets_from: the same, with some groups pinned by the caller beforehand: out[g] >= 0 is a pinned
// budget (charged to n_keep and left as it is), out[g] == proportional_active a group to share. The shares of the
// active groups then stay within their sizes as long as the pinned budgets leave them no more than their total.
// `order` is scratch of sizes.size() entries: O(groups log groups) at 100k segments, where a scan per pinning
// round and per leftover token was quadratic.
inline constexpr std::int64_t proportional_active = -1;

// Puts the k entries of order[0, n) with the largest key first (unordered), ties to the lower group index: the
// deterministic rule by which every allocator hands out its leftover tokens, one to each of k groups.
template <class Key>
void take_largest(std::span<std::int64_t> order, std::size_t n, std::int64_t k, const Key& key) {
  if (k <= 0 || static_cast<std::size_t>(k) >= n) return;
  std::nth_element(order.data(), order.data() + (k - 1), order.data() + n, [&](std::int64_t a, std::int64_t b) {
    const auto ka = key(a), kb = key(b);
    return ka != kb ? ka > kb : a < b;
  });
}

inline void proportional_budgets_from(std::int64_t n_keep, std::span<const std::int64_t> sizes,
                                      std::span<const std::int64_t> forced, std::span<std::int64_t> out,
                                      std::span<std::int64_t> order) noexcept {
  const std::size_t groups = sizes.size();
  // A negative out[g] marks a group still shared proportionally (not pinned at its forced count).
  constexpr std::int64_t active = proportional_active, topped_up = -2;
  std::int64_t budget = n_keep, active_size = 0;
  std::size_t n = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    if (out[g] >= 0) {
      budget -= out[g];
    } else {
      active_size += sizes[g];
      if (forced[g] > 0) order[n++] = static_cast<std::int64_t>(g);
    }
  }
  // Water-filling. A group is pinned when its share falls below its forced count, i.e. when forced/size exceeds
  // the active groups' rate budget/active_size; pinning such a group lowers the rate, so the pinned groups are
  // always the leading ones in forced/size order, and one walk down that order pins exactly the groups that
  // re-sharing after every round of pins would (all fractions compared exactly: every factor is below 2^31).
  std::sort(order.data(), order.data() + n, [&](std::int64_t a, std::int64_t b) {
    const std::int64_t lhs = forced[a] * sizes[b], rhs = forced[b] * sizes[a];
    return lhs != rhs ? lhs > rhs : a < b;
  });
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;  // this round: every remaining candidate whose share is below its forced count
    while (j < n && budget * sizes[order[j]] < forced[order[j]] * active_size) ++j;
    if (j == i) break;
    for (; i < j; ++i) {
      const auto g = static_cast<std::size_t>(order[i]);
      out[g] = forced[g];
      budget -= forced[g];
      active_size -= sizes[g];
    }
  }
  if (active_size == 0) return;
  // Floors, then the leftovers (fewer than the active groups) one each to the largest remainders, ties to the
  // lower group: a selection, not a scan per leftover token.
  std::int64_t left = budget;
  n = 0;
  for (std::size_t g = 0; g < groups; ++g)
    if (out[g] == active) {
      left -= budget * sizes[g] / active_size;
      order[n++] = static_cast<std::int64_t>(g);
    }
  take_largest(order, n, left, [&](std::int64_t g) { return budget * sizes[g] % active_size; });
  for (std::int64_t i = 0; i < left; ++i) out[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = topped_up;
  for (std::size_t g = 0; g < groups; ++g)
    if (out[g] < 0) out[g] = budget * sizes[g] / active_size + (out[g] == topped_up ? 1 : 0);
}

// order: scratch of sizes.size() entries.
inline void proportional_budgets(std::int64_t n_keep, std::span<const std::int64_t> sizes,
                                 std::span<const std::int64_t> forced, std::span<std::int64_t> out,
                                 std::span<std::int64_t> order) noexcept {
  for (std::size_t g = 0; g < sizes.size(); ++g) out[g] = proportional_active;
  proportional_budgets_from(n_keep, sizes, forced, out, order);
}

}  // namespace fairkv::allocators::detail
