// The SegmentAllocator concept: turns a layer's keep budget into budgets per (head, segment).
//
// The backend partitions the sequence into groups (the caller's segments in ascending order, then the
// remainder of tokens outside every segment, if any) and hands the allocator their sizes, the number of
// whitelisted tokens in each, and (if the allocator asks for it) how many tokens of each group the plain
// policy would keep. The allocator writes budgets[h * groups + g]; the backend checks that every budget lies in
// [forced[g], sizes[g]] and that each head's budgets sum to n_keep, so a user-written allocator cannot corrupt a plan.
//
// Required: the four `static constexpr bool` flags below, `static constexpr const char* name` (error messages name
// the allocator) and `fairkv::result allocate(const allocation_context&, std::span<std::int64_t>) const`.
// Optional, and open to user allocators: `allocators::protection protect` (sinks and segment boundaries forced like
// the whitelist, allocators/protection.hpp). Reserved: `paper_spans`, which makes the planner rewrite the segments
// and score them the paper's way; only allocators::fair_paper may declare it.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "fairkv/status.hpp"

namespace fairkv {

struct allocation_context {
  std::int64_t n_keep = 0;                 // tokens each head keeps in this sequence
  std::int64_t heads = 0;                  // KV heads
  std::span<const std::int64_t> sizes;     // [groups] tokens per group
  std::span<const std::int64_t> forced;    // [groups] whitelisted tokens per group (shared by all heads)
  std::span<const std::int64_t> own;       // [heads, groups] plain policy's kept counts; empty unless requested
  std::span<std::int64_t> scratch;         // [2 * groups] free for the allocator's own use
  // [grouping segments] the caller's index of group g's segment, for parameters given per caller segment
  // (allocators/prioritized.hpp); the remainder group, last when present, has no entry.
  std::span<const std::int32_t> origin;
  [[nodiscard]] constexpr std::int64_t groups() const noexcept { return static_cast<std::int64_t>(sizes.size()); }
};

namespace allocators {
struct fair_paper;     // the one allocator that declares paper_spans (allocators/fair_paper.hpp)
struct protection;     // allocators/protection.hpp
}  // namespace allocators

namespace detail {

// The planners branch on these flags with if constexpr, so each must be a constant bool.
template <class A>
concept allocator_flags = requires {
  typename std::bool_constant<A::uses_segments>;         // takes the caller's segments
  typename std::bool_constant<A::uses_whitelist>;        // takes forced positions
  typename std::bool_constant<A::segment_local>;         // attention scorers score each segment alone
  typename std::bool_constant<A::needs_own_allocation>;  // wants allocation_context::own
};

// Each requirement on its own, so fairkv::policy can say which one a type misses (policy.hpp).
template <class A>
struct allocator_requirements {
  static constexpr bool aggregate = std::is_trivially_copyable_v<A> && std::is_standard_layout_v<A>;
  static constexpr bool flags = allocator_flags<A>;
  static constexpr bool name = requires {
    { A::name } -> std::convertible_to<const char*>;
  };
  static constexpr bool allocate =
      requires(const A& a, const allocation_context& ctx, std::span<std::int64_t> budgets) {
        { a.allocate(ctx, budgets) } -> std::same_as<result>;
      };
  static constexpr bool paper_spans_reserved = !requires { A::paper_spans; } || std::same_as<A, allocators::fair_paper>;
  // A member named `protect` is read as the allocator's protection; one of another type would be ignored silently.
  static constexpr bool protect_type = [] {
    if constexpr (requires(const A& a) { a.protect; })
      return std::same_as<std::remove_cvref_t<decltype(std::declval<const A&>().protect)>, allocators::protection>;
    else
      return true;
  }();
  static constexpr bool all = aggregate && flags && name && allocate && paper_spans_reserved && protect_type;
};

}  // namespace detail

template <class A>
concept SegmentAllocator = detail::allocator_requirements<A>::all;

}  // namespace fairkv
