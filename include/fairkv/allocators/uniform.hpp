#pragma once
#include <span>

#include "fairkv/allocator.hpp"

namespace fairkv::allocators {

// The plain policy: one budget n_keep = max(1, floor(L * (1 - ratio))) per head over the whole sequence.
struct uniform {
  static constexpr bool uses_segments = false;
  static constexpr bool uses_whitelist = false;
  static constexpr bool segment_local = false;
  static constexpr bool needs_own_allocation = false;
  static constexpr const char* name = "uniform";

  [[nodiscard]] result allocate(const allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    for (std::int64_t h = 0; h < ctx.heads; ++h) budgets[h] = ctx.n_keep;  // one group
    return {};
  }
};
static_assert(SegmentAllocator<uniform>);

}  // namespace fairkv::allocators
