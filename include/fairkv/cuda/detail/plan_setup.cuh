// The CUDA planner's host side: the library's front end (detail/plan_front.hpp) turned into kernel parameters
// (params.cuh, score_attention.cuh), one table entry for the batch or one per sequence, plus the limits of this
// backend's fixed-capacity parameters and grids. Runs once per planner::initialize; nothing here touches the device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fairkv/allocator.hpp"
#include "fairkv/budget.hpp"
#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/score_attention.cuh"
#include "fairkv/cuda/detail/select_split.cuh"
#include "fairkv/detail/plan_front.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/request_batch.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cuda::detail {

template <class K>
inline constexpr bool is_dense_view_v = false;  // else paged_side<const T>
template <class T>
inline constexpr bool is_dense_view_v<kv_view<const T>> = true;

// What the CUDA backend cannot do that the CPU can: fixed capacities of plan_params, grid and index widths.
// Per sequence (its length L and lists), and for the batch (grids).
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result check_cuda_limits(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                       std::int64_t L, std::span<const segment> segments,
                                       std::span<const std::int32_t> whitelist) noexcept {
  const std::int64_t batch = in.keys.batch, heads = in.keys.heads;
  if constexpr (A::needs_own_allocation) {
    return result::error(status::not_supported,
                         "allocator '%s' needs the plain policy's per-segment counts; the CUDA backend does not "
                         "implement it (use fairkv::cpu::plan)",
                         A::name);
  }
  if (segments.size() > static_cast<std::size_t>(max_segments))
    return result::error(status::not_supported, "%zu segments were given; the CUDA backend supports at most %d",
                         segments.size(), max_segments);
  const std::int64_t protected_n =
      fairkv::detail::protected_bound(fairkv::detail::protection_of(pol.allocator), L, segments);
  if (static_cast<std::int64_t>(whitelist.size()) + protected_n > max_whitelist)
    return result::error(status::not_supported,
                         "a whitelist of %zu positions plus %lld sink and boundary tokens was given; the CUDA backend "
                         "forces at most %d",
                         whitelist.size(), static_cast<long long>(protected_n), max_whitelist);
  const std::int64_t groups_bound = static_cast<std::int64_t>(segments.size()) + 1;
  if (heads * groups_bound > max_budget_entries)
    return result::error(status::not_supported,
                         "%lld heads x %lld groups exceed the CUDA backend's %d budget entries",
                         static_cast<long long>(heads), static_cast<long long>(groups_bound), max_budget_entries);
  if (batch * heads > 65535)
    return result::error(status::not_supported,
                         "batch x heads = %lld exceeds the CUDA backend's grid limit of 65535 (batch, head) rows",
                         static_cast<long long>(batch * heads));
  if (batch * heads * groups_bound > 65535)
    return result::error(status::not_supported,
                         "batch x heads x groups = %lld exceeds the CUDA backend's grid limit of 65535 problems",
                         static_cast<long long>(batch * heads * groups_bound));
  if (in.q_heads() > 65535)
    return result::error(status::not_supported, "%lld query heads exceed the CUDA backend's grid limit of 65535",
                         static_cast<long long>(in.q_heads()));
  // The selection kernels index tokens, slices and tie counts in 32 bits (head_adaptive: token x head pairs of
  // one group); the CPU allows up to 2^32 / heads.
  if (L > INT32_MAX - (INT64_C(1) << 20))
    return result::error(status::not_supported, "%lld tokens exceed the CUDA backend's limit of 2^31 - 2^20",
                         static_cast<long long>(L));
  if (Sel::kind == selection_kind::head_adaptive && L * heads > INT32_MAX)
    return result::error(status::not_supported,
                         "head_adaptive over %lld tokens x %lld heads exceeds the CUDA backend's 2^31 - 1 candidates",
                         static_cast<long long>(L), static_cast<long long>(heads));
  return {};
}

