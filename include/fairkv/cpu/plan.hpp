// The CPU backend's planner (the oracle every other backend is compared with):
//   validate -> score (segment-local where the allocator asks) -> allocate budgets per (head, segment)
//   -> select under the library's total order (detail/order.hpp) -> keep plan with ascending indices.
// It only reads the engine's memory; the plan and the scratch live in caller memory. Two-phase workspace in
// CUB's shape: call with workspace == nullptr to get workspace_bytes, then again with the buffer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <span>
#include <vector>

#include "fairkv/allocators/uniform.hpp"
#include "fairkv/cpu/score.hpp"
#include "fairkv/cpu/score_paper.hpp"
#include "fairkv/detail/order.hpp"
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/detail/validate.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv {

namespace cpu {
namespace detail {

struct run {
  std::int64_t begin, end, group;
};

// One layout for the size query and the run (CUB convention), so the two can never disagree.
struct plan_workspace {
  float* scores = nullptr;         // [heads, max_tokens] the scores selection uses
  float* global_scores = nullptr;  // [heads, max_tokens] whole-sequence scores (debias of an attention scorer)
  float* tmp = nullptr;            // [3 * max_tokens] attention scratch
  float* mean_scores = nullptr;    // [max_tokens] head-mean scores (union)
  std::uint64_t* keys = nullptr;   // [select_slots] selection keys
  std::uint8_t* keep = nullptr;    // [select_slots] keep mask, per head for head_adaptive
  std::uint8_t* forced = nullptr;  // [max_tokens] whitelist mask
  std::int32_t* group_of = nullptr;  // [max_tokens]
  run* runs = nullptr;             // [2 * segments + 1] maximal runs of one group
  std::int64_t* sizes = nullptr;   // [groups]
  std::int64_t* forced_n = nullptr;  // [groups]
  std::int64_t* budgets = nullptr;   // [heads, groups]
  std::int64_t* own = nullptr;       // [heads, groups]
  std::int64_t* scratch = nullptr;   // [groups]
  std::int64_t* order = nullptr;     // [segments] segment indices sorted by begin
};

template <class T>
inline void carve(std::byte*& cursor, std::size_t& bytes, T*& out, std::size_t count, bool assign) {
  constexpr std::size_t align = 64;
  bytes = (bytes + align - 1) / align * align;
  if (assign) out = reinterpret_cast<T*>(cursor + bytes);
  bytes += count * sizeof(T);
}

inline std::size_t layout(std::byte* base, plan_workspace& w, std::int64_t heads, std::int64_t max_tokens,
                          std::int64_t n_segments, bool global_scores, bool per_head_keep) {
  const bool assign = base != nullptr;
  std::byte* cursor = base;
  std::size_t bytes = 0;
  const auto L = static_cast<std::size_t>(max_tokens);
  const auto H = static_cast<std::size_t>(heads);
  const auto G = static_cast<std::size_t>(n_segments + 1);
  const std::size_t slots = per_head_keep ? H * L : L;
  carve(cursor, bytes, w.scores, H * L, assign);
  carve(cursor, bytes, w.global_scores, global_scores ? H * L : 0, assign);
  carve(cursor, bytes, w.tmp, 3 * L, assign);
  carve(cursor, bytes, w.mean_scores, L, assign);
  carve(cursor, bytes, w.keys, slots, assign);
  carve(cursor, bytes, w.keep, slots, assign);
  carve(cursor, bytes, w.forced, L, assign);
  carve(cursor, bytes, w.group_of, L, assign);
  carve(cursor, bytes, w.runs, 2 * static_cast<std::size_t>(n_segments) + 1, assign);
  carve(cursor, bytes, w.sizes, G, assign);
  carve(cursor, bytes, w.forced_n, G, assign);
  carve(cursor, bytes, w.budgets, H * G, assign);
  carve(cursor, bytes, w.own, H * G, assign);
  carve(cursor, bytes, w.scratch, G, assign);
  carve(cursor, bytes, w.order, static_cast<std::size_t>(n_segments) + 1, assign);
  if (!global_scores) w.global_scores = w.scores;
  return bytes + 64;  // slack for aligning the caller's base pointer
}

// out[t] = mean over heads of scores[h * ld + t]; a NaN in any head propagates, so the token goes first.
inline void head_mean(const float* scores, std::int64_t ld, std::int64_t heads, std::int64_t tokens, float* out) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    float s = 0.f;
    for (std::int64_t h = 0; h < heads; ++h) s += scores[h * ld + t];
    out[t] = s / static_cast<float>(heads);
  }
}

// Puts the k best of keys[0, n) first (unordered). The keys are unique, so the set is exact.
inline void partition_top(std::uint64_t* keys, std::int64_t n, std::int64_t k) {
  if (k <= 0 || k >= n) return;
  std::nth_element(keys, keys + (k - 1), keys + n, std::greater<>());
}

// Keeps the `k` best non-forced tokens of group g (runs of g) on one score row, marking keep[t] = 1.
inline void select_in_group(const float* score_row, const run* runs, std::int64_t n_runs, std::int64_t g,
                            const std::uint8_t* forced, std::int64_t k, std::uint64_t* keys, std::uint8_t* keep) {
  if (k <= 0) return;
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < n_runs; ++r) {
    if (runs[r].group != g) continue;
    for (std::int64_t t = runs[r].begin; t < runs[r].end; ++t)
      if (!forced[t]) keys[n++] = fairkv::detail::selection_key(score_row[t], static_cast<std::uint32_t>(t));
  }
  partition_top(keys, n, k);
  for (std::int64_t i = 0; i < std::min(k, n); ++i) keep[fairkv::detail::key_index(keys[i])] = 1;
}

}  // namespace detail

