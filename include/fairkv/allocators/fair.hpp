// Fair eviction, fairkv's proportional mode: each segment keeps the same fraction of its tokens. Budgets are
// proportional to segment length by largest remainder and sum exactly to the layer budget; attention scorers
// score every segment on its own, re-normalised to it (SnapKV's window is each segment's last tokens, TOVA is
// anchored at each segment's last token, H2O's attention does not cross segments). Tokens outside every segment
// (chat-template tokens) form one remainder group. Whitelisted tokens, sinks and boundary tokens
// (allocators/protection.hpp) are charged to the group they sit in. The paper's own two-span variant is
// allocators/fair_paper.hpp; docs/kvpress-semantics.md lists every difference.
#pragma once

#include <span>

#include "fairkv/allocator.hpp"
#include "fairkv/allocators/detail/proportional.hpp"
#include "fairkv/allocators/protection.hpp"

namespace fairkv::allocators {

template <bool Whitelist>
struct basic_fair {
  static constexpr bool uses_segments = true;
  static constexpr bool uses_whitelist = Whitelist;
  static constexpr bool segment_local = true;
  static constexpr bool needs_own_allocation = false;
  static constexpr const char* name = Whitelist ? "fair_with_whitelist" : "fair";

  protection protect{};

  [[nodiscard]] result allocate(const allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    const auto g = static_cast<std::size_t>(ctx.groups());
    detail::proportional_budgets(ctx.n_keep, ctx.sizes, ctx.forced, budgets.first(g), ctx.scratch.first(g));
    for (std::int64_t h = 1; h < ctx.heads; ++h)
      for (std::size_t i = 0; i < g; ++i) budgets[h * g + i] = budgets[i];
    return {};
  }
};

using fair = basic_fair<false>;
using fair_with_whitelist = basic_fair<true>;
static_assert(SegmentAllocator<fair>);
static_assert(SegmentAllocator<fair_with_whitelist>);

}  // namespace fairkv::allocators