// Scoring regions and the query rows each needs, one per run (or one for the whole sequence): the front end's
// geometry (detail/plan_front/attention_geometry.hpp). fair_paper: its two widened spans are the runs and
// SnapKV's window is split between them; its H2O is one region over the whole sequence (p.paper and p.spans are
// set by build_groups).
template <class S, class A, class KeySource, class Q>
[[nodiscard]] result build_attention(const S& scorer, const layer_inputs<KeySource, Q>& in, const plan_params& p,
                                     attention_params& a) noexcept {
  constexpr bool paper = fairkv::detail::is_paper_allocator_v<A>;
  constexpr bool whole = !A::segment_local || (paper && S::source == score_source::observed_attention);
  const std::int32_t L = p.tokens;
  a.n_regions = whole ? 1 : p.n_runs;
  a.q_heads = static_cast<std::int32_t>(in.q_heads());
  a.group = a.q_heads / p.heads;
  a.scale = in.softmax_scale();
  a.from_queries = in.queries.data != nullptr;
  a.column_sums = !a.from_queries && in.attention == nullptr;
  a.local_sums = a.column_sums && !whole;
  if constexpr (S::source == score_source::window_attention) {
    a.window = scorer.window;
    a.kernel = scorer.kernel;
  }
  std::int32_t offset = 0;
  for (std::int32_t r = 0; r < a.n_regions; ++r) {
    attention_region& g = a.regions[r];
    g.begin = whole ? 0 : p.runs[r].begin;
    g.end = whole ? L : p.runs[r].end;
    std::int64_t window = fairkv::detail::region_window(scorer, g.end - g.begin);
    if constexpr (paper && S::source == score_source::window_attention) {
      const auto windows = fairkv::detail::paper_window_split(scorer.window, p.spans.split, L);
      window = r == 0 ? windows.earlier : windows.later;
    }
    const auto geo = fairkv::detail::attention_geometry<S>(g.begin, g.end, window, paper, a.column_sums);
    g.scored = static_cast<std::int32_t>(geo.scored);
    g.rows = static_cast<std::int32_t>(geo.rows);
    g.row_begin = static_cast<std::int32_t>(geo.row_begin);
    g.row_offset = offset;
    offset += g.rows;
    // The CPU reports the first query position (in region order) that the inputs do not cover.
    if (g.rows > 0 && a.from_queries && g.row_begin - (L - in.queries.tokens) < 0)
      return result::error(status::missing_input,
                           "scoring needs the query at position %lld but queries cover only the last %lld of %lld "
                           "tokens",
                           static_cast<long long>(g.row_begin), static_cast<long long>(in.queries.tokens),
                           static_cast<long long>(L));
    if (g.rows > 0 && !a.from_queries && !a.column_sums && g.row_begin - (L - in.attention_rows) < 0)
      return result::error(status::missing_input,
                           "scoring needs the attention row of position %lld but attention covers only the last %lld "
                           "rows",
                           static_cast<long long>(g.row_begin), static_cast<long long>(in.attention_rows));
  }
  a.total_rows = offset;
  return {};
}

// Groups and runs (and fair_paper's spans), and the split selection's slices per group. origin[i]: the caller's
// index of the i-th segment in position order (the allocators' per-segment inputs follow the caller's order).
template <class S, class A>
void build_groups(std::span<const segment> segments, std::int64_t L, plan_params& p, std::int32_t* origin) noexcept {
  segment sorted[max_segments], widened[2];
  fairkv::detail::sort_segments(segments, sorted, origin);
  const std::span<const segment> in_order(sorted, segments.size());
  if constexpr (fairkv::detail::is_paper_allocator_v<A>) {
    p.paper = true;
    p.spans = fairkv::detail::paper_spans_of(in_order);
  }
  const fairkv::detail::grouping g = fairkv::detail::build_runs(
      fairkv::detail::grouping_segments<S, A>(in_order, L, widened), L, p.runs, p.sizes);
  p.groups = static_cast<std::int32_t>(g.groups);
  p.n_runs = static_cast<std::int32_t>(g.runs);
  p.slice_begin[0] = 0;
  for (std::int32_t i = 0; i < p.groups; ++i) p.slice_begin[i + 1] = p.slice_begin[i] + slices_of(p.sizes[i]);
}

