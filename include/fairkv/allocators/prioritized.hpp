// Fair eviction with per-segment priorities: a weight and a floor for every caller segment (and one pair for the
// tokens outside every segment). What an engine under a fixed budget needs across a conversation: the system
// prompt's instructions keep at least a floor while older turns age out (a smaller weight each turn), and the
// sinks are always kept.
//
//   lower bound   lo_g = max(forced_g, ceil(floor_g * size_g)): the floor counts the whitelisted, sink and
//                 boundary tokens already in the segment, like fair_with_whitelist's forced counts. A product
//                 within float precision of an integer counts as that integer (a floor of 0.8 on 5 tokens is 4).
//   budgets       b_g = clamp(lambda * weight_g * size_g, lo_g, size_g), lambda chosen so that they sum to n_keep:
//                 proportional to weight x size, so a weight of 2 keeps twice the fraction of a weight of 1.
//   weight 0      the lowest tier: such a group keeps its lower bound only, and shares (proportionally to size)
//                 just what is left once every weighted group is kept whole.
// Equal weights (all 1, the default) and zero floors are exactly fair_with_whitelist (same integer arithmetic,
// tested), so the allocator generalises fair rather than approximating it. Unequal weights solve lambda in double
// precision and round by largest fractional part (ties to the lower group), on the host for both backends, so
// CPU and CUDA plans agree exactly. Within a segment tokens are chosen on segment-local scores, as under fair.
//
// Priorities are given per caller segment, in the caller's order (allocation_context::origin maps groups back);
// an empty span gives every segment weight 1 and floor 0. Floors that need more than the budget are
// status::budget_exceeded, never a silent cut.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fairkv/allocator.hpp"
#include "fairkv/allocators/detail/proportional.hpp"
#include "fairkv/allocators/protection.hpp"

namespace fairkv {

struct segment_priority {
  float weight = 1.0f;  // relative keep fraction, finite and >= 0; 0: kept only after every weighted segment
  float floor = 0.0f;   // fraction of the segment's tokens always kept, in [0, 1]
};

namespace allocators {

struct prioritized {
  static constexpr bool uses_segments = true;
  static constexpr bool uses_whitelist = true;
  static constexpr bool segment_local = true;
  static constexpr bool needs_own_allocation = false;
  static constexpr const char* name = "prioritized";

  std::span<const segment_priority> priorities{};  // one per caller segment, caller's order; empty: all default
  segment_priority remainder{};                     // the tokens outside every segment (chat-template tokens)
  protection protect{};                             // sinks and boundary tokens (allocators/protection.hpp)

  [[nodiscard]] result allocate(const allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    const auto g = static_cast<std::size_t>(ctx.groups());
    if (!priorities.empty() && priorities.size() != ctx.origin.size())
      return result::error(status::invalid_argument, "prioritized: %zu priorities were given for %zu segments",
                           priorities.size(), ctx.origin.size());
    for (std::size_t i = 0; i < priorities.size(); ++i)
      FAIRKV_TRY(check(priorities[i], "priorities", static_cast<std::int64_t>(i)));
    FAIRKV_TRY(check(remainder, "remainder", -1));

    // Lower bounds into scratch; the floors must fit the budget.
    std::span<std::int64_t> lo = ctx.scratch.first(g);
    std::int64_t lo_sum = 0;
    for (std::size_t i = 0; i < g; ++i) {
      lo[i] = std::max(ctx.forced[i], std::min(floor_tokens(of(i, ctx).floor, ctx.sizes[i]), ctx.sizes[i]));
      lo_sum += lo[i];
    }
    if (lo_sum > ctx.n_keep)
      return result::error(status::budget_exceeded,
                           "prioritized: the segments' floors and forced tokens need %lld tokens but the head keeps "
                           "only %lld",
                           static_cast<long long>(lo_sum), static_cast<long long>(ctx.n_keep));

    std::span<std::int64_t> row = budgets.first(g);
    std::int64_t full = 0;  // every weighted group whole, the others at their lower bounds
    bool equal_weights = true;
    float first_weight = -1.0f;
    for (std::size_t i = 0; i < g; ++i) {
      const float w = of(i, ctx).weight;
      full += w > 0.0f ? ctx.sizes[i] : lo[i];
      if (w > 0.0f) {
        if (first_weight < 0.0f) first_weight = w;
        equal_weights = equal_weights && w == first_weight;
      }
    }
    if (ctx.n_keep >= full || equal_weights) {
      // One tier is shared proportionally to size (fair's exact arithmetic), the other is pinned: the weighted
      // groups at their sizes when the budget reaches the unweighted tier, else the unweighted at their bounds.
      const bool weighted_full = ctx.n_keep >= full;
      for (std::size_t i = 0; i < g; ++i) {
        const bool weighted = of(i, ctx).weight > 0.0f;
        row[i] = weighted == weighted_full ? (weighted ? ctx.sizes[i] : lo[i]) : detail::proportional_active;
      }
      detail::proportional_budgets_from(ctx.n_keep, ctx.sizes, lo, row, ctx.scratch.subspan(g, g));
    } else {
      weighted_budgets(ctx, lo, row);
    }
    for (std::int64_t h = 1; h < ctx.heads; ++h)
      for (std::size_t i = 0; i < g; ++i) budgets[static_cast<std::size_t>(h) * g + i] = row[i];
    return {};
  }

