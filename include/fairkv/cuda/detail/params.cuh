// What every planning kernel needs to know about one sequence's segments, whitelist and budgets. The host builds
// it from the caller's small host arrays, once per planner::initialize: one for the whole batch when every
// sequence has the same length and lists, else one per sequence (per-request lists, ragged lengths), uploaded
// into the plan's workspace with one copy; the kernels find their sequence's through batch_params, which is
// passed by value. The fixed capacities below are the CUDA backend's limits per sequence (plan() returns
// not_supported naming the limit when exceeded); a sequence's parameters are about 9 KiB.
#pragma once

#include <cstdint>

#include "fairkv/config.hpp"
#include "fairkv/detail/paper_spans.hpp"
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
  std::int32_t tokens = 0;     // L, this sequence's length
  std::int32_t n_runs = 0;
  std::int32_t groups = 0;
  std::int32_t n_forced = 0;   // distinct forced positions: whitelist, sinks, boundary tokens
  float alpha = 0.f;           // head_adaptive safeguard
  bool paper = false;          // fair_paper: the groups are the widened spans of `spans`
  fairkv::detail::paper_spans spans{};  // fair_paper: the original spans (H2O's cut, StreamingLLM's ramps)
  std::int32_t forced_per_group[max_groups];     // [groups] forced tokens (n_forced) that fall in each group
  std::int32_t sizes[max_groups];               // [groups] tokens per group
  std::int32_t slice_begin[max_groups + 1];     // [groups + 1] first selection slice of each group (split select)
  std::int32_t budgets[max_budget_entries];     // [heads, groups] checked budgets
  run runs[max_runs];                           // [n_runs] ascending, covering [0, tokens)
  std::int32_t forced[max_whitelist];           // [n_forced] ascending, distinct
};

// The attention scorers' scoring regions of one sequence (detail/score_attention.cuh).
struct attention_region {
  std::int32_t begin, end;  // [begin, end) tokens of the region
  std::int32_t scored;      // keys [begin, begin + scored) get an attention score; the rest are padded
  std::int32_t row_begin;   // first query position the region needs
  std::int32_t rows;        // query positions [row_begin, row_begin + rows)
  std::int32_t row_offset;  // offset of the region's rows in the stats buffer
};

struct attention_params {
  std::int32_t n_regions = 0;
  std::int32_t total_rows = 0;
  std::int32_t q_heads = 0;
  std::int32_t group = 0;      // q_heads / kv heads
  std::int32_t window = 0;     // SnapKV's effective window of each region is region.rows
  std::int32_t kernel = 1;
  float scale = 1.f;
  bool from_queries = false;   // else the engine's attention rows (or column sums for H2O)
  bool column_sums = false;    // H2O from column sums: inputs.attention_column_sums, or
  bool local_sums = false;     // inputs.attention_local_column_sums when the regions are segment-local
  attention_region regions[max_runs];
};

// The batch as every kernel sees it, passed by value (__grid_constant__, about 11 KiB: kernel arguments above
// 4 KiB need CUDA 12.1+ on Volta or newer). When every sequence has the same length and lists, their parameters
// travel inside it (no host-to-device copy, no host synchronisation, and a captured CUDA graph replays with the
// values of the capture); otherwise each sequence's are in device tables that planner::initialize uploads. A
// kernel's grid covers the largest sequence; a block past its own sequence's length, groups, regions or rows
// returns.
struct batch_params {
  plan_params one{};                       // every sequence's, unless per_sequence
  attention_params one_attention{};
  const plan_params* seq = nullptr;        // per_sequence: device [batch]
  const attention_params* attn = nullptr;  // per_sequence, attention scorers: device [batch]
  const int* table_verdict = nullptr;      // paged keys: the device's verdict on their page tables
  std::int32_t batch = 0;
  std::int32_t heads = 0;
  std::int32_t pitch = 0;        // the longest sequence: the row pitch of scores, keep masks and accumulators
  std::int32_t groups = 0;       // the most groups of any sequence
  std::int32_t slices = 0;       // the most selection slices of any sequence (split select's histogram pitch)
  std::int32_t stats_rows = 0;   // the most attention query rows of any sequence
  std::int32_t regions = 0;      // the most attention regions of any sequence
  std::int32_t q_heads = 0;      // attention scorers: query heads
  bool per_sequence = false;

  [[nodiscard]] FAIRKV_HOST_DEVICE const plan_params& of(std::int64_t b) const noexcept {
    return per_sequence ? seq[b] : one;
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE const attention_params& attention_of(std::int64_t b) const noexcept {
    return per_sequence ? attn[b] : one_attention;
  }
  // Paged keys whose tables failed the device's check are not read (read_plan_status reports why).
  [[nodiscard]] FAIRKV_HOST_DEVICE bool keys_unreadable() const noexcept {
    return table_verdict != nullptr && *static_cast<const volatile int*>(table_verdict) != 0;
  }
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