// Forced tokens as a sorted list: the whitelist sorted first, so its insertions are appends.
template <class A>
[[nodiscard]] result build_forced(const A& allocator, std::span<const segment> segments,
                                  std::span<const std::int32_t> whitelist, std::int64_t L, std::int64_t n_keep,
                                  std::int64_t seq, const keep_target& target, plan_params& p) noexcept {
  std::int32_t wl[max_whitelist];
  std::copy(whitelist.begin(), whitelist.end(), wl);
  std::sort(wl, wl + whitelist.size());
  std::int64_t n_forced = 0;
  p.n_forced = 0;
  auto insert = [&](std::int64_t t) {
    std::int32_t* end = p.forced + p.n_forced;
    std::int32_t* at = std::lower_bound(p.forced, end, static_cast<std::int32_t>(t));
    if (at != end && *at == t) return false;
    std::copy_backward(at, end, end + 1);
    *at = static_cast<std::int32_t>(t);
    ++p.n_forced;
    return true;
  };
  return fairkv::detail::force_tokens({wl, whitelist.size()}, fairkv::detail::protection_of(allocator), segments, L,
                                      n_keep, seq, target, n_forced, insert);
}

// Budgets per (head, group), checked by the front end, and the forced tokens of each group.
template <class S, class A>
[[nodiscard]] result build_budgets(const A& allocator, std::int64_t heads, std::int64_t n_keep,
                                   std::span<const std::int32_t> origin, plan_params& p) noexcept {
  std::int64_t sizes[max_groups] = {}, forced_per_group[max_groups] = {}, scratch[2 * max_groups] = {};
  std::int64_t budgets[max_budget_entries] = {};
  for (std::int32_t i = 0; i < p.groups; ++i) sizes[i] = p.sizes[i];
  for (std::int32_t i = 0; i < p.n_forced; ++i) ++forced_per_group[group_of(p, p.forced[i])];
  const auto G = static_cast<std::size_t>(p.groups);
  const allocation_context ctx{n_keep,    heads, {sizes, G}, {forced_per_group, G}, {}, {scratch, 2 * G},
                               fairkv::detail::group_origins<S, A>(origin)};
  FAIRKV_TRY(fairkv::detail::allocate_budgets(allocator, ctx, {budgets, static_cast<std::size_t>(heads) * G}));
  for (std::size_t i = 0; i < static_cast<std::size_t>(heads) * G; ++i)
    p.budgets[i] = static_cast<std::int32_t>(budgets[i]);
  for (std::size_t i = 0; i < G; ++i) p.forced_per_group[i] = static_cast<std::int32_t>(forced_per_group[i]);
  return {};
}

// One sequence's lists, its length and its place in the batch.
struct sequence_lists {
  std::span<const segment> segments;
  std::span<const std::int32_t> whitelist;
  const keep_target* target;
  std::int64_t tokens;
  std::int64_t seq;  // the sequence the parameters are for (0 when they serve the whole batch)
};

// The front end's steps for one sequence (within this backend's limits), into its kernel parameters.
// `with_budgets` also forces tokens and builds the checked budgets (the run; the size query, like the CPU's, does
// not look at the whitelist budget).
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result build_sequence(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                    const sequence_lists& l, bool with_budgets, plan_params& p,
                                    attention_params& a) noexcept {
  const std::int64_t heads = in.keys.heads, L = l.tokens;
  p = plan_params{};
  a = attention_params{};
  p.batch = static_cast<std::int32_t>(in.keys.batch);
  p.heads = static_cast<std::int32_t>(heads);
  p.tokens = static_cast<std::int32_t>(L);
  if constexpr (Sel::kind == selection_kind::head_adaptive) p.alpha = pol.selector.alpha_safeguard;
  std::int32_t origin[max_segments];
  build_groups<S, A>(l.segments, L, p, origin);
  if constexpr (is_attention_source(S::source)) FAIRKV_TRY((build_attention<S, A>(pol.scorer, in, p, a)));
  if (!with_budgets) return {};
  const std::int64_t n_keep = l.target->n_keep(L);
  FAIRKV_TRY(build_forced(pol.allocator, l.segments, l.whitelist, L, n_keep, l.seq, *l.target, p));
  return build_budgets<S, A>(pol.allocator, heads, n_keep, {origin, l.segments.size()}, p);
}

