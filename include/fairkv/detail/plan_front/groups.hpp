// Groups and runs, the first step of every planner's host front end. A sequence of L tokens is planned in groups:
// the grouping segments in position order, then the remainder (tokens in no segment, a group only if there are
// any). A run is a maximal token range of one group; the runs tile [0, L) in order, so a token's group is one
// search away (detail/search.hpp) and no backend needs a per-token table.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/segments.hpp"

namespace fairkv::detail {

// The caller's (validated: disjoint, non-empty) segments in position order, into sorted[0, segments.size()), and
// where each came from: origin[i] is the caller's index of sorted[i] (allocation_context::origin, for allocators
// whose parameters are given per caller segment). Begins are distinct, so the order is unique.
inline void sort_segments(std::span<const segment> segments, segment* sorted, std::int32_t* origin) noexcept {
  for (std::size_t i = 0; i < segments.size(); ++i) origin[i] = static_cast<std::int32_t>(i);
  std::sort(origin, origin + segments.size(),
            [&](std::int32_t a, std::int32_t b) { return segments[static_cast<std::size_t>(a)].begin <
                                                         segments[static_cast<std::size_t>(b)].begin; });
  for (std::size_t i = 0; i < segments.size(); ++i) sorted[i] = segments[static_cast<std::size_t>(origin[i])];
}

// fair_paper's two adjacent spans (validated), given in position order, as the paper's original spans.
[[nodiscard]] inline paper_spans paper_spans_of(std::span<const segment> sorted) noexcept {
  return {sorted[0].begin, sorted[0].end, sorted[1].end};
}

// The segments a sequence of L tokens is grouped by, in position order: the caller's, sorted; under fair_paper its
// two spans widened to [0, split) and [split, L) (written to `widened`), or none for the paper's StreamingLLM,
// which keeps one global top-k.
template <class S, class A>
[[nodiscard]] std::span<const segment> grouping_segments(std::span<const segment> sorted, std::int64_t L,
                                                         segment (&widened)[2]) noexcept {
  if constexpr (is_paper_allocator_v<A>) {
    if constexpr (is_streaming_llm_v<S>) return {};
    widened[0] = {0, sorted[0].end};
    widened[1] = {sorted[0].end, static_cast<std::int32_t>(L)};
    return widened;
  } else {
    return sorted;
  }
}

// allocation_context::origin: the caller's index of each grouping segment's segment, in group order. fair_paper's
// widened spans keep their segments' indices; the paper's StreamingLLM groups by nothing.
template <class S, class A>
[[nodiscard]] std::span<const std::int32_t> group_origins(std::span<const std::int32_t> origin) noexcept {
  if constexpr (is_paper_allocator_v<A> && is_streaming_llm_v<S>) return {};
  return origin;
}

struct grouping {
  std::int64_t groups = 0;  // grouping segments, plus one if the remainder is not empty
  std::int64_t runs = 0;
};

// Tiles [0, L) with the runs of `in_order` (grouping segments, position order) and the remainder group between
// them, and sums each group's size. runs: [2 * in_order.size() + 1], sizes: [in_order.size() + 1]. Run is any
// {begin, end, group} aggregate and Size any integer (each backend keeps its own widths).
template <class Run, class Size>
grouping build_runs(std::span<const segment> in_order, std::int64_t L, Run* runs, Size* sizes) noexcept {
  using I = decltype(Run::begin);
  using G = decltype(Run::group);
  const auto remainder = static_cast<G>(in_order.size());
  std::int64_t pos = 0, covered = 0, n = 0;
  for (std::size_t i = 0; i < in_order.size(); ++i) {
    const segment& s = in_order[i];
    if (s.begin > pos) runs[n++] = Run{static_cast<I>(pos), static_cast<I>(s.begin), remainder};
    runs[n++] = Run{static_cast<I>(s.begin), static_cast<I>(s.end), static_cast<G>(i)};
    pos = s.end;
    covered += s.size();
  }
  if (pos < L) runs[n++] = Run{static_cast<I>(pos), static_cast<I>(L), remainder};
  const grouping g{static_cast<std::int64_t>(in_order.size()) + (covered < L ? 1 : 0), n};
  std::fill(sizes, sizes + g.groups, Size{0});
  for (std::int64_t r = 0; r < n; ++r) sizes[runs[r].group] += static_cast<Size>(runs[r].end - runs[r].begin);
  return g;
}

}  // namespace fairkv::detail
