// Where segment-local scoring draws its lines. A policy whose allocator scores segment-locally (fair,
// fair_with_whitelist, debias, prioritized, fair_paper) scores each region of a sequence on its own: a query
// attends only the keys of its own region, its attention re-normalised to them. The regions tile [0, tokens) in
// position order: the segments and the runs of tokens between them (fair_paper: its two spans widened to
// [0, split) and [split, tokens)); any other policy scores one region, [0, tokens).
//
// An engine that accumulates H2O's statistic during its own prefill, instead of keeping every query for fairkv to
// recompute it (quadratic), needs these regions: layer_inputs::attention_local_column_sums[k] for key k of region
// [rb, re) is the sum over the queries p in [k, re) of A[p, k] / (A[p, rb] + ... + A[p, p]), A the prefill's
// causal softmax (docs/integration.md shows the accumulation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <span>
#include <vector>

#include "fairkv/detail/plan_front/groups.hpp"
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/detail/validate.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv {

// Regions of a sequence with `segments` segments, at most.
[[nodiscard]] constexpr std::size_t max_scoring_regions(std::size_t segments) noexcept { return 2 * segments + 1; }

// The regions `pol` scores a sequence of `tokens` tokens in, given the plan's segments: out[0, count), in position
// order. out must hold max_scoring_regions(segments.size()) entries. The segments are validated as the planners
// validate them; on error count is 0 and out is untouched. Allocates scratch of O(segments) (out_of_memory if
// that fails).
template <class S, class Sel, class A>
[[nodiscard]] result scoring_regions(const policy<S, Sel, A>& pol, std::span<const segment> segments,
                                     std::int64_t tokens, std::span<segment> out, std::size_t& count) noexcept {
  (void)pol;
  count = 0;
  if (tokens < 1 || tokens > std::numeric_limits<std::int32_t>::max())
    return result::error(status::invalid_argument, "tokens = %lld is outside [1, 2^31 - 1]",
                         static_cast<long long>(tokens));
  FAIRKV_TRY(validate_segments(segments, tokens));
  constexpr bool paper = detail::is_paper_allocator_v<A>;
  if constexpr (paper) FAIRKV_TRY(detail::validate_paper_spans(segments, A::name));
  if (out.size() < max_scoring_regions(segments.size()))
    return result::error(status::invalid_argument, "out holds %zu regions; %zu segments need up to %zu",
                         out.size(), segments.size(), max_scoring_regions(segments.size()));
  // fair_paper's H2O scores the whole sequence (in the paper's way), like every policy that does not score
  // segment-locally; the others score the planners' own runs (detail/plan_front/groups.hpp).
  constexpr bool whole = !A::segment_local || !is_attention_source(S::source) ||
                         (paper && S::source == score_source::observed_attention);
  if constexpr (whole) {
    out[0] = {0, static_cast<std::int32_t>(tokens)};
    count = 1;
  } else {
    struct run {
      std::int32_t begin, end, group;
    };
    try {
      const std::size_t n = segments.size();
      std::vector<segment> sorted(n);
      std::vector<std::int32_t> origin(n);
      std::vector<run> runs(max_scoring_regions(n));
      std::vector<std::int64_t> sizes(n + 1);
      detail::sort_segments(segments, sorted.data(), origin.data());
      segment widened[2];
      const detail::grouping g = detail::build_runs(
          detail::grouping_segments<S, A>(std::span<const segment>(sorted), tokens, widened), tokens, runs.data(),
          sizes.data());
      for (std::int64_t r = 0; r < g.runs; ++r) out[static_cast<std::size_t>(r)] = {runs[r].begin, runs[r].end};
      count = static_cast<std::size_t>(g.runs);
    } catch (const std::bad_alloc&) {
      return result::error(status::out_of_memory, "out of host memory for %zu segments", segments.size());
    }
  }
  return {};
}

}  // namespace fairkv
