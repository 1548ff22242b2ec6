#pragma once
#include <span>

#include "fairkv/allocator.hpp"

namespace fairkv::allocators {

// Force-keep the caller's positions (shared by all heads); they consume the budget, the rest goes by score.
// More positions than the budget is an error (status::budget_exceeded), never a silent truncation.
struct whitelist {
  static constexpr bool uses_segments = false;
  static constexpr bool uses_whitelist = true;
  static constexpr bool segment_local = false;
  static constexpr bool needs_own_allocation = false;
  static constexpr const char* name = "whitelist";

  [[nodiscard]] result allocate(const allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    for (std::int64_t h = 0; h < ctx.heads; ++h) budgets[h] = ctx.n_keep;
    return {};
  }
};
static_assert(SegmentAllocator<whitelist>);

}  // namespace fairkv::allocators
