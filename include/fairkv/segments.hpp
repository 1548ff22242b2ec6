// Segments are half-open token ranges of one sequence, e.g. the defense and each instruction of a system
// prompt. Tokens outside every segment form one implicit remainder segment. A whitelist is a set of token
// positions (shared by all heads) that must survive eviction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "fairkv/status.hpp"

namespace fairkv {

struct segment {
  std::int32_t begin = 0;  // first token
  std::int32_t end = 0;    // one past the last token
  [[nodiscard]] constexpr std::int32_t size() const noexcept { return end - begin; }
};

// Segments must be non-empty, inside [0, tokens) and pairwise disjoint; they may come in any order. O(n) when they
// come sorted by begin (the usual case), O(n log n) otherwise (an index array sorted by begin; only if that
// allocation fails, the pairwise O(n^2) check): an engine may pass tens of thousands of segments per plan.
namespace detail {
[[nodiscard]] inline result overlap_error(std::span<const segment> s, std::size_t a, std::size_t b) noexcept {
  const std::size_t j = a < b ? a : b, i = a < b ? b : a;
  return result::error(status::overlapping_segments, "segments[%zu] = [%d, %d) overlaps segments[%zu] = [%d, %d)", j,
                       s[j].begin, s[j].end, i, s[i].begin, s[i].end);
}
}  // namespace detail

[[nodiscard]] inline result validate_segments(std::span<const segment> segments, std::int64_t tokens) noexcept {
  const std::size_t n = segments.size();
  bool sorted = true;
  for (std::size_t i = 0; i < n; ++i) {
    const segment& s = segments[i];
    if (s.begin < 0 || s.end > tokens || s.begin >= s.end)
      return result::error(status::out_of_range,
                           "segments[%zu] = [%d, %d) is empty or outside the cache of %lld tokens", i, s.begin,
                           s.end, static_cast<long long>(tokens));
    sorted = sorted && (i == 0 || segments[i - 1].begin <= s.begin);
  }
  // Sorted by begin, a segment can only overlap its predecessor: every earlier one ends before that one begins.
  if (sorted) {
    for (std::size_t i = 1; i < n; ++i)
      if (segments[i].begin < segments[i - 1].end) return detail::overlap_error(segments, i - 1, i);
    return {};
  }
  std::vector<std::uint32_t> order;
  try {
    if (n <= UINT32_MAX) order.resize(n);
  } catch (...) {  // no memory for the index: the pairwise check below needs none
    order.clear();
  }
  if (!order.empty()) {
    for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return segments[a].begin != segments[b].begin ? segments[a].begin < segments[b].begin : a < b;
    });
    for (std::size_t k = 1; k < n; ++k)
      if (segments[order[k]].begin < segments[order[k - 1]].end)
        return detail::overlap_error(segments, order[k - 1], order[k]);
    return {};
  }
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (segments[i].begin < segments[j].end && segments[j].begin < segments[i].end)
        return detail::overlap_error(segments, j, i);
  return {};
}

// Whitelist positions must be inside [0, tokens); duplicates are allowed and count once.
[[nodiscard]] inline result validate_whitelist(std::span<const std::int32_t> whitelist, std::int64_t tokens) noexcept {
  for (std::size_t i = 0; i < whitelist.size(); ++i)
    if (whitelist[i] < 0 || whitelist[i] >= tokens)
      return result::error(status::out_of_range, "whitelist[%zu] = %d is outside the cache of %lld tokens", i,
                           whitelist[i], static_cast<long long>(tokens));
  return {};
}

}  // namespace fairkv