 private:
  [[nodiscard]] const segment_priority& of(std::size_t group, const allocation_context& ctx) const noexcept {
    if (group >= ctx.origin.size()) return remainder;
    static constexpr segment_priority defaults{};
    return priorities.empty() ? defaults : priorities[static_cast<std::size_t>(ctx.origin[group])];
  }

  // ceil(floor * size), where a product within float precision of an integer is that integer: 0.8f is
  // 0.800000012, and a floor of 0.8 on 5 tokens means 4, not 5.
  [[nodiscard]] static std::int64_t floor_tokens(float floor, std::int64_t size) noexcept {
    double x = static_cast<double>(floor) * static_cast<double>(size);
    const double nearest = std::round(x);
    if (std::abs(x - nearest) <= x * 0x1p-23) x = nearest;
    return static_cast<std::int64_t>(std::ceil(x));
  }

  [[nodiscard]] static result check(const segment_priority& p, const char* what, std::int64_t i) noexcept {
    if (std::isfinite(p.weight) && p.weight >= 0.0f && p.floor >= 0.0f && p.floor <= 1.0f) return {};
    if (i < 0)
      return result::error(status::invalid_argument,
                           "prioritized: %s = {weight %g, floor %g}: the weight must be finite and >= 0, the floor in "
                           "[0, 1]",
                           what, static_cast<double>(p.weight), static_cast<double>(p.floor));
    return result::error(status::invalid_argument,
                         "prioritized: %s[%lld] = {weight %g, floor %g}: the weight must be finite and >= 0, the floor "
                         "in [0, 1]",
                         what, static_cast<long long>(i), static_cast<double>(p.weight), static_cast<double>(p.floor));
  }

  // Unequal weights, budget below `full`: the weighted groups take clamp(lambda * w * size, lo, size) with lambda
  // found by bisection (the sum is continuous and non-decreasing in lambda), the others their lower bounds; then
  // integers summing exactly to n_keep by largest fractional part.
  void weighted_budgets(const allocation_context& ctx, std::span<const std::int64_t> lo,
                        std::span<std::int64_t> row) const noexcept {
    const auto g = static_cast<std::size_t>(ctx.groups());
    std::int64_t target = ctx.n_keep;
    double hi = 0.0;
    for (std::size_t i = 0; i < g; ++i) {
      const double w = of(i, ctx).weight;
      if (w > 0.0)
        hi = std::max(hi, 1.0 / w);  // lambda * w * size >= size for every group from here
      else
        target -= lo[i];
    }
    auto share = [&](std::size_t i, double lambda) {
      const double a = static_cast<double>(of(i, ctx).weight) * static_cast<double>(ctx.sizes[i]);
      return std::clamp(lambda * a, static_cast<double>(lo[i]), static_cast<double>(ctx.sizes[i]));
    };
    auto total = [&](double lambda) {
      double s = 0.0;
      for (std::size_t i = 0; i < g; ++i)
        if (of(i, ctx).weight > 0.0f) s += share(i, lambda);
      return s;
    };
    double low = 0.0;
    for (int it = 0; it < 200 && low < hi; ++it) {
      const double mid = low + (hi - low) / 2;
      if (mid <= low || mid >= hi) break;
      (total(mid) <= static_cast<double>(target) ? low : hi) = mid;
    }
    const double lambda = low;
    std::int64_t given = 0;
    for (std::size_t i = 0; i < g; ++i) {
      row[i] = of(i, ctx).weight > 0.0f
                   ? std::clamp(static_cast<std::int64_t>(std::floor(share(i, lambda))), lo[i], ctx.sizes[i])
                   : lo[i];
      given += row[i];
    }
    // |n_keep - given| is below the number of weighted groups; each step moves one token.
    for (; given < ctx.n_keep; ++given) {
      std::size_t best = g;
      double best_frac = -1.0;
      for (std::size_t i = 0; i < g; ++i) {
        if (!(of(i, ctx).weight > 0.0f) || row[i] >= ctx.sizes[i]) continue;
        const double frac = share(i, lambda) - static_cast<double>(row[i]);
        if (frac > best_frac) best_frac = frac, best = i;
      }
      ++row[best];  // exists: given < n_keep <= the weighted sizes plus the others' bounds
    }
    for (; given > ctx.n_keep; --given) {
      std::size_t best = g;
      double best_frac = 2.0;
      for (std::size_t i = g; i-- > 0;) {
        if (!(of(i, ctx).weight > 0.0f) || row[i] <= lo[i]) continue;
        const double frac = share(i, lambda) - static_cast<double>(row[i]);
        if (frac < best_frac) best_frac = frac, best = i;
      }
      --row[best];  // exists: given > n_keep >= the lower bounds' sum
    }
  }
};
static_assert(SegmentAllocator<prioritized>);

}  // namespace allocators
}  // namespace fairkv
