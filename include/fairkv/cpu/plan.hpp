// The CPU backend's planner (the oracle every other backend is compared with):
//   the host front end (detail/plan_front.hpp: validation, groups, forced tokens, checked budgets)
//   -> score (segment-local where the allocator asks) -> select under the library's total order
//   (detail/order.hpp) -> keep plan with ascending indices.
// It only reads the engine's memory; the plan and the scratch live in caller memory. Two-phase workspace in
// CUB's shape: call with workspace == nullptr to get workspace_bytes, then again with the buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <span>
#include <vector>

#include "fairkv/allocators/uniform.hpp"
#include "fairkv/budget.hpp"
#include "fairkv/cpu/detail/plan_workspace.hpp"
#include "fairkv/cpu/detail/select.hpp"
#include "fairkv/cpu/executor.hpp"
#include "fairkv/cpu/score.hpp"
#include "fairkv/cpu/score_paper.hpp"
#include "fairkv/detail/plan_front.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/request_batch.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv {

namespace cpu {
namespace detail {

// Scores of regions [runs] (local) or [0, L) into dst. With several tasks the heads are scored in parallel, each
// task with its own attention scratch, then what needs every head follows on this thread (the padding, and TOVA's
// sum over the heads' rows, or its whole row path): every float is computed by the same operations as serially.
// H2O without queries or rows reads column sums: the local regions those accumulated per region
// (layer_inputs::attention_local_column_sums), in the whole-sequence sums' place.
template <class S, class KeySource, class Q, executor E>
[[nodiscard]] result score_regions(const E& ex, const S& scorer, const layer_inputs<KeySource, Q>& all,
                                   const plan_workspace& w, std::int64_t ld, const sequence_groups& s, bool local,
                                   float* dst) {
  layer_inputs<KeySource, Q> in = all;
  if (local) in.attention_column_sums = all.attention_local_column_sums;
  const std::int64_t heads = in.keys.heads, n_regions = local ? s.n_runs : 1;
  const auto begin_of = [&](std::int64_t r) { return local ? w.runs[r].begin : std::int64_t{0}; };
  const auto end_of = [&](std::int64_t r) { return local ? w.runs[r].end : s.L; };
  const std::int64_t tasks = w.tasks < heads ? w.tasks : heads;
  if (tasks <= 1) {
    for (std::int64_t r = 0; r < n_regions; ++r)
      FAIRKV_TRY(score_region(scorer, in, s.b, s.L, begin_of(r), end_of(r), dst, ld, w.tmp));
    return {};
  }
  std::fill(w.failed, w.failed + tasks, std::int64_t{-1});
  FAIRKV_TRY(for_shares(ex, tasks, heads, [&](std::int64_t task, std::int64_t h) {
    if (w.failed[task] >= 0) return;
    float* tmp = w.tmp + task * scratch_floats<S>(ld);
    for (std::int64_t r = 0; r < n_regions; ++r)
      if (!score_region_head(scorer, in, s.b, s.L, begin_of(r), end_of(r), h, dst, ld, tmp)) {
        w.failed[task] = h;
        return;
      }
  }));
  // A failure is re-run here to get its message (a result does not cross tasks); the lowest failing head is the
  // one the serial loop meets first.
  for (std::int64_t t = 0; t < tasks; ++t)
    if (w.failed[t] >= 0) {
      for (std::int64_t r = 0; r < n_regions; ++r)
        FAIRKV_TRY(score_region_head(scorer, in, s.b, s.L, begin_of(r), end_of(r), w.failed[t], dst, ld, w.tmp));
      return result::error(status::internal_error, "scoring head %lld failed in a task but not when repeated",
                           static_cast<long long>(w.failed[t]));
    }
  for (std::int64_t r = 0; r < n_regions; ++r)
    FAIRKV_TRY(finish_region(scorer, in, s.b, s.L, begin_of(r), end_of(r), dst, ld, w.tmp));
  return {};
}

// Scores of sequence b into w.scores (and w.global_scores when the allocator also needs whole-sequence scores).
template <class S, class A, class KeySource, class Q, executor E>
[[nodiscard]] result score_sequence(const E& ex, const S& scorer, const layer_inputs<KeySource, Q>& in,
                                    const plan_workspace& w, std::int64_t ld, std::span<const segment> sorted,
                                    const sequence_groups& s) {
  if constexpr (fairkv::detail::is_paper_allocator_v<A>) {
    FAIRKV_TRY(score_paper(scorer, in, s.b, s.L, fairkv::detail::paper_spans_of(sorted), w.scores, ld, w.tmp));
  } else {
    FAIRKV_TRY(score_regions(ex, scorer, in, w, ld, s, scores_locally<S, A>, w.scores));
  }
  if constexpr (separate_global_scores<S, A>) FAIRKV_TRY(score_regions(ex, scorer, in, w, ld, s, false, w.global_scores));
  return {};
}

// Plans sequence b: front end (groups, forced tokens), scores, own allocation, checked budgets, selection.
template <class S, class Sel, class A, class KeySource, class Q, executor E>
[[nodiscard]] result plan_sequence(const E& ex, const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                   std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                   const keep_target& target, std::int64_t b, std::int64_t ld, const plan_workspace& w,
                                   keep_plan_view out) {
  const std::int64_t heads = in.keys.heads, L = in.keys.tokens_of(b);
  const std::span<const segment> sorted(w.sorted, segments.size());
  segment widened[2];
  const fairkv::detail::grouping g =
      fairkv::detail::build_runs(fairkv::detail::grouping_segments<S, A>(sorted, L, widened), L, w.runs, w.sizes);
  sequence_groups s{b, L, target.n_keep(L), 0, g.groups, g.runs};
  index_runs_by_group(w.runs, s.n_runs, s.groups, w.run_order, w.group_first);
  for (std::int64_t r = 0; r < s.n_runs; ++r)
    std::fill(w.group_of + w.runs[r].begin, w.group_of + w.runs[r].end, static_cast<std::int32_t>(w.runs[r].group));
  std::fill(w.forced, w.forced + L, std::uint8_t{0});
  std::fill(w.forced_per_group, w.forced_per_group + s.groups, 0);
  const auto force = [&](std::int64_t t) {  // false: already forced
    if (w.forced[t]) return false;
    w.forced[t] = 1;
    ++w.forced_per_group[w.group_of[t]];
    return true;
  };
  FAIRKV_TRY(fairkv::detail::force_tokens(whitelist, fairkv::detail::protection_of(pol.allocator), segments, L,
                                          s.n_keep, b, target, s.forced_total, force));
  FAIRKV_TRY((score_sequence<S, A>(ex, pol.scorer, in, w, ld, sorted, s)));
  if constexpr (Sel::kind == selection_kind::union_heads) head_mean(w.scores, ld, heads, L, w.mean_scores);
  if constexpr (A::needs_own_allocation) own_allocation<Sel>(w, ld, heads, s);
  const auto G = static_cast<std::size_t>(s.groups);
  const allocation_context ctx{s.n_keep,
                               heads,
                               {w.sizes, G},
                               {w.forced_per_group, G},
                               {w.own, A::needs_own_allocation ? static_cast<std::size_t>(heads) * G : 0u},
                               {w.scratch, 2 * G},
                               fairkv::detail::group_origins<S, A>({w.origin, segments.size()})};
  FAIRKV_TRY(fairkv::detail::allocate_budgets(pol.allocator, ctx, {w.budgets, static_cast<std::size_t>(heads) * G}));
  FAIRKV_TRY(select_sequence(ex, pol.selector, w, ld, heads, s, out));
  out.lengths[b] = static_cast<std::int32_t>(L);
  return {};
}

}  // namespace detail

// Whole-sequence scores of every (batch, head) row, as the planner sees them without segments:
// scores[(b * heads + h) * ld + t] for t < tokens_of(b), ld >= the longest sequence. Exposed for engines that
// want to inspect or log them, and for checking the scorers against kvpress.
template <class S, class KeySource, class Q>
[[nodiscard]] result score(const S& scorer, const layer_inputs<KeySource, Q>& in, float* scores,
                           std::int64_t ld) noexcept {
  static_assert(Scorer<S>, "fairkv::cpu::score: S must satisfy fairkv::Scorer");
  std::int64_t max_tokens = 0, min_tokens = 0;
  FAIRKV_TRY(fairkv::detail::validate_lengths<S>(in, min_tokens, max_tokens));
  if (scores == nullptr) return result::error(status::null_pointer, "scores is null");
  if (ld < max_tokens)
    return result::error(status::invalid_shape, "ld = %lld is smaller than the longest sequence (%lld)",
                         static_cast<long long>(ld), static_cast<long long>(max_tokens));
  FAIRKV_TRY(fairkv::detail::validate_scorer(scorer));
  FAIRKV_TRY(fairkv::detail::validate_external_inputs<S>(in, max_tokens));
  FAIRKV_TRY((fairkv::detail::validate_attention_inputs<S, allocators::uniform>(in, min_tokens, max_tokens)));
  try {
    std::vector<float> tmp(static_cast<std::size_t>(detail::scratch_floats<S>(max_tokens)));
    for (std::int64_t b = 0; b < in.keys.batch; ++b)
      if (in.keys.tokens_of(b) > 0)  // an empty sequence has no scores
        FAIRKV_TRY(detail::score_region(scorer, in, b, in.keys.tokens_of(b), 0, in.keys.tokens_of(b),
                                        scores + b * in.keys.heads * ld, ld, tmp.data()));
  } catch (const std::bad_alloc&) {
    return result::error(status::out_of_memory, "out of host memory for the scoring scratch");
  }
  return {};
}

namespace detail {

// One sequence's segments, whitelist and target.
struct sequence_lists {
  std::span<const segment> segments;
  std::span<const std::int32_t> whitelist;
  const keep_target* target;
};

// The planner after validation: lists_of(b) gives sequence b's lists, at most n_segments segments each.
template <executor E, class S, class Sel, class A, class KeySource, class Q, class ListsOf>
[[nodiscard]] result plan_validated(const E& ex, void* workspace, std::size_t& workspace_bytes,
                                    const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                    std::int64_t max_tokens, std::int64_t n_segments, const ListsOf& lists_of,
                                    keep_plan_view out) noexcept {
  const std::int64_t tasks = task_count(ex, in.keys.heads);
  plan_workspace w;
  const std::size_t needed = layout<S, Sel, A>(nullptr, w, in.keys.heads, max_tokens, n_segments, tasks);
  if (workspace == nullptr) {
    workspace_bytes = needed;
    return {};
  }
  FAIRKV_TRY(fairkv::detail::check_workspace("workspace_bytes", workspace_bytes, needed));
  FAIRKV_TRY(fairkv::detail::check_output_plan(out, in.keys.batch, in.keys.heads, max_tokens));
  if (out.state != nullptr) out.state->applied = false;  // a new plan in a reused keep_plan is not spent
  layout<S, Sel, A>(carver::align_base(workspace), w, in.keys.heads, max_tokens, n_segments, tasks);
  std::span<const segment> sorted_for{};  // the list w.sorted holds: sorted once when every sequence shares it
  bool sorted_any = false;
  for (std::int64_t b = 0; b < in.keys.batch; ++b) {
    if (in.keys.tokens_of(b) == 0) {  // an idle slot: nothing to keep, and the batch's lists do not apply
      std::fill(out.counts + b * in.keys.heads, out.counts + (b + 1) * in.keys.heads, 0);
      out.lengths[b] = 0;
      continue;
    }
    const sequence_lists l = lists_of(b);
    if (!sorted_any || l.segments.data() != sorted_for.data() || l.segments.size() != sorted_for.size()) {
      fairkv::detail::sort_segments(l.segments, w.sorted, w.origin);
      sorted_for = l.segments;
      sorted_any = true;
    }
    FAIRKV_TRY(plan_sequence(ex, pol, in, l.segments, l.whitelist, *l.target, b, max_tokens, w, out));
  }
  return {};
}

}  // namespace detail

// Plans one layer. `segments` and `whitelist` apply to every sequence of the batch; `target` is a ratio or a
// token budget per KV head (fairkv/budget.hpp; a bare double converts to a ratio). Nothing is written but the plan
// and the workspace; on error the plan's contents are unspecified and the engine's memory is untouched.
// `ex` (cpu/executor.hpp) runs the KV heads of each sequence's scoring and per-head selection as parallel tasks;
// the plan is bit-identical to the serial one. The workspace holds per-task scratch, so the size query must be
// made with an executor of the same concurrency as the run.
template <executor E, class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(const E& ex, void* workspace, std::size_t& workspace_bytes, const policy<S, Sel, A>& pol,
                          const layer_inputs<KeySource, Q>& in, std::span<const segment> segments,
                          std::span<const std::int32_t> whitelist, const keep_target& target,
                          keep_plan_view out) noexcept {
  // Everything is checked before any scratch is touched.
  std::int64_t min_tokens = 0, max_tokens = 0;
  FAIRKV_TRY(fairkv::detail::validate_plan_request(pol, in, segments, whitelist, target, min_tokens, max_tokens));
  const auto all = [&](std::int64_t) { return detail::sequence_lists{segments, whitelist, &target}; };
  return detail::plan_validated(ex, workspace, workspace_bytes, pol, in, max_tokens,
                                static_cast<std::int64_t>(segments.size()), all, out);
}

// Plans one layer of a batch of requests, each sequence with its own segments, whitelist and target
// (fairkv/request_batch.hpp); otherwise as above. The plan of sequence b is the one a single-list call gives for
// that sequence alone. Errors in one sequence's lists name the sequence.
template <executor E, class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(const E& ex, void* workspace, std::size_t& workspace_bytes, const policy<S, Sel, A>& pol,
                          const layer_inputs<KeySource, Q>& in, const request_batch& requests,
                          keep_plan_view out) noexcept {
  std::int64_t min_tokens = 0, max_tokens = 0;
  if (requests.targets.empty())
    return result::error(status::invalid_argument, "requests.targets is empty: give one, or one per sequence");
  FAIRKV_TRY(fairkv::detail::validate_lengths<S>(in, min_tokens, max_tokens));
  FAIRKV_TRY(validate(requests, in.keys.batch));
  FAIRKV_TRY((fairkv::detail::validate_score_source<S, A>()));
  std::int64_t n_segments = 0;
  for (std::int64_t b = 0; b < in.keys.batch; ++b) {
    const result r = fairkv::detail::validate_request_lists<A>(requests.segments_of(b), requests.whitelist_of(b),
                                                               requests.target_of(b), in.keys.tokens_of(b));
    if (!r.ok()) return result::error(r.code(), "sequence %lld: %s", static_cast<long long>(b), r.message());
    n_segments = std::max(n_segments, static_cast<std::int64_t>(requests.segments_of(b).size()));
  }
  FAIRKV_TRY(fairkv::detail::validate_policy_inputs(pol, in, min_tokens, max_tokens));
  const auto own = [&](std::int64_t b) {
    return detail::sequence_lists{requests.segments_of(b), requests.whitelist_of(b), &requests.target_of(b)};
  };
  return detail::plan_validated(ex, workspace, workspace_bytes, pol, in, max_tokens, n_segments, own, out);
}

template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(void* workspace, std::size_t& workspace_bytes, const policy<S, Sel, A>& pol,
                          const layer_inputs<KeySource, Q>& in, std::span<const segment> segments,
                          std::span<const std::int32_t> whitelist, const keep_target& target,
                          keep_plan_view out) noexcept {
  return plan(serial_executor{}, workspace, workspace_bytes, pol, in, segments, whitelist, target, out);
}

namespace detail {
// A two-phase plan call, run(workspace, workspace_bytes, view), sized, given std::vector scratch, and run into `out`.
template <class KeySource, class Q, class Run>
[[nodiscard]] result plan_owned(const layer_inputs<KeySource, Q>& in, keep_plan& out, const Run& run) noexcept {
  std::size_t bytes = 0;
  FAIRKV_TRY(run(nullptr, bytes, keep_plan_view{}));
  std::int64_t max_tokens = 0;
  for (std::int64_t b = 0; b < in.keys.batch; ++b) max_tokens = std::max(max_tokens, in.keys.tokens_of(b));
  try {
    std::vector<std::byte> scratch(bytes);
    out.resize(in.keys.batch, in.keys.heads, max_tokens);
    return run(scratch.data(), bytes, out.view());
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error for a size beyond max_size()
    return result::error(status::out_of_memory, "out of host memory for the plan (%zu bytes of scratch, a plan of "
                         "%lld x %lld x %lld indices)", bytes, static_cast<long long>(in.keys.batch),
                         static_cast<long long>(in.keys.heads), static_cast<long long>(max_tokens));
  }
}
}  // namespace detail

// Convenience: allocates the plan and the scratch with std::vector (use the overload above to control memory).
// A failed allocation is status::out_of_memory.
template <executor E, class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(const E& ex, const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                          std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                          const keep_target& target, keep_plan& out) noexcept {
  return detail::plan_owned(in, out, [&](void* ws, std::size_t& bytes, keep_plan_view view) {
    return plan(ex, ws, bytes, pol, in, segments, whitelist, target, view);
  });
}

template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                          std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                          const keep_target& target, keep_plan& out) noexcept {
  return plan(serial_executor{}, pol, in, segments, whitelist, target, out);
}

// Convenience for a batch of requests: allocates the plan and the scratch with std::vector.
template <executor E, class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(const E& ex, const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                          const request_batch& requests, keep_plan& out) noexcept {
  return detail::plan_owned(in, out, [&](void* ws, std::size_t& bytes, keep_plan_view view) {
    return plan(ex, ws, bytes, pol, in, requests, view);
  });
}
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                          const request_batch& requests, keep_plan& out) noexcept {
  return plan(serial_executor{}, pol, in, requests, out);
}

}  // namespace cpu
}  // namespace fairkv
