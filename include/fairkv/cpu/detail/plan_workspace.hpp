// The CPU planner's scratch, carved from the caller's workspace (detail/workspace_carver.hpp: one layout for the
// size query and the run, 64-byte aligned buffers). Shapes are for one sequence at a time; max_tokens is the
// longest sequence of the batch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fairkv/cpu/detail/attention_gemm.hpp"
#include "fairkv/detail/workspace_carver.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/segments.hpp"

namespace fairkv::cpu::detail {

struct run {
  std::int64_t begin, end, group;  // [begin, end) belongs to `group`
};

// The runs of one group, in position order. The remainder group can own a run between every two segments, so
// selection reaches a group's runs through this index rather than by filtering all runs (S groups x S runs).
struct group_runs {
  const run* runs;
  const std::int64_t* ids;
  std::int64_t n;
  template <class F>
  void for_each_token(F&& f) const {
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t t = runs[ids[i]].begin; t < runs[ids[i]].end; ++t) f(t);
  }
};

// Fills run_order/group_first (plan_workspace) for runs[0, n_runs) over `groups` groups: a counting sort, stable,
// with group_first as its own cursor.
inline void index_runs_by_group(const run* runs, std::int64_t n_runs, std::int64_t groups, std::int64_t* run_order,
                                std::int64_t* group_first) noexcept {
  std::fill(group_first, group_first + groups + 1, std::int64_t{0});
  for (std::int64_t r = 0; r < n_runs; ++r) ++group_first[runs[r].group + 1];
  for (std::int64_t g = 0; g < groups; ++g) group_first[g + 1] += group_first[g];
  for (std::int64_t r = 0; r < n_runs; ++r) run_order[group_first[runs[r].group]++] = r;  // first[g] -> end of g
  for (std::int64_t g = groups; g > 0; --g) group_first[g] = group_first[g - 1];
  group_first[0] = 0;
}

using carver = fairkv::detail::workspace_carver<64>;

struct plan_workspace {
  float* scores = nullptr;         // [heads, max_tokens] the scores selection uses
  float* global_scores = nullptr;  // [heads, max_tokens] whole-sequence scores (own allocation of a local scorer)
  float* tmp = nullptr;            // [tasks, scratch_floats<S>(max_tokens)] scoring scratch, a slice per task
  float* mean_scores = nullptr;    // [max_tokens] head-mean scores (union)
  std::uint64_t* keys = nullptr;   // [select_slots] selection keys (per_head: one max_tokens slice per task)
  std::uint8_t* keep = nullptr;    // [select_slots] keep mask, per head for head_adaptive, per task for per_head
  std::uint8_t* forced = nullptr;  // [max_tokens] forced-token mask
  std::int32_t* group_of = nullptr;  // [max_tokens]
  run* runs = nullptr;             // [2 * segments + 1] maximal runs of one group
  std::int64_t* run_order = nullptr;    // [2 * segments + 1] run indices by group, position order within a group
  std::int64_t* group_first = nullptr;  // [segments + 2] group g's runs: run_order[group_first[g], group_first[g + 1])
  segment* sorted = nullptr;       // [segments] the caller's segments in position order
  std::int32_t* origin = nullptr;  // [segments] the caller's index of each sorted segment
  std::int64_t* sizes = nullptr;   // [groups]
  std::int64_t* forced_per_group = nullptr;  // [groups]
  std::int64_t* budgets = nullptr;   // [heads, groups]
  std::int64_t* own = nullptr;       // [heads, groups]
  std::int64_t* scratch = nullptr;   // [2 * groups] the allocator's (allocation_context::scratch)
  std::int64_t* failed = nullptr;    // [tasks] first head whose scoring failed in each task, -1 if none
  std::int64_t tasks = 1;            // parallel tasks the scratch is sized for
};

// Whether the policy scores segment-locally, and then also needs whole-sequence scores for its own allocation.
template <class S, class A>
inline constexpr bool scores_locally = A::segment_local && is_attention_source(S::source);
template <class S, class A>
inline constexpr bool separate_global_scores = scores_locally<S, A> && A::needs_own_allocation;

// tasks: how many tasks an executor may run at once over the heads (1 for the serial planner: one task's scratch).
template <class S, class Sel, class A>
std::size_t layout(void* base, plan_workspace& w, std::int64_t heads, std::int64_t max_tokens,
                   std::int64_t n_segments, std::int64_t tasks = 1) noexcept {
  carver c(base);
  const auto L = static_cast<std::size_t>(max_tokens);
  const auto H = static_cast<std::size_t>(heads);
  const auto N = static_cast<std::size_t>(n_segments);
  const auto P = static_cast<std::size_t>(tasks < 1 ? 1 : tasks);
  w.tasks = static_cast<std::int64_t>(P);
  const std::size_t slots = Sel::kind == selection_kind::head_adaptive ? H * L
                            : Sel::kind == selection_kind::per_head    ? P * L
                                                                        : L;
  c.carve(w.scores, H * L);
  c.carve(w.global_scores, separate_global_scores<S, A> ? H * L : 0);
  c.carve(w.tmp, P * static_cast<std::size_t>(scratch_floats<S>(max_tokens)));
  c.carve(w.mean_scores, L);
  c.carve(w.keys, slots);
  c.carve(w.keep, slots);
  c.carve(w.forced, L);
  c.carve(w.group_of, L);
  c.carve(w.runs, 2 * N + 1);
  c.carve(w.run_order, 2 * N + 1);
  c.carve(w.group_first, N + 2);
  c.carve(w.sorted, N);
  c.carve(w.origin, N);
  c.carve(w.sizes, N + 1);
  c.carve(w.forced_per_group, N + 1);
  c.carve(w.budgets, H * (N + 1));
  c.carve(w.own, H * (N + 1));
  c.carve(w.scratch, 2 * (N + 1));
  if (P > 1) c.carve(w.failed, P);
  else w.failed = nullptr;
  if (!separate_global_scores<S, A>) w.global_scores = w.scores;
  return c.bytes();
}

}  // namespace fairkv::cpu::detail
