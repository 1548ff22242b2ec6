// Which tokens a plan keeps whatever their scores, for every backend: the whitelist (checked by the caller), then
// the allocator's protection (allocators/protection.hpp): boundary tokens of every segment, all of them or
// status::budget_exceeded, then the sinks as far as the budget allows. The CPU marks a mask and the CUDA backend
// a sorted list through the same enumeration, so both force the same tokens and report the same errors.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>

#include "fairkv/allocators/protection.hpp"
#include "fairkv/budget.hpp"
#include "fairkv/scorers/streaming_llm.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv::detail {

template <class A>
inline constexpr bool has_protection_v = requires(const A& a) {
  { a.protect } -> std::convertible_to<allocators::protection>;
};

// The paper's two-span mode (allocators/fair_paper.hpp): the planner widens the spans and scores them its way.
template <class A>
inline constexpr bool is_paper_allocator_v = requires { requires A::paper_spans; };

// The paper's fair StreamingLLM keeps one global top-k over per-span ramps instead of splitting the budget.
template <class S>
inline constexpr bool is_streaming_llm_v = false;
template <int NSink>
inline constexpr bool is_streaming_llm_v<scorers::streaming_llm<NSink>> = true;

template <class A>
[[nodiscard]] constexpr allocators::protection protection_of(const A& a) noexcept {
  if constexpr (has_protection_v<A>)
    return a.protect;
  else
    return {0, 0};
}

[[nodiscard]] inline result validate_protection(const allocators::protection& p) noexcept {
  if (p.n_sink < 0)
    return result::error(status::invalid_argument, "allocator.protect.n_sink = %d must be non-negative", p.n_sink);
  if (p.boundary < 0)
    return result::error(status::invalid_argument, "allocator.protect.boundary = %d must be non-negative", p.boundary);
  return {};
}

// Upper bound on the tokens protection adds to one sequence of L tokens (for fixed-capacity backends).
[[nodiscard]] inline std::int64_t protected_bound(const allocators::protection& p, std::int64_t L,
                                                  std::span<const segment> segments) noexcept {
  std::int64_t n = std::min<std::int64_t>(p.n_sink, L);
  for (const segment& s : segments) n += std::min<std::int64_t>(s.size(), 2 * std::int64_t{p.boundary});
  return n;
}

// Adds sequence `seq`'s protected tokens (L tokens, budget n_keep = target.n_keep(L)) to a forced set that
// already holds `forced` distinct tokens. `add(t)` forces t and returns false if it was forced already.
template <class Add>
[[nodiscard]] result add_protected(const allocators::protection& p, std::span<const segment> segments, std::int64_t L,
                                   std::int64_t n_keep, std::int64_t seq, const keep_target& target,
                                   std::int64_t& forced, Add&& add) noexcept {
  if (p.boundary > 0) {
    const std::int64_t before = forced;
    for (const segment& s : segments) {
      const std::int64_t head_end = std::min<std::int64_t>(s.end, std::int64_t{s.begin} + p.boundary);
      const std::int64_t tail_begin = std::max<std::int64_t>(head_end, std::int64_t{s.end} - p.boundary);
      for (std::int64_t t = s.begin; t < head_end; ++t) forced += add(t) ? 1 : 0;
      for (std::int64_t t = tail_begin; t < s.end; ++t) forced += add(t) ? 1 : 0;
    }
    if (forced > n_keep)
      return result::error(status::budget_exceeded,
                           "allocator.protect.boundary = %d protects %lld more tokens (beyond %lld whitelisted) but "
                           "sequence %lld keeps only %lld of its %lld tokens at %s",
                           p.boundary, static_cast<long long>(forced - before), static_cast<long long>(before),
                           static_cast<long long>(seq), static_cast<long long>(n_keep), static_cast<long long>(L),
                           describe_target(target).text);
  }
  for (std::int64_t t = 0; t < std::min<std::int64_t>(p.n_sink, L) && forced < n_keep; ++t) forced += add(t) ? 1 : 0;
  return {};
}

}  // namespace fairkv::detail
