// A policy is Scorer x Selector x SegmentAllocator, composed at compile time. It is a trivially copyable
// aggregate (pass it by value into kernels); runtime parameters (SnapKV's window, debias's lambda, AdaKV's
// alpha) live in its members.
#pragma once

#include <type_traits>

#include "fairkv/allocator.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/selector.hpp"

namespace fairkv {

template <class S, class Sel, class A>
struct policy {
  // Checked here rather than in a requires-clause so a user sees one sentence that says what is missing
  // instead of a page of substitution failures.
  static_assert(Scorer<S>,
                "fairkv::policy<S, Sel, A>: S must satisfy fairkv::Scorer: a trivially copyable struct with "
                "`static constexpr fairkv::score_source source` and, for source == keys, "
                "`float operator()(const fairkv::key_row<T>&, fairkv::token_info) const` for every element type T "
                "(for source == position: `float operator()(fairkv::token_info) const`)");
  static_assert(Selector<Sel>,
                "fairkv::policy<S, Sel, A>: Sel must satisfy fairkv::Selector: a trivially copyable struct with "
                "`static constexpr fairkv::selection_kind kind` (and `float alpha_safeguard` for head_adaptive)");
  static_assert(SegmentAllocator<A>,
                "fairkv::policy<S, Sel, A>: A must satisfy fairkv::SegmentAllocator: static bool members "
                "uses_segments, uses_whitelist, segment_local, needs_own_allocation and "
                "`fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const`");

  using scorer_type = S;
  using selector_type = Sel;
  using allocator_type = A;

  S scorer{};
  Sel selector{};
  A allocator{};
};

template <class S, class Sel, class A>
policy(S, Sel, A) -> policy<S, Sel, A>;

}  // namespace fairkv