// Whole-sequence scores of every (batch, head) row, as the planner sees them without segments:
// scores[(b * heads + h) * ld + t] for t < tokens_of(b), ld >= the longest sequence. Exposed for engines that
// want to inspect or log them, and for checking the scorers against kvpress.
template <class S, class KeySource, class Q>
[[nodiscard]] result score(const S& scorer, const layer_inputs<KeySource, Q>& in, float* scores,
                           std::int64_t ld) noexcept {
  static_assert(Scorer<S>, "fairkv::cpu::score: S must satisfy fairkv::Scorer");
  FAIRKV_TRY(validate(in.keys, "inputs.keys"));
  if (scores == nullptr) return result::error(status::null_pointer, "scores is null");
  std::int64_t max_tokens = 0, min_tokens = INT64_MAX;
  for (std::int64_t b = 0; b < in.keys.batch; ++b) {
    const std::int64_t L = in.keys.tokens_of(b);
    if (L == 0) return result::error(status::empty_cache, "sequence %lld has no tokens", static_cast<long long>(b));
    max_tokens = std::max(max_tokens, L);
    min_tokens = std::min(min_tokens, L);
  }
  if (ld < max_tokens)
    return result::error(status::invalid_shape, "ld = %lld is smaller than the longest sequence (%lld)",
                         static_cast<long long>(ld), static_cast<long long>(max_tokens));
  FAIRKV_TRY(fairkv::detail::validate_scorer(scorer));
  FAIRKV_TRY((fairkv::detail::validate_attention_inputs<S, allocators::uniform>(in, min_tokens, max_tokens)));
  try {
    std::vector<float> tmp(static_cast<std::size_t>(3 * max_tokens));
    for (std::int64_t b = 0; b < in.keys.batch; ++b)
      FAIRKV_TRY(detail::score_region(scorer, in, b, in.keys.tokens_of(b), 0, in.keys.tokens_of(b),
                                      scores + b * in.keys.heads * ld, ld, tmp.data()));
  } catch (const std::bad_alloc&) {
    return result::error(status::insufficient_workspace, "out of host memory for the scoring scratch");
  }
  return {};
}

