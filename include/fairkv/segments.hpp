// Segments are half-open token ranges of one sequence, e.g. the defense and each instruction of a system
// prompt. Tokens outside every segment form one implicit remainder segment. A whitelist is a set of token
// positions (shared by all heads) that must survive eviction.
#pragma once

#include <cstdint>
#include <span>

#include "fairkv/status.hpp"

namespace fairkv {

struct segment {
  std::int32_t begin = 0;  // first token
  std::int32_t end = 0;    // one past the last token
  [[nodiscard]] constexpr std::int32_t size() const noexcept { return end - begin; }
};

// Segments must be non-empty, inside [0, tokens) and pairwise disjoint; they may come in any order.
[[nodiscard]] inline result validate_segments(std::span<const segment> segments, std::int64_t tokens) noexcept {
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const segment& s = segments[i];
    if (s.begin < 0 || s.end > tokens || s.begin >= s.end)
      return result::error(status::out_of_range,
                           "segments[%zu] = [%d, %d) is empty or outside the cache of %lld tokens", i, s.begin,
                           s.end, static_cast<long long>(tokens));
    for (std::size_t j = 0; j < i; ++j)
      if (s.begin < segments[j].end && segments[j].begin < s.end)
        return result::error(status::overlapping_segments, "segments[%zu] = [%d, %d) overlaps segments[%zu] = [%d, %d)",
                             j, segments[j].begin, segments[j].end, i, s.begin, s.end);
  }
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
