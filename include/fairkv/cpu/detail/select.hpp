// The CPU planner's selection under the library's total order (detail/order.hpp): the plain policy's own
// allocation (for allocators that interpolate from it) and the three selectors, one sequence at a time, over the
// runs and budgets the host front end built (detail/plan_front.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

#include "fairkv/cpu/detail/plan_workspace.hpp"
#include "fairkv/cpu/executor.hpp"
#include "fairkv/detail/order.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/policy.hpp"

namespace fairkv::cpu::detail {

// One sequence's view of the front end's results: L tokens, its runs and groups.
struct sequence_groups {
  std::int64_t b, L, n_keep, forced_total, groups, n_runs;
};

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

// The runs of group g of the sequence being planned.
[[nodiscard]] inline group_runs runs_of(const plan_workspace& w, std::int64_t g) noexcept {
  return {w.runs, w.run_order + w.group_first[g], w.group_first[g + 1] - w.group_first[g]};
}

// Keeps the `k` best non-forced tokens of one group on one score row, marking keep[t] = 1.
inline void select_in_group(const float* score_row, const group_runs& group, const std::uint8_t* forced,
                            std::int64_t k, std::uint64_t* keys, std::uint8_t* keep) {
  if (k <= 0) return;
  std::int64_t n = 0;
  group.for_each_token([&](std::int64_t t) {
    if (!forced[t]) keys[n++] = fairkv::detail::selection_key(score_row[t], static_cast<std::uint32_t>(t));
  });
  partition_top(keys, n, k);
  for (std::int64_t i = 0; i < std::min(k, n); ++i) keep[fairkv::detail::key_index(keys[i])] = 1;
}

// w.own[h, g]: how many tokens of group g head h keeps under the plain policy (one top-k over the whole sequence
// on the whole-sequence scores). union_heads selects one set on the head-mean score, so every head has its counts.
template <class Sel>
void own_allocation(const plan_workspace& w, std::int64_t ld, std::int64_t heads, const sequence_groups& s) {
  constexpr bool uni = Sel::kind == selection_kind::union_heads;
  if (uni) head_mean(w.global_scores, ld, heads, s.L, w.tmp);
  const run whole{0, s.L, 0};
  const std::int64_t only = 0;
  for (std::int64_t h = 0; h < heads; ++h) {
    if (uni && h > 0) {
      std::copy(w.own, w.own + s.groups, w.own + h * s.groups);
      continue;
    }
    std::copy(w.forced, w.forced + s.L, w.keep);
    select_in_group(uni ? w.tmp : w.global_scores + h * ld, group_runs{&whole, &only, 1}, w.forced,
                    s.n_keep - s.forced_total, w.keys, w.keep);
    std::fill(w.own + h * s.groups, w.own + (h + 1) * s.groups, 0);
    for (std::int64_t t = 0; t < s.L; ++t) w.own[h * s.groups + w.group_of[t]] += w.keep[t];
  }
}

// Selects every head's tokens within the checked budgets w.budgets[h, g] and writes the plan's rows of sequence b.
// per_head runs its heads as tasks of `ex`, each with its own slice of keys and keep mask (ld elements); union_heads
// makes one selection for all heads and head_adaptive one layer-global choice across heads, so both stay serial.
template <class Sel, executor E>
[[nodiscard]] result select_sequence(const E& ex, const Sel& sel, const plan_workspace& w, std::int64_t ld,
                                     std::int64_t heads, const sequence_groups& s, keep_plan_view out) noexcept {
  using fairkv::detail::key_index;
  using fairkv::detail::selection_key;
  const std::int64_t L = s.L, G = s.groups;
  auto emit = [&](std::int64_t h, const std::uint8_t* keep) {
    std::int32_t* row = out.row(s.b, h);
    std::int32_t n = 0;
    for (std::int64_t t = 0; t < L; ++t)
      if (keep[t]) row[n++] = static_cast<std::int32_t>(t);
    out.counts[s.b * heads + h] = n;
  };
  if constexpr (Sel::kind == selection_kind::per_head) {
    const std::int64_t tasks = w.tasks < heads ? w.tasks : heads;
    return for_shares(ex, tasks, heads, [&](std::int64_t task, std::int64_t h) {
      std::uint64_t* keys = w.keys + task * ld;
      std::uint8_t* keep = w.keep + task * ld;
      std::copy(w.forced, w.forced + L, keep);
      for (std::int64_t g = 0; g < G; ++g)
        select_in_group(w.scores + h * ld, runs_of(w, g), w.forced, w.budgets[h * G + g] - w.forced_per_group[g], keys,
                        keep);
      emit(h, keep);
    });
  } else if constexpr (Sel::kind == selection_kind::union_heads) {
    std::copy(w.forced, w.forced + L, w.keep);
    for (std::int64_t g = 0; g < G; ++g)
      select_in_group(w.mean_scores, runs_of(w, g), w.forced, w.budgets[g] - w.forced_per_group[g], w.keys, w.keep);
    for (std::int64_t h = 0; h < heads; ++h) emit(h, w.keep);
  } else if constexpr (Sel::kind == selection_kind::head_adaptive) {
    std::uint8_t* keep = w.keep;  // [heads, L]
    for (std::int64_t h = 0; h < heads; ++h) std::copy(w.forced, w.forced + L, keep + h * L);
    for (std::int64_t g = 0; g < G; ++g) {
      // Safeguard: each head first keeps floor(alpha * budget) of its best tokens, whitelisted ones included.
      std::int64_t pool = 0;
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t budget = w.budgets[h * G + g];
        const auto safe = static_cast<std::int64_t>(static_cast<double>(budget) * sel.alpha_safeguard);
        const std::int64_t extra = std::max<std::int64_t>(0, safe - w.forced_per_group[g]);
        select_in_group(w.scores + h * ld, runs_of(w, g), w.forced, extra, w.keys, keep + h * L);
        pool += budget - w.forced_per_group[g] - extra;
      }
      // Then the segment's remaining budget, summed over heads, goes to the best (head, token) pairs.
      // Key tie order: lower token first, then lower head.
      std::int64_t n = 0;
      runs_of(w, g).for_each_token([&](std::int64_t t) {
        for (std::int64_t h = 0; h < heads; ++h)
          if (!keep[h * L + t])
            w.keys[n++] = selection_key(w.scores[h * ld + t], static_cast<std::uint32_t>(t * heads + h));
      });
      partition_top(w.keys, n, pool);
      for (std::int64_t i = 0; i < std::min(pool, n); ++i) {
        const std::uint32_t th = key_index(w.keys[i]);
        keep[(th % heads) * L + th / heads] = 1;
      }
    }
    for (std::int64_t h = 0; h < heads; ++h) emit(h, keep + h * L);
  } else {
    static_assert(dependent_false<Sel>, "fairkv::cpu::plan: unknown selection_kind");
  }
  return {};
}

}  // namespace fairkv::cpu::detail