// Plans one layer. `segments` and `whitelist` apply to every sequence of the batch. Nothing is written but the
// plan and the workspace; on error the plan's contents are unspecified and the engine's memory is untouched.
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(void* workspace, std::size_t& workspace_bytes, const policy<S, Sel, A>& pol,
                          const layer_inputs<KeySource, Q>& in, std::span<const segment> segments,
                          std::span<const std::int32_t> whitelist, double ratio, keep_plan_view out) noexcept {
  using namespace fairkv::detail;
  // ---- validation: everything is checked before any scratch is touched ----
  std::int64_t min_tokens = 0, max_tokens = 0;
  FAIRKV_TRY(fairkv::detail::validate_plan_request(pol, in, segments, whitelist, ratio, min_tokens, max_tokens));
  const std::int64_t batch = in.keys.batch, heads = in.keys.heads;

  constexpr bool local = A::segment_local && is_attention_source(S::source);
  constexpr bool separate_global = local && A::needs_own_allocation;
  constexpr bool per_head_keep = Sel::kind == selection_kind::head_adaptive;
  const auto n_segments = static_cast<std::int64_t>(segments.size());
  detail::plan_workspace w;
  const std::size_t needed =
      detail::layout(nullptr, w, heads, max_tokens, n_segments, separate_global, per_head_keep);
  if (workspace == nullptr) {
    workspace_bytes = needed;
    return {};
  }
  if (workspace_bytes < needed)
    return result::error(status::insufficient_workspace, "workspace_bytes = %zu but the plan needs %zu",
                         workspace_bytes, needed);
  if (out.indices == nullptr || out.counts == nullptr || out.lengths == nullptr)
    return result::error(status::null_pointer, "the output plan's indices, counts and lengths must be non-null");
  if (out.batch != batch || out.heads != heads || out.capacity < max_tokens)
    return result::error(status::invalid_shape,
                         "the output plan is [batch %lld, heads %lld, capacity %lld] but the keys need "
                         "[%lld, %lld, >= %lld]",
                         static_cast<long long>(out.batch), static_cast<long long>(out.heads),
                         static_cast<long long>(out.capacity), static_cast<long long>(batch),
                         static_cast<long long>(heads), static_cast<long long>(max_tokens));
  auto* base = static_cast<std::byte*>(workspace);
  base += (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64;
  detail::layout(base, w, heads, max_tokens, n_segments, separate_global, per_head_keep);

  // Segment order by position; the remainder (tokens in no segment) is the last group.
  for (std::int64_t i = 0; i < n_segments; ++i) w.order[i] = i;
  std::sort(w.order, w.order + n_segments,
            [&](std::int64_t a, std::int64_t b) { return segments[a].begin < segments[b].begin; });

  constexpr bool paper = is_paper_allocator_v<A>;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t L = in.keys.tokens_of(b);
    const std::int64_t n_keep = keep_budget(L, ratio);
    const std::int64_t ld = max_tokens;

    // ---- groups (the segments in position order, then the remainder) and their maximal runs ----
    // The paper's mode widens its two spans to [0, split) and [split, L); its StreamingLLM keeps one group.
    detail::paper_spans spans;
    segment widened[2];
    std::span<const segment> group_segments = segments;
    std::int64_t n_groups_seg = n_segments;
    if constexpr (paper) {
      const segment& first = segments[w.order[0]];
      spans = {first.begin, first.end, segments[w.order[1]].end};
      widened[0] = {0, first.end};
      widened[1] = {first.end, static_cast<std::int32_t>(L)};
      group_segments = is_streaming_llm_v<S> ? std::span<const segment>{} : std::span<const segment>(widened);
      n_groups_seg = static_cast<std::int64_t>(group_segments.size());
    }
    auto seg_at = [&](std::int64_t i) -> const segment& { return paper ? group_segments[i] : segments[w.order[i]]; };
    std::int64_t covered = 0;
    for (std::int64_t i = 0; i < n_groups_seg; ++i) covered += seg_at(i).size();
    const std::int64_t groups = n_groups_seg + (covered < L ? 1 : 0);
    const std::int64_t remainder = n_groups_seg;
    std::fill(w.group_of, w.group_of + L, static_cast<std::int32_t>(remainder));
    for (std::int64_t i = 0; i < n_groups_seg; ++i) {
      const segment& s = seg_at(i);
      std::fill(w.group_of + s.begin, w.group_of + s.end, static_cast<std::int32_t>(i));
    }
    std::int64_t n_runs = 0;
    for (std::int64_t t = 0; t < L; ++t) {
      if (t == 0 || w.group_of[t] != w.group_of[t - 1]) w.runs[n_runs++] = {t, t, w.group_of[t]};
      w.runs[n_runs - 1].end = t + 1;
    }
    std::fill(w.sizes, w.sizes + groups, 0);
    std::fill(w.forced_n, w.forced_n + groups, 0);
    for (std::int64_t r = 0; r < n_runs; ++r) w.sizes[w.runs[r].group] += w.runs[r].end - w.runs[r].begin;

    // ---- whitelist ----
    std::fill(w.forced, w.forced + L, std::uint8_t{0});
    std::int64_t forced_total = 0;
    for (const std::int32_t t : whitelist) {
      if (w.forced[t]) continue;
      w.forced[t] = 1;
      ++w.forced_n[w.group_of[t]];
      ++forced_total;
    }
    if (forced_total > n_keep)
      return result::error(status::budget_exceeded,
                           "the whitelist holds %lld distinct positions but sequence %lld keeps only %lld of its %lld "
                           "tokens at ratio %g",
                           static_cast<long long>(forced_total), static_cast<long long>(b),
                           static_cast<long long>(n_keep), static_cast<long long>(L), ratio);
    FAIRKV_TRY(add_protected(protection_of(pol.allocator), segments, L, n_keep, b, ratio, forced_total,
                             [&](std::int64_t t) {
                               if (w.forced[t]) return false;
                               w.forced[t] = 1;
                               ++w.forced_n[w.group_of[t]];
                               return true;
                             }));

    // ---- scores ----
    if constexpr (paper) {
      FAIRKV_TRY(detail::score_paper(pol.scorer, in, b, L, spans, w.scores, ld, w.tmp));
    } else if constexpr (local) {
      for (std::int64_t r = 0; r < n_runs; ++r)
        FAIRKV_TRY(detail::score_region(pol.scorer, in, b, L, w.runs[r].begin, w.runs[r].end, w.scores, ld, w.tmp));
    } else {
      FAIRKV_TRY(detail::score_region(pol.scorer, in, b, L, 0, L, w.scores, ld, w.tmp));
    }
    if constexpr (separate_global) FAIRKV_TRY(detail::score_region(pol.scorer, in, b, L, 0, L, w.global_scores, ld, w.tmp));
    if constexpr (Sel::kind == selection_kind::union_heads) detail::head_mean(w.scores, ld, heads, L, w.mean_scores);

    // ---- the plain policy's own allocation, for allocators that interpolate from it ----
    if constexpr (A::needs_own_allocation) {
      // union_heads selects one set on the head-mean score, so every head has the same own counts.
      const float* union_row = nullptr;
      if constexpr (Sel::kind == selection_kind::union_heads) {
        if constexpr (separate_global) {
          detail::head_mean(w.global_scores, ld, heads, L, w.tmp);
          union_row = w.tmp;
        } else {
          union_row = w.mean_scores;
        }
      }
      const detail::run whole{0, L, 0};
      for (std::int64_t h = 0; h < heads; ++h) {
        if (Sel::kind == selection_kind::union_heads && h > 0) {
          std::copy(w.own, w.own + groups, w.own + h * groups);
          continue;
        }
        const float* row = Sel::kind == selection_kind::union_heads ? union_row : w.global_scores + h * ld;
        std::copy(w.forced, w.forced + L, w.keep);
        detail::select_in_group(row, &whole, 1, 0, w.forced, n_keep - forced_total, w.keys, w.keep);
        std::fill(w.own + h * groups, w.own + (h + 1) * groups, 0);
        for (std::int64_t t = 0; t < L; ++t) w.own[h * groups + w.group_of[t]] += w.keep[t];
      }
    }

    // ---- budgets per (head, group), checked so a user allocator cannot produce an inconsistent plan ----
    const allocation_context ctx{n_keep,
                                 heads,
                                 {w.sizes, static_cast<std::size_t>(groups)},
                                 {w.forced_n, static_cast<std::size_t>(groups)},
                                 {w.own, A::needs_own_allocation ? static_cast<std::size_t>(heads * groups) : 0u},
                                 {w.scratch, static_cast<std::size_t>(groups)}};
    // An allocator without segments sees exactly one group: the segment list was checked to be empty.
    FAIRKV_TRY(pol.allocator.allocate(ctx, {w.budgets, static_cast<std::size_t>(heads * groups)}));
    const std::int64_t budget_groups = groups;
    for (std::int64_t h = 0; h < heads; ++h) {
      std::int64_t sum = 0;
      for (std::int64_t g = 0; g < budget_groups; ++g) {
        const std::int64_t v = w.budgets[h * budget_groups + g];
        if (v < w.forced_n[g] || v > w.sizes[g])
          return result::error(status::internal_error,
                               "allocator '%s' gave head %lld, group %lld a budget of %lld outside [%lld, %lld]", A::name,
                               static_cast<long long>(h), static_cast<long long>(g), static_cast<long long>(v),
                               static_cast<long long>(w.forced_n[g]), static_cast<long long>(w.sizes[g]));
        sum += v;
      }
      if (sum != n_keep)
        return result::error(status::internal_error, "allocator '%s' gave head %lld %lld tokens instead of %lld",
                             A::name, static_cast<long long>(h), static_cast<long long>(sum),
                             static_cast<long long>(n_keep));
    }

    // ---- selection ----
    auto emit = [&](std::int64_t h, const std::uint8_t* keep) {
      std::int32_t* row = out.row(b, h);
      std::int32_t n = 0;
      for (std::int64_t t = 0; t < L; ++t)
        if (keep[t]) row[n++] = static_cast<std::int32_t>(t);
      out.counts[b * heads + h] = n;
    };
    if constexpr (Sel::kind == selection_kind::per_head) {
      for (std::int64_t h = 0; h < heads; ++h) {
        std::copy(w.forced, w.forced + L, w.keep);
        for (std::int64_t g = 0; g < budget_groups; ++g)
          detail::select_in_group(w.scores + h * ld, w.runs, n_runs, g, w.forced,
                                  w.budgets[h * budget_groups + g] - w.forced_n[g], w.keys, w.keep);
        emit(h, w.keep);
      }
    } else if constexpr (Sel::kind == selection_kind::union_heads) {
      std::copy(w.forced, w.forced + L, w.keep);
      for (std::int64_t g = 0; g < budget_groups; ++g)
        detail::select_in_group(w.mean_scores, w.runs, n_runs, g, w.forced, w.budgets[g] - w.forced_n[g], w.keys,
                                w.keep);
      for (std::int64_t h = 0; h < heads; ++h) emit(h, w.keep);
    } else if constexpr (Sel::kind == selection_kind::head_adaptive) {
      std::uint8_t* keep = w.keep;  // [heads, L]
      for (std::int64_t h = 0; h < heads; ++h) std::copy(w.forced, w.forced + L, keep + h * L);
      for (std::int64_t g = 0; g < budget_groups; ++g) {
        // Safeguard: each head first keeps floor(alpha * budget) of its best tokens, whitelisted ones included.
        std::int64_t pool = 0;
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t budget = w.budgets[h * budget_groups + g];
          const std::int64_t safe = static_cast<std::int64_t>(static_cast<double>(budget) * pol.selector.alpha_safeguard);
          const std::int64_t extra = std::max<std::int64_t>(0, safe - w.forced_n[g]);
          detail::select_in_group(w.scores + h * ld, w.runs, n_runs, g, w.forced, extra, w.keys, keep + h * L);
          pool += budget - w.forced_n[g] - extra;
        }
        // Then the segment's remaining budget, summed over heads, goes to the best (head, token) pairs.
        // Key tie order: lower token first, then lower head.
        std::int64_t n = 0;
        for (std::int64_t r = 0; r < n_runs; ++r) {
          if (w.runs[r].group != g) continue;
          for (std::int64_t t = w.runs[r].begin; t < w.runs[r].end; ++t)
            for (std::int64_t h = 0; h < heads; ++h)
              if (!keep[h * L + t])
                w.keys[n++] = selection_key(w.scores[h * ld + t], static_cast<std::uint32_t>(t * heads + h));
        }
        detail::partition_top(w.keys, n, pool);
        for (std::int64_t i = 0; i < std::min(pool, n); ++i) {
          const std::uint32_t th = key_index(w.keys[i]);
          keep[(th % heads) * L + th / heads] = 1;
        }
      }
      for (std::int64_t h = 0; h < heads; ++h) emit(h, keep + h * L);
    } else {
      static_assert(dependent_false<Sel>, "fairkv::cpu::plan: unknown selection_kind");
    }
    out.lengths[b] = static_cast<std::int32_t>(L);
  }
  return {};
}

// Convenience: allocates the plan and the scratch with std::vector (use the overload above to control memory).
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                          std::span<const segment> segments, std::span<const std::int32_t> whitelist, double ratio,
                          keep_plan& out) noexcept {
  try {
    std::size_t bytes = 0;
    FAIRKV_TRY(plan(nullptr, bytes, pol, in, segments, whitelist, ratio, keep_plan_view{}));
    std::int64_t max_tokens = 0;
    for (std::int64_t b = 0; b < in.keys.batch; ++b) max_tokens = std::max(max_tokens, in.keys.tokens_of(b));
    std::vector<std::byte> scratch(bytes);
    out.resize(in.keys.batch, in.keys.heads, max_tokens);
    return plan(scratch.data(), bytes, pol, in, segments, whitelist, ratio, out.view());
  } catch (const std::bad_alloc&) {
    return result::error(status::insufficient_workspace, "out of host memory for the plan's scratch");
  }
}

}  // namespace cpu
}  // namespace fairkv
