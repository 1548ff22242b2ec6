// The SegmentAllocator concept: turns a layer's keep budget into budgets per (head, segment).
//
// The backend partitions the sequence into groups (the caller's segments in ascending order, then the
// remainder of tokens outside every segment, if any) and hands the allocator their sizes, the number of
// whitelisted tokens in each, and (if the allocator asks for it) how many tokens of each group the plain
// policy would keep. The allocator writes budgets[h * groups + g]; the backend checks that every budget lies in
// [forced[g], sizes[g]] and that each head's budgets sum to n_keep, so a user-written allocator cannot corrupt a plan.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>

#include "fairkv/status.hpp"

namespace fairkv {

struct allocation_context {
  std::int64_t n_keep = 0;                 // tokens each head keeps in this sequence
  std::int64_t heads = 0;                  // KV heads
  std::span<const std::int64_t> sizes;     // [groups] tokens per group
  std::span<const std::int64_t> forced;    // [groups] whitelisted tokens per group (shared by all heads)
  std::span<const std::int64_t> own;       // [heads, groups] plain policy's kept counts; empty unless requested
  std::span<std::int64_t> scratch;         // [groups] free for the allocator's own use
  [[nodiscard]] constexpr std::int64_t groups() const noexcept { return static_cast<std::int64_t>(sizes.size()); }
};

template <class A>
concept SegmentAllocator = std::is_trivially_copyable_v<A> && std::is_standard_layout_v<A> && requires {
  { A::uses_segments } -> std::convertible_to<bool>;         // takes the caller's segments
  { A::uses_whitelist } -> std::convertible_to<bool>;        // takes forced positions
  { A::segment_local } -> std::convertible_to<bool>;         // attention scorers score each segment alone
  { A::needs_own_allocation } -> std::convertible_to<bool>;  // wants allocation_context::own
} && requires(const A& a, const allocation_context& ctx, std::span<std::int64_t> budgets) {
  { a.allocate(ctx, budgets) } -> std::same_as<result>;
};

}  // namespace fairkv
