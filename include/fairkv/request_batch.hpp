// Per-request policy inputs for one planning call over a batch: every sequence its own segments, whitelist and keep
// target, in the CSR form serving engines batch requests in (FlashInfer's indptr convention). A batch of requests
// with different system prompts plans in one call instead of one call per request. A sequence of no tokens (an idle
// slot of a ragged batch) plans to nothing and takes no lists.
#pragma once

#include <cstdint>
#include <span>

#include "fairkv/budget.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv {

struct request_batch {
  // Sequence b's segments are segments[seg_indptr[b], seg_indptr[b + 1]); empty seg_indptr: no sequence has any.
  std::span<const std::int32_t> seg_indptr;
  std::span<const segment> segments;
  // Sequence b's whitelist is whitelist[wl_indptr[b], wl_indptr[b + 1]); empty wl_indptr: none.
  std::span<const std::int32_t> wl_indptr;
  std::span<const std::int32_t> whitelist;
  // One target per sequence, or a single one for all of them.
  std::span<const keep_target> targets;

  // Valid after validate(*this, batch).
  [[nodiscard]] std::span<const segment> segments_of(std::int64_t b) const noexcept {
    if (seg_indptr.empty()) return {};
    const auto i = static_cast<std::size_t>(b);
    return segments.subspan(static_cast<std::size_t>(seg_indptr[i]),
                            static_cast<std::size_t>(seg_indptr[i + 1] - seg_indptr[i]));
  }
  [[nodiscard]] std::span<const std::int32_t> whitelist_of(std::int64_t b) const noexcept {
    if (wl_indptr.empty()) return {};
    const auto i = static_cast<std::size_t>(b);
    return whitelist.subspan(static_cast<std::size_t>(wl_indptr[i]),
                             static_cast<std::size_t>(wl_indptr[i + 1] - wl_indptr[i]));
  }
  [[nodiscard]] const keep_target& target_of(std::int64_t b) const noexcept {
    return targets.size() == 1 ? targets[0] : targets[static_cast<std::size_t>(b)];
  }
};

namespace detail {
[[nodiscard]] inline result validate_indptr(std::span<const std::int32_t> indptr, std::size_t entries,
                                            std::int64_t batch, const char* name, const char* of) noexcept {
  if (indptr.empty()) {
    if (entries != 0) return result::error(status::invalid_argument, "%zu %s were given without %s", entries, of, name);
    return {};
  }
  if (static_cast<std::int64_t>(indptr.size()) != batch + 1)
    return result::error(status::invalid_shape, "%s has %zu entries; a batch of %lld needs %lld", name, indptr.size(),
                         static_cast<long long>(batch), static_cast<long long>(batch + 1));
  if (indptr[0] != 0) return result::error(status::invalid_shape, "%s[0] = %d must be 0", name, indptr[0]);
  for (std::size_t i = 1; i < indptr.size(); ++i)
    if (indptr[i] < indptr[i - 1])
      return result::error(status::invalid_shape, "%s decreases at %zu (%d after %d)", name, i, indptr[i],
                           indptr[i - 1]);
  if (static_cast<std::size_t>(indptr.back()) != entries)
    return result::error(status::invalid_shape, "%s ends at %d but %zu %s were given", name, indptr.back(), entries,
                         of);
  return {};
}
}  // namespace detail

// The CSR structure only (offsets, counts, targets present); what each sequence's lists hold is checked by the
// planner against that sequence's length.
[[nodiscard]] inline result validate(const request_batch& r, std::int64_t batch) noexcept {
  FAIRKV_TRY(detail::validate_indptr(r.seg_indptr, r.segments.size(), batch, "seg_indptr", "segments"));
  FAIRKV_TRY(detail::validate_indptr(r.wl_indptr, r.whitelist.size(), batch, "wl_indptr", "whitelist positions"));
  if (r.targets.size() != 1 && static_cast<std::int64_t>(r.targets.size()) != batch)
    return result::error(status::invalid_shape, "%zu keep targets for a batch of %lld: give one, or one per sequence",
                         r.targets.size(), static_cast<long long>(batch));
  return {};
}

}  // namespace fairkv
