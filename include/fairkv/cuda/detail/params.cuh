// What every planning kernel needs to know about one layer's segments, whitelist and budgets, passed BY VALUE as a
// kernel argument (so a plan needs no host-to-device copy, no host synchronisation, and a captured CUDA graph
// replays with the values of the capture). The host builds it from the caller's small host arrays; the fixed
// capacities below are the CUDA backend's limits (plan() returns not_supported naming the limit when exceeded).
// Kernel arguments above 4 KiB need CUDA 12.1+ on Volta or newer; this struct is about 9 KiB.
#pragma once

#include <cstdint>

#include "fairkv/config.hpp"
#include "fairkv/detail/search.hpp"

namespace fairkv::cuda {

inline constexpr int max_segments = 31;                   // caller's segments per layer
inline constexpr int max_runs = 2 * max_segments + 1;     // maximal runs of one group (segments + remainder gaps)
inline constexpr int max_groups = max_segments + 1;       // segments + the remainder
inline constexpr int max_budget_entries = 1024;           // heads * groups
inline constexpr int max_whitelist = 1024;                // distinct forced positions (whitelist + protection)

namespace detail {

struct run {
  std::int32_t begin, end, group;  // [begin, end) belongs to `group`
};

struct plan_params {
  std::int32_t batch = 0;
  std::int32_t heads = 0;
  std::int32_t tokens = 0;     // L, the same for every sequence of a kv_view
  std::int32_t n_runs = 0;
  std::int32_t groups = 0;
  std::int32_t n_forced = 0;   // distinct forced positions: whitelist, sinks, boundary tokens
  float alpha = 0.f;           // head_adaptive safeguard
  std::int32_t forced_per_group[max_groups];     // [groups] forced tokens (n_forced) that fall in each group
  std::int32_t sizes[max_groups];               // [groups] tokens per group
  std::int32_t slice_begin[max_groups + 1];     // [groups + 1] first selection slice of each group (split select)
  std::int32_t budgets[max_budget_entries];     // [heads, groups] checked budgets
  run runs[max_runs];                           // [n_runs] ascending, covering [0, tokens)
  std::int32_t forced[max_whitelist];           // [n_forced] ascending, distinct
};

// Group of token t: the run holding it (the runs tile [0, tokens) in order).
[[nodiscard]] FAIRKV_HOST_DEVICE inline std::int32_t group_of(const plan_params& p, std::int32_t t) noexcept {
  return p.runs[fairkv::detail::last_at_most(p.runs, p.n_runs, &run::begin, t)].group;
}

[[nodiscard]] FAIRKV_HOST_DEVICE inline bool is_forced(const plan_params& p, std::int32_t t) noexcept {
  std::int32_t lo = 0, hi = p.n_forced;
  while (lo < hi) {
    const std::int32_t mid = (lo + hi) / 2;
    if (p.forced[mid] < t) lo = mid + 1; else hi = mid;
  }
  return lo < p.n_forced && p.forced[lo] == t;
}

}  // namespace detail
}  // namespace fairkv::cuda
