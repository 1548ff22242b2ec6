// Remapping through a plan: segments and whitelists are positions in the cache, and compaction renumbers the
// cache (slot j of row (b, h) receives old token plan.row(b, h)[j]). An engine that compresses again and again
// (a conversation under a fixed budget) keeps its segments and whitelist by mapping them through each plan.
//
//   segment [begin, end)  -> [first new index whose old index >= begin, first new index whose old index >= end):
//                            the kept tokens of the segment, in order. A segment none of whose tokens was kept
//                            is dropped (segments are non-empty everywhere in fairkv) and counted.
//   whitelist position t  -> the new index of t; a position whose token was evicted is dropped and counted.
//                            Under a whitelist allocator every listed token is kept, so nothing is dropped.
//
// The map is one sequence's: by default every KV head of sequence b must keep the same tokens (union_heads, or
// llama.cpp's one count for every head), which is what per-sequence bookkeeping needs; otherwise the caller
// names the head to follow. Outputs keep the input's order, may alias the input (entry i is read before any
// entry after it is written) and are written only once every check has passed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <vector>

#include "fairkv/keep_plan.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv {

// `head` argument: follow every head of the sequence (they must agree).
inline constexpr std::int64_t every_head = -1;

struct remap_counts {
  std::size_t written = 0;  // entries written to the output, in input order
  std::size_t dropped = 0;  // segments with no kept token, whitelist positions whose token was evicted
};

namespace detail {

// The plan row that defines sequence b's map, checked as compaction would check it (so a map never disagrees
// with what compaction did), and, for every_head, the same kept set in every head.
[[nodiscard]] inline result remap_row(const_keep_plan_view plan, std::int64_t b, std::int64_t head,
                                      std::span<const std::int32_t>& row, std::int64_t& length) noexcept {
  if (plan.indices == nullptr || plan.counts == nullptr || plan.lengths == nullptr)
    return result::error(status::null_pointer, "plan: indices, counts and lengths must be non-null");
  if (plan.heads < 1)
    return result::error(status::invalid_plan, "plan has %lld heads", static_cast<long long>(plan.heads));
  if (b < 0 || b >= plan.batch)
    return result::error(status::out_of_range, "sequence %lld is outside the plan's %lld sequences",
                         static_cast<long long>(b), static_cast<long long>(plan.batch));
  if (head != every_head && (head < 0 || head >= plan.heads))
    return result::error(status::out_of_range, "head %lld is outside the plan's %lld heads (or every_head)",
                         static_cast<long long>(head), static_cast<long long>(plan.heads));
  length = plan.lengths[b];
  if (length < 0 || length > plan.capacity)
    return result::error(status::invalid_plan, "plan.lengths[%lld] = %lld is outside [0, capacity %lld]",
                         static_cast<long long>(b), static_cast<long long>(length),
                         static_cast<long long>(plan.capacity));
  const std::int64_t first = head == every_head ? 0 : head, last = head == every_head ? plan.heads : head + 1;
  for (std::int64_t h = first; h < last; ++h) {
    const std::int64_t n = plan.count(b, h);
    if (n < 0 || n > length)
      return result::error(status::invalid_plan, "plan: count of (batch %lld, head %lld) = %lld exceeds length %lld",
                           static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(n),
                           static_cast<long long>(length));
    const std::int32_t* r = plan.row(b, h);
    for (std::int64_t j = 0; j < n; ++j)
      if (r[j] < 0 || r[j] >= length || (j > 0 && r[j] <= r[j - 1]))
        return result::error(status::invalid_plan,
                             "plan: indices of (batch %lld, head %lld) are not strictly ascending in [0, %lld) at %lld",
                             static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(length),
                             static_cast<long long>(j));
    if (h > first && (n != plan.count(b, first) || !std::equal(r, r + n, plan.row(b, first))))
      return result::error(status::invalid_argument,
                           "heads %lld and %lld of sequence %lld keep different tokens, so the sequence has no "
                           "single map: plan with union_heads, or remap per head",
                           static_cast<long long>(first), static_cast<long long>(h), static_cast<long long>(b));
  }
  row = {plan.row(b, first), static_cast<std::size_t>(plan.count(b, first))};
  return {};
}

// New index of the first kept token at or after old position t.
[[nodiscard]] inline std::int32_t first_kept_at(std::span<const std::int32_t> row, std::int64_t t) noexcept {
  return static_cast<std::int32_t>(std::lower_bound(row.begin(), row.end(), t) - row.begin());
}

[[nodiscard]] inline result check_remap_output(std::size_t have, std::size_t need, const char* what) noexcept {
  if (have < need)
    return result::error(status::invalid_shape, "the output has room for %zu %s but %zu were given", have, what, need);
  return {};
}

}  // namespace detail