// The host copy of the sequences' lengths (paged keys, padded kv_views): one per sequence, each in
// [0, capacity]. min_tokens / max_tokens: the batch's lengths (fairkv::detail::length_range).
[[nodiscard]] inline result check_host_lengths(std::span<const std::int32_t> lengths, std::int64_t batch,
                                               std::int64_t capacity, const char* what, std::int64_t& min_tokens,
                                               std::int64_t& max_tokens) noexcept {
  if (static_cast<std::int64_t>(lengths.size()) != batch)
    return result::error(status::invalid_argument,
                         "inputs.keys %s: give the host copy of every sequence's length; lengths has %zu entries "
                         "for a batch of %lld",
                         what, lengths.size(), static_cast<long long>(batch));
  fairkv::detail::length_range range;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t L = lengths[static_cast<std::size_t>(b)];
    if (L < 0)
      return result::error(status::invalid_argument, "lengths[%lld] = %lld is negative", static_cast<long long>(b),
                           static_cast<long long>(L));
    if (L > capacity)
      return result::error(status::invalid_shape, "lengths[%lld] = %lld exceeds the %lld token slots of inputs.keys",
                           static_cast<long long>(b), static_cast<long long>(L), static_cast<long long>(capacity));
    range.add(L);
  }
  return range.finish(batch, min_tokens, max_tokens);
}

// The keys and the batch's lengths (min_tokens / max_tokens). Where the sequences' lengths are device memory
// (paged keys' tables, a padded kv_view's lengths) the host takes each from `lengths` (a host copy, as
// FlashInfer's plan() takes its host indptr) and checks the layout, and the device checks its arrays against both
// before any kernel reads through them (read_plan_status). A kv_view without lengths: every sequence has its tokens.
template <class S, class KeySource, class Q>
[[nodiscard]] result validate_keys_and_lengths(const layer_inputs<KeySource, Q>& in,
                                               std::span<const std::int32_t> lengths, std::int64_t& min_tokens,
                                               std::int64_t& max_tokens) noexcept {
  if constexpr (is_dense_view_v<KeySource>) {
    if (in.keys.lengths == nullptr) {
      if (!lengths.empty())
        return result::error(status::invalid_argument,
                             "lengths were given for a kv_view without lengths, whose sequences all have its %lld "
                             "tokens (set inputs.keys.lengths, in device memory, for a padded batch)",
                             static_cast<long long>(in.keys.tokens));
      return fairkv::detail::validate_lengths<S>(in, min_tokens, max_tokens);
    }
    FAIRKV_TRY(fairkv::detail::validate_keys<S>(in));
    return check_host_lengths(lengths, in.keys.batch, in.keys.tokens,
                              "are padded (inputs.keys.lengths in device memory)", min_tokens, max_tokens);
  } else {
    FAIRKV_TRY(validate_layout(in.keys, "inputs.keys"));
    return check_host_lengths(lengths, in.keys.batch, in.keys.num_pages * in.keys.page_size,
                              "are paged (their tables in device memory)", min_tokens, max_tokens);
  }
}

