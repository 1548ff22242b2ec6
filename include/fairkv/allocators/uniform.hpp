#pragma once

#include <span>

#include "fairkv/allocator.hpp"

namespace fairkv::allocators {

// One budget n_keep = max(1, floor(L * (1 - ratio))) per head over the whole sequence. `uniform` is the plain
// policy; `whitelist` (allocators/whitelist.hpp) is the same budget with the caller's positions forced into it,
// which the planners do from the flag: the allocation itself does not change.
template <bool Whitelist>
struct basic_uniform {
  static constexpr bool uses_segments = false;
  static constexpr bool uses_whitelist = Whitelist;
  static constexpr bool segment_local = false;
  static constexpr bool needs_own_allocation = false;
  static constexpr const char* name = Whitelist ? "whitelist" : "uniform";

  [[nodiscard]] result allocate(const allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    for (std::int64_t h = 0; h < ctx.heads; ++h) budgets[h] = ctx.n_keep;  // one group
    return {};
  }
};

using uniform = basic_uniform<false>;
static_assert(SegmentAllocator<uniform>);

}  // namespace fairkv::allocators
