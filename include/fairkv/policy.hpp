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
  // Checked here rather than in a requires-clause so a user sees one sentence per missing requirement instead of
  // a page of substitution failures. Each assertion tests one requirement and only fires when the earlier ones
  // hold, so the first message is the one to read.
  using scorer_check = detail::scorer_requirements<S>;
  static_assert(scorer_check::aggregate,
                "fairkv::policy<S, Sel, A>: S must satisfy fairkv::Scorer: it must be a trivially copyable, "
                "standard-layout struct (it is passed by value into GPU kernels)");
  static_assert(!scorer_check::aggregate || scorer_check::source,
                "fairkv::policy<S, Sel, A>: S must satisfy fairkv::Scorer: it needs "
                "`static constexpr fairkv::score_source source`");
  static_assert(!scorer_check::aggregate || !scorer_check::source || scorer_check::name,
                "fairkv::policy<S, Sel, A>: S must satisfy fairkv::Scorer: it needs "
                "`static constexpr const char* name`");
  static_assert(!scorer_check::aggregate || !scorer_check::source || !scorer_check::name ||
                    scorer_check::builtin_source,
                "fairkv::policy<S, Sel, A>: S must satisfy fairkv::Scorer: the attention sources (window_attention, "
                "last_attention, observed_attention) and external are filled by the backends themselves and are "
                "reserved for the built-in fairkv::scorers::snapkv, tova, h2o and external; a user scorer declares "
                "source = keys or position and computes its own score (scores computed elsewhere go through "
                "fairkv::scorers::external and layer_inputs::scores)");
  static_assert(!scorer_check::aggregate || !scorer_check::source || !scorer_check::name ||
                    !scorer_check::builtin_source || scorer_check::interface,
                "fairkv::policy<S, Sel, A>: S must satisfy fairkv::Scorer: for source == keys it needs "
                "`float operator()(const fairkv::key_row<T, C>&, fairkv::token_info) const` for every element type "
                "T (float, half_t, bfloat16_t) and both C (a template on the row type does it); for source == "
                "position `float operator()(fairkv::token_info) const`");

  using selector_check = detail::selector_requirements<Sel>;
  static_assert(selector_check::aggregate,
                "fairkv::policy<S, Sel, A>: Sel must satisfy fairkv::Selector: it must be a trivially copyable, "
                "standard-layout struct");
  static_assert(!selector_check::aggregate || selector_check::kind,
                "fairkv::policy<S, Sel, A>: Sel must satisfy fairkv::Selector: it needs "
                "`static constexpr fairkv::selection_kind kind`");
  static_assert(!selector_check::aggregate || !selector_check::kind || selector_check::builtin,
                "fairkv::policy<S, Sel, A>: Sel must satisfy fairkv::Selector: the selection kinds are a closed set "
                "that every backend implements itself; use the built-in fairkv::selectors::per_head, union_heads "
                "or head_adaptive (a user type claiming a kind would silently run the built-in strategy)");
  static_assert(!selector_check::aggregate || !selector_check::kind || !selector_check::builtin ||
                    (selector_check::name && selector_check::alpha),
                "fairkv::policy<S, Sel, A>: Sel must satisfy fairkv::Selector: it needs "
                "`static constexpr const char* name` (and `float alpha_safeguard` for head_adaptive)");

  using allocator_check = detail::allocator_requirements<A>;
  static_assert(allocator_check::aggregate,
                "fairkv::policy<S, Sel, A>: A must satisfy fairkv::SegmentAllocator: it must be a trivially "
                "copyable, standard-layout struct");
  static_assert(!allocator_check::aggregate || allocator_check::flags,
                "fairkv::policy<S, Sel, A>: A must satisfy fairkv::SegmentAllocator: it needs the constant flags "
                "`static constexpr bool uses_segments, uses_whitelist, segment_local, needs_own_allocation`");
  static_assert(!allocator_check::aggregate || !allocator_check::flags || allocator_check::name,
                "fairkv::policy<S, Sel, A>: A must satisfy fairkv::SegmentAllocator: it needs "
                "`static constexpr const char* name`");
  static_assert(!allocator_check::aggregate || !allocator_check::flags || !allocator_check::name ||
                    allocator_check::allocate,
                "fairkv::policy<S, Sel, A>: A must satisfy fairkv::SegmentAllocator: it needs "
                "`fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const`");
  static_assert(!allocator_check::aggregate || !allocator_check::flags || !allocator_check::name ||
                    !allocator_check::allocate || allocator_check::paper_spans_reserved,
                "fairkv::policy<S, Sel, A>: A must satisfy fairkv::SegmentAllocator: `paper_spans` is reserved for "
                "fairkv::allocators::fair_paper (it makes the planner rewrite the segments the paper's way)");
  static_assert(!allocator_check::aggregate || !allocator_check::flags || !allocator_check::name ||
                    !allocator_check::allocate || !allocator_check::paper_spans_reserved ||
                    allocator_check::protect_type,
                "fairkv::policy<S, Sel, A>: A must satisfy fairkv::SegmentAllocator: a member named `protect` must "
                "be a fairkv::allocators::protection (the planner forces the tokens it names)");

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
