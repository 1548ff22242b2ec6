// Backend-independent pieces of the planners: the host-side checks of the request, scorer parameters and attention
// inputs (attention or external scores). The CPU and CUDA backends both call these, so their statuses and messages are identical.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>

#include "fairkv/budget.hpp"  // keep_target and keep_budget, which the planners include through here
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/status.hpp"

namespace fairkv {
namespace detail {

template <class S>
[[nodiscard]] result validate_scorer(const S& s) noexcept {
  if constexpr (S::source == score_source::window_attention) {
    if (s.window < 1)
      return result::error(status::invalid_argument, "scorer.window = %d must be at least 1", static_cast<int>(s.window));
    if (s.kernel < 1 || s.kernel % 2 == 0)
      return result::error(status::invalid_argument, "scorer.kernel = %d must be odd and positive",
                           static_cast<int>(s.kernel));
  }
  if constexpr (requires { s.n_sink; }) {
    if (s.n_sink < 0)
      return result::error(status::invalid_argument, "scorer.n_sink = %d must be non-negative", static_cast<int>(s.n_sink));
  }
  return {};
}

// The keys; under scorers::external a dense view without data is the shape of a cache the caller did not hand
// over (fairkv::scores_only): only its extents are used, and validate_external_inputs checks them.
template <class S, class KeySource, class Q>
[[nodiscard]] result validate_keys(const layer_inputs<KeySource, Q>& in) noexcept {
  if constexpr (S::source == score_source::external &&
                std::is_same_v<KeySource, kv_view<const typename KeySource::value_type>>) {
    if (in.keys.data == nullptr) return {};
  }
  return validate(in.keys, "inputs.keys");
}

// fair_paper computes the paper's own per-span statistics from keys and queries: external scores would be ignored.
template <class S, class A>
[[nodiscard]] result validate_score_source() noexcept {
  if constexpr (is_paper_allocator_v<A> && S::source == score_source::external)
    return result::error(status::invalid_argument,
                         "allocator '%s' computes the paper's own per-span statistics from keys and queries and "
                         "cannot take external scores (use fair or fair_with_whitelist with segment-local scores)",
                         A::name);
  else
    return {};
}

// scorers::external's scores: present, a valid view, and one score per (sequence, KV head, token) of the keys.
// Their values are not inspected: NaN and infinities are ordered like every score (scorers/external.hpp).
template <class S, class KeySource, class Q>
[[nodiscard]] result validate_external_inputs(const layer_inputs<KeySource, Q>& in, std::int64_t max_tokens) noexcept {
  if constexpr (S::source != score_source::external) {
    return {};
  } else {
    if (in.scores.data == nullptr)
      return result::error(status::missing_input, "scorer '%s' needs the caller's scores (inputs.scores)", S::name);
    FAIRKV_TRY(validate(in.scores, "inputs.scores"));
    if (in.scores.batch != in.keys.batch || in.scores.heads != in.keys.heads || in.scores.tokens != max_tokens)
      return result::error(status::invalid_shape,
                           "inputs.scores is [batch %lld, heads %lld, tokens %lld] but the keys are [batch %lld, "
                           "heads %lld, tokens %lld]",
                           static_cast<long long>(in.scores.batch), static_cast<long long>(in.scores.heads),
                           static_cast<long long>(in.scores.tokens), static_cast<long long>(in.keys.batch),
                           static_cast<long long>(in.keys.heads), static_cast<long long>(max_tokens));
    return {};
  }
}

// fair_paper's segments: exactly two adjacent spans, in either order.
[[nodiscard]] inline result validate_paper_spans(std::span<const segment> segments, const char* allocator) noexcept {
  const bool adjacent = segments.size() == 2 &&
                        (segments[0].end == segments[1].begin || segments[1].end == segments[0].begin);
  if (!adjacent)
    return result::error(status::invalid_argument,
                         "allocator '%s' takes exactly two adjacent segments (the paper's defense and "
                         "system-instruction spans, in either order); got %zu%s",
                         allocator, segments.size(), segments.size() == 2 ? " that do not touch" : "");
  return {};
}

template <class S, class A, class KeySource, class Q>
[[nodiscard]] result validate_attention_inputs(const layer_inputs<KeySource, Q>& in, std::int64_t min_tokens,
                                               std::int64_t max_tokens) noexcept {
  if constexpr (!is_attention_source(S::source)) {
    return {};
  } else {
    constexpr bool h2o = S::source == score_source::observed_attention;
    const bool have_rows = in.attention != nullptr;
    const bool have_sums = h2o && in.attention_column_sums != nullptr;
    const bool have_local_sums = h2o && in.attention_local_column_sums != nullptr;
    if (in.queries.data == nullptr && !have_rows && !have_sums && !have_local_sums)
      return result::error(status::missing_input,
                           "scorer '%s' needs the window's queries (inputs.queries) or the engine's attention "
                           "(inputs.attention%s)",
                           S::name, h2o ? ", inputs.attention_column_sums or inputs.attention_local_column_sums" : "");
    // The scale multiplies the logits the backend computes from queries: NaN makes every score NaN (the plan
    // falls to the tie-break order) and a negative one inverts attention. 0 asks for 1 / sqrt(head_dim).
    if (!(std::isfinite(in.scale) && in.scale >= 0.f))
      return result::error(status::invalid_argument,
                           "inputs.scale = %g must be finite and positive (or 0 for 1 / sqrt(head_dim))",
                           static_cast<double>(in.scale));
    const std::int64_t qh = in.q_heads();
    if (qh <= 0)
      return result::error(status::invalid_shape,
                           "inputs.attention_q_heads must be positive when only attention is given");
    if (qh % in.keys.heads != 0)
      return result::error(status::invalid_shape,
                           "the %lld query heads are not a multiple of the %lld KV heads (GQA groups must be equal)",
                           static_cast<long long>(qh), static_cast<long long>(in.keys.heads));
    if (in.queries.data != nullptr) {
      FAIRKV_TRY(validate(in.queries, "inputs.queries"));
      if (in.queries.lengths != nullptr)
        return result::error(status::invalid_argument,
                             "inputs.queries.lengths is set: the queries are the last %lld positions of every "
                             "sequence (the keys carry the sequences' lengths)",
                             static_cast<long long>(in.queries.tokens));
      if (in.queries.batch != in.keys.batch || in.queries.head_dim != in.keys.head_dim)
        return result::error(status::invalid_shape,
                             "inputs.queries is [batch %lld, head_dim %lld] but the keys are [batch %lld, head_dim %lld]",
                             static_cast<long long>(in.queries.batch), static_cast<long long>(in.queries.head_dim),
                             static_cast<long long>(in.keys.batch), static_cast<long long>(in.keys.head_dim));
      if (in.queries.tokens < 1 || in.queries.tokens > min_tokens)
        return result::error(status::invalid_shape,
                             "inputs.queries has %lld positions; it must hold between 1 and %lld (the shortest sequence)",
                             static_cast<long long>(in.queries.tokens), static_cast<long long>(min_tokens));
    } else {
      // One leading dimension for the whole batch: sequences of different lengths cannot default it to theirs.
      if (in.attention_ld == 0 && min_tokens != max_tokens)
        return result::error(status::invalid_shape,
                             "inputs.attention_ld is 0 but the sequences have %lld to %lld tokens: give the "
                             "attention's leading dimension (at least %lld)",
                             static_cast<long long>(min_tokens), static_cast<long long>(max_tokens),
                             static_cast<long long>(max_tokens));
      const std::int64_t ld = in.attention_ld != 0 ? in.attention_ld : max_tokens;
      if (ld < max_tokens)
        return result::error(status::invalid_shape, "inputs.attention_ld = %lld is smaller than the %lld tokens",
                             static_cast<long long>(ld), static_cast<long long>(max_tokens));
      if (have_rows && (in.attention_rows < 1 || in.attention_rows > min_tokens))
        return result::error(status::invalid_shape, "inputs.attention_rows = %lld must be in [1, %lld]",
                             static_cast<long long>(in.attention_rows), static_cast<long long>(min_tokens));
      // Column sums: the whole-sequence regions read attention_column_sums, the segment-local ones
      // attention_local_column_sums (fairkv/scoring_regions.hpp); fair_paper's H2O drops the later span's votes
      // for the earlier one, which no sum carries.
      if constexpr (h2o) {
        if (!have_rows) {
          if constexpr (is_paper_allocator_v<A>) {
            return result::error(status::missing_input,
                                 "allocator '%s' with H2O needs queries or attention rows: its statistic drops the "
                                 "later span's attention to the earlier one, which column sums do not separate",
                                 A::name);
          } else if constexpr (A::segment_local) {
            if (!have_local_sums)
              return result::error(status::missing_input,
                                   "segment-local H2O (allocator '%s') needs queries, attention rows or "
                                   "inputs.attention_local_column_sums: whole-sequence column sums "
                                   "(inputs.attention_column_sums) mix attention across segments",
                                   A::name);
            if (A::needs_own_allocation && !have_sums)
              return result::error(status::missing_input,
                                   "allocator '%s' also ranks tokens by whole-sequence H2O scores: with "
                                   "inputs.attention_local_column_sums it needs inputs.attention_column_sums too",
                                   A::name);
          } else if (!have_sums) {
            return result::error(status::missing_input,
                                 "allocator '%s' scores the whole sequence: H2O needs queries, attention rows or "
                                 "inputs.attention_column_sums (inputs.attention_local_column_sums are per "
                                 "region)",
                                 A::name);
          }
        }
      }
    }
    return {};
  }
}

// The target: a ratio in [0, 1) or a token budget of at least one token, never both (budget.hpp says why).
[[nodiscard]] inline result validate_target(const keep_target& target) noexcept {
  if (!target.by_tokens()) {
    if (!(target.ratio >= 0.0 && target.ratio < 1.0))
      return result::error(status::invalid_argument, "ratio = %g is outside [0, 1)", target.ratio);
    return {};
  }
  if (target.ratio != 0.0)
    return result::error(status::invalid_argument,
                         "the keep target sets both ratio = %g and a budget of %lld tokens; set one "
                         "(keep_target::of_ratio or keep_target::of_tokens)",
                         target.ratio, static_cast<long long>(target.tokens));
  if (target.tokens < 0)
    return result::error(status::invalid_argument, "the token budget %lld is negative",
                         static_cast<long long>(target.tokens));
  if (target.tokens == 0)
    return result::error(status::invalid_argument,
                         "a token budget of 0 keeps nothing; the budget must be at least 1 token (to drop a "
                         "sequence, free it in the engine)");
  return {};
}

// A batch's sequence lengths: the shortest and the longest of its non-empty sequences. A sequence of no tokens (an
// engine's idle slot in a ragged batch) plans to nothing, and the lists, targets and query windows of the batch
// apply to the others; a batch with nothing in it is empty_cache.
class length_range {
 public:
  void add(std::int64_t L) noexcept {
    if (L == 0) return;
    max_ = std::max(max_, L);
    min_ = std::min(min_, L);
  }
  [[nodiscard]] result finish(std::int64_t batch, std::int64_t& min_tokens, std::int64_t& max_tokens) const noexcept {
    if (max_ == 0)
      return batch == 1 ? result::error(status::empty_cache, "sequence 0 of inputs.keys has no tokens")
                        : result::error(status::empty_cache, "all %lld sequences of inputs.keys are empty",
                                        static_cast<long long>(batch));
    min_tokens = min_;
    max_tokens = max_;
    return {};
  }