// Maps sequence b's segments (valid for the plan's length of b: non-empty, disjoint, any order) through the plan
// into `out` (at least segments.size() entries). Empty results are dropped.
[[nodiscard]] inline result remap_segments(const_keep_plan_view plan, std::int64_t b,
                                           std::span<const segment> segments, std::span<segment> out,
                                           remap_counts& counts, std::int64_t head = every_head) noexcept {
  std::span<const std::int32_t> row;
  std::int64_t length = 0;
  FAIRKV_TRY(detail::remap_row(plan, b, head, row, length));
  FAIRKV_TRY(validate_segments(segments, length));
  FAIRKV_TRY(detail::check_remap_output(out.size(), segments.size(), "segments"));
  counts = {};
  for (const segment s : segments) {  // by value: out may alias segments
    const segment mapped{detail::first_kept_at(row, s.begin), detail::first_kept_at(row, s.end)};
    if (mapped.begin == mapped.end)
      ++counts.dropped;
    else
      out[counts.written++] = mapped;
  }
  return {};
}

// Maps sequence b's whitelist (positions inside the plan's length of b, duplicates allowed) through the plan into
// `out` (at least whitelist.size() entries). Evicted positions are dropped.
[[nodiscard]] inline result remap_whitelist(const_keep_plan_view plan, std::int64_t b,
                                            std::span<const std::int32_t> whitelist, std::span<std::int32_t> out,
                                            remap_counts& counts, std::int64_t head = every_head) noexcept {
  std::span<const std::int32_t> row;
  std::int64_t length = 0;
  FAIRKV_TRY(detail::remap_row(plan, b, head, row, length));
  FAIRKV_TRY(validate_whitelist(whitelist, length));
  FAIRKV_TRY(detail::check_remap_output(out.size(), whitelist.size(), "whitelist positions"));
  counts = {};
  for (const std::int32_t t : whitelist) {
    const std::int32_t j = detail::first_kept_at(row, t);
    if (static_cast<std::size_t>(j) < row.size() && row[static_cast<std::size_t>(j)] == t)
      out[counts.written++] = j;
    else
      ++counts.dropped;
  }
  return {};
}

// Convenience: `out` is resized to the entries written (and left as it was on error). A failed allocation is
// status::out_of_memory.
[[nodiscard]] inline result remap_segments(const_keep_plan_view plan, std::int64_t b,
                                           std::span<const segment> segments, std::vector<segment>& out,
                                           remap_counts& counts, std::int64_t head = every_head) noexcept {
  try {
    std::vector<segment> mapped(segments.size());
    FAIRKV_TRY(remap_segments(plan, b, segments, std::span<segment>(mapped), counts, head));
    mapped.resize(counts.written);
    out.swap(mapped);
    return {};
  } catch (const std::exception&) {
    return result::error(status::out_of_memory, "out of host memory for %zu remapped segments", segments.size());
  }
}

[[nodiscard]] inline result remap_whitelist(const_keep_plan_view plan, std::int64_t b,
                                            std::span<const std::int32_t> whitelist, std::vector<std::int32_t>& out,
                                            remap_counts& counts, std::int64_t head = every_head) noexcept {
  try {
    std::vector<std::int32_t> mapped(whitelist.size());
    FAIRKV_TRY(remap_whitelist(plan, b, whitelist, std::span<std::int32_t>(mapped), counts, head));
    mapped.resize(counts.written);
    out.swap(mapped);
    return {};
  } catch (const std::exception&) {
    return result::error(status::out_of_memory, "out of host memory for %zu remapped whitelist positions",
                         whitelist.size());
  }
}

}  // namespace fairkv