// The request's checks, in the CPU oracle's order and words (cpu/plan.hpp): one list for the batch, or each
// sequence's own (`requests`, errors naming the sequence). min_tokens / max_tokens: the batch's lengths.
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result validate_request(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                      std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                      const keep_target& target, const request_batch* requests,
                                      std::span<const std::int32_t> lengths, std::int64_t& min_tokens,
                                      std::int64_t& max_tokens) noexcept {
  const auto length_of = [&](std::int64_t b) -> std::int64_t {
    return lengths.empty() ? in.keys.tokens_of(b) : lengths[static_cast<std::size_t>(b)];
  };
  if (requests == nullptr) {
    FAIRKV_TRY(fairkv::detail::validate_target(target));
    FAIRKV_TRY((validate_keys_and_lengths<S>(in, lengths, min_tokens, max_tokens)));
    FAIRKV_TRY((fairkv::detail::validate_score_source<S, A>()));
    FAIRKV_TRY(fairkv::detail::validate_lists<A>(segments, whitelist, min_tokens));
    return fairkv::detail::validate_policy_inputs(pol, in, min_tokens, max_tokens);
  }
  if (!segments.empty() || !whitelist.empty())
    return result::error(status::invalid_argument,
                         "segments and whitelist are given twice: in the request batch and for the whole batch");
  if (requests->targets.empty())
    return result::error(status::invalid_argument, "requests.targets is empty: give one, or one per sequence");
  FAIRKV_TRY((validate_keys_and_lengths<S>(in, lengths, min_tokens, max_tokens)));
  FAIRKV_TRY(validate(*requests, in.keys.batch));
  FAIRKV_TRY((fairkv::detail::validate_score_source<S, A>()));
  for (std::int64_t b = 0; b < in.keys.batch; ++b) {
    const result r = fairkv::detail::validate_request_lists<A>(requests->segments_of(b), requests->whitelist_of(b),
                                                               requests->target_of(b), length_of(b));
    if (!r.ok()) return result::error(r.code(), "sequence %lld: %s", static_cast<long long>(b), r.message());
  }
  return fairkv::detail::validate_policy_inputs(pol, in, min_tokens, max_tokens);
}

// Validates the request and builds every sequence's parameters: `f(index, p, a)` receives each table entry (one
// for the whole batch, or one per sequence) as it is built; `bp` gets the batch's shape (its table pointers are
// left to the caller).
template <class S, class Sel, class A, class KeySource, class Q, class Each>
[[nodiscard]] result build_params(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                  std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                  const keep_target& target, const request_batch* requests,
                                  std::span<const std::int32_t> lengths, bool with_budgets, batch_params& bp,
                                  Each&& each) noexcept {
  std::int64_t min_tokens = 0, max_tokens = 0;
  FAIRKV_TRY(validate_request(pol, in, segments, whitelist, target, requests, lengths, min_tokens, max_tokens));
  const auto length_of = [&](std::int64_t b) -> std::int64_t {
    return lengths.empty() ? in.keys.tokens_of(b) : lengths[static_cast<std::size_t>(b)];
  };
  bp = batch_params{};
  bp.batch = static_cast<std::int32_t>(in.keys.batch);
  bp.heads = static_cast<std::int32_t>(in.keys.heads);
  bp.pitch = static_cast<std::int32_t>(max_tokens);
  bool any_empty = false;
  for (std::int64_t b = 0; b < in.keys.batch; ++b) any_empty = any_empty || length_of(b) == 0;
  bp.per_sequence = requests != nullptr || min_tokens != max_tokens || any_empty;
  const std::int64_t tables = bp.per_sequence ? in.keys.batch : 1;
  plan_params p;
  attention_params a;
  for (std::int64_t b = 0; b < tables; ++b) {
    if (length_of(b) == 0) {  // an idle slot: no groups, regions or rows, so every kernel returns for it
      p = plan_params{};
      p.batch = bp.batch;
      p.heads = bp.heads;
      a = attention_params{};
      FAIRKV_TRY(each(b, p, a));
      continue;
    }
    const sequence_lists l = requests != nullptr
                                 ? sequence_lists{requests->segments_of(b), requests->whitelist_of(b),
                                                  &requests->target_of(b), length_of(b), b}
                                 : sequence_lists{segments, whitelist, &target, length_of(b), b};
    // This backend's limits name the sequence; the front end's own errors are the CPU's, word for word.
    const result limits = check_cuda_limits(pol, in, l.tokens, l.segments, l.whitelist);
    if (!limits.ok() && requests != nullptr)
      return result::error(limits.code(), "sequence %lld: %s", static_cast<long long>(b), limits.message());
    FAIRKV_TRY(limits);
    FAIRKV_TRY(build_sequence(pol, in, l, with_budgets, p, a));
    bp.groups = std::max(bp.groups, p.groups);
    bp.slices = std::max(bp.slices, p.slice_begin[p.groups]);
    bp.stats_rows = std::max(bp.stats_rows, a.total_rows);
    bp.regions = std::max(bp.regions, a.n_regions);
    bp.q_heads = a.q_heads;
    FAIRKV_TRY(each(b, p, a));
  }
  return {};
}

}  // namespace fairkv::cuda::detail