 private:
  std::int64_t min_ = INT64_MAX, max_ = 0;
};

// The keys and the batch's sequence lengths (returned in min_tokens / max_tokens: see length_range).
template <class S, class KeySource, class Q>
[[nodiscard]] result validate_lengths(const layer_inputs<KeySource, Q>& in, std::int64_t& min_tokens,
                                      std::int64_t& max_tokens) noexcept {
  FAIRKV_TRY(validate_keys<S>(in));
  if constexpr (requires { in.keys.lengths; }) FAIRKV_TRY(validate_host_lengths(in.keys, "inputs.keys"));
  length_range range;
  for (std::int64_t b = 0; b < in.keys.batch; ++b) {
    const std::int64_t L = in.keys.tokens_of(b);
    if (L > INT32_MAX || L * in.keys.heads > INT64_C(0xFFFFFFFF))
      return result::error(status::not_supported, "sequence %lld has %lld tokens; at most 2^32 / heads are supported",
                           static_cast<long long>(b), static_cast<long long>(L));
    range.add(L);
  }
  return range.finish(in.keys.batch, min_tokens, max_tokens);
}

// Segments and whitelist against what the allocator uses and against `tokens`, the length of every sequence they
// apply to (the shortest non-empty one, for one list applied to a whole batch).
template <class A>
[[nodiscard]] result validate_lists(std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                    std::int64_t tokens) noexcept {
  if constexpr (!A::uses_segments) {
    if (!segments.empty())
      return result::error(status::invalid_argument,
                           "%zu segments were given but allocator '%s' does not use segments (use fair, "
                           "fair_with_whitelist or debias)",
                           segments.size(), A::name);
  }
  if constexpr (!A::uses_whitelist) {
    if (!whitelist.empty())
      return result::error(status::invalid_argument,
                           "a whitelist of %zu positions was given but allocator '%s' ignores whitelists (use "
                           "whitelist, fair_with_whitelist or debias)",
                           whitelist.size(), A::name);
  }
  FAIRKV_TRY(validate_segments(segments, tokens));
  if constexpr (is_paper_allocator_v<A>) FAIRKV_TRY(validate_paper_spans(segments, A::name));
  return validate_whitelist(whitelist, tokens);
}

// One sequence's own lists in a request batch (fairkv/request_batch.hpp): an empty sequence plans to nothing, so
// it takes none (a list for it is the caller's mistake, not something to drop silently); its target is checked.
template <class A>
[[nodiscard]] result validate_request_lists(std::span<const segment> segments,
                                            std::span<const std::int32_t> whitelist, const keep_target& target,
                                            std::int64_t tokens) noexcept {
  FAIRKV_TRY(validate_target(target));
  if (tokens == 0 && (!segments.empty() || !whitelist.empty()))
    return result::error(status::invalid_argument, "the sequence has no tokens but %zu segments and %zu whitelist "
                         "positions were given for it", segments.size(), whitelist.size());
  return tokens == 0 ? result{} : validate_lists<A>(segments, whitelist, tokens);
}

// The policy's own parameters and the statistics the scorer reads.
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result validate_policy_inputs(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                            std::int64_t min_tokens, std::int64_t max_tokens) noexcept {
  FAIRKV_TRY(validate_protection(protection_of(pol.allocator)));
  FAIRKV_TRY(validate_scorer(pol.scorer));
  if constexpr (Sel::kind == selection_kind::head_adaptive) {
    if (!(pol.selector.alpha_safeguard >= 0.f && pol.selector.alpha_safeguard <= 1.f))
      return result::error(status::invalid_argument, "selector.alpha_safeguard = %g is outside [0, 1]",
                           static_cast<double>(pol.selector.alpha_safeguard));
  }
  FAIRKV_TRY(validate_external_inputs<S>(in, max_tokens));
  return validate_attention_inputs<S, A>(in, min_tokens, max_tokens);
}

// Everything a planner checks before it touches any memory, in one order for every backend: the target, keys,
// sequence lengths (returned in min_tokens / max_tokens), segments and whitelist against what the allocator
// uses, scorer and selector parameters, external scores, attention inputs.
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result validate_plan_request(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                           std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                           const keep_target& target, std::int64_t& min_tokens,
                                           std::int64_t& max_tokens) noexcept {
  FAIRKV_TRY(validate_target(target));
  FAIRKV_TRY(validate_lengths<S>(in, min_tokens, max_tokens));
  FAIRKV_TRY((validate_score_source<S, A>()));
  FAIRKV_TRY(validate_lists<A>(segments, whitelist, min_tokens));
  return validate_policy_inputs(pol, in, min_tokens, max_tokens);
}

}  // namespace detail
}  // namespace fairkv
