// The CUDA backend's planner, in CUB's shape:
//
//   size_t bytes = 0;
//   fairkv::cuda::plan(nullptr, bytes, policy, inputs, segments, whitelist, ratio, plan_view, stream);  // size
//   fairkv::cuda::plan(d_temp, bytes, policy, inputs, segments, whitelist, ratio, plan_view, stream);   // run
//
// `inputs` and `plan_view` point at device memory; `segments` and `whitelist` are small HOST arrays that are
// validated on the host and passed to the kernels by value (detail/params.cuh states the limits). Every check
// that the CPU oracle makes is made on the host, with the CPU's messages, before the first launch. Nothing is
// allocated and the host never waits for the device, so a plan can be captured in a CUDA graph.
//
// Pipeline (all on `stream`): score -> [head mean for union] -> select: radix select of each (row, group)
// threshold + stable scan-based marking (per_head / union: many blocks per problem, detail/select_split.cuh;
// head_adaptive: one block per (sequence, group), detail/select.cuh) -> emit (count + scan of the keep mask into
// ascending indices, many blocks per row). Budgets per (head, group) are computed on the host by the policy's allocator: they
// depend only on the sizes and whitelist counts, which the host knows. debias needs the plain policy's
// per-group counts (a device result) and is not supported here (status::not_supported). fair_paper (the paper's
// two-span mode) widens its spans to the groups [0, split) and [split, L) on the host (one group for its
// StreamingLLM) and scores with the same kernels in the paper's way (detail/score_attention.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "fairkv/allocator.hpp"
#include "fairkv/cuda/detail/launch.cuh"
#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/plan_kernels.cuh"
#include "fairkv/cuda/detail/score_attention.cuh"
#include "fairkv/cuda/detail/score_keys.cuh"
#include "fairkv/cuda/detail/select_split.cuh"
#include "fairkv/cuda/detail/workspace.cuh"
#include "fairkv/cuda/error.cuh"
#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/detail/validate.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cuda {

namespace detail {

template <class K>
inline constexpr bool is_dense_view_v = false;
template <class T>
inline constexpr bool is_dense_view_v<kv_view<const T>> = true;

// Host-side validation of scorer parameters and attention inputs is shared with the CPU backend
// (fairkv/detail/validate.hpp), so statuses and messages are identical.

// Segment indices sorted by begin (at most max_segments, checked by the caller).
inline void sort_segments(std::span<const segment> segments, std::int32_t* order) noexcept {
  for (std::size_t i = 0; i < segments.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  std::sort(order, order + segments.size(),
            [&](std::int32_t a, std::int32_t b) { return segments[a].begin < segments[b].begin; });
}

// Runs (maximal token ranges of one group): segments in position order, gaps form the remainder group.
inline void build_runs(std::span<const segment> segments, std::int32_t tokens, plan_params& p) noexcept {
  std::int32_t order[max_segments];
  sort_segments(segments, order);
  const auto n_segments = static_cast<std::int32_t>(segments.size());
  const std::int32_t remainder = n_segments;
  std::int32_t pos = 0, covered = 0;
  p.n_runs = 0;
  for (std::int32_t i = 0; i < n_segments; ++i) {
    const segment& s = segments[order[i]];
    if (s.begin > pos) p.runs[p.n_runs++] = {pos, s.begin, remainder};
    p.runs[p.n_runs++] = {s.begin, s.end, i};
    pos = s.end;
    covered += s.size();
  }
  if (pos < tokens) p.runs[p.n_runs++] = {pos, tokens, remainder};
  p.groups = n_segments + (covered < tokens ? 1 : 0);
  for (std::int32_t g = 0; g < p.groups; ++g) p.sizes[g] = 0;
  for (std::int32_t r = 0; r < p.n_runs; ++r) p.sizes[p.runs[r].group] += p.runs[r].end - p.runs[r].begin;
  p.slice_begin[0] = 0;
  for (std::int32_t g = 0; g < p.groups; ++g) p.slice_begin[g + 1] = p.slice_begin[g] + slices_of(p.sizes[g]);
}

// fair_paper's two adjacent segments (validated) as the original spans, in position order.
[[nodiscard]] inline fairkv::detail::paper_spans paper_spans_of(std::span<const segment> segments) noexcept {
  const bool first_is_earlier = segments[0].end == segments[1].begin;
  const segment& earlier = segments[first_is_earlier ? 0 : 1];
  const segment& later = segments[first_is_earlier ? 1 : 0];
  return {earlier.begin, earlier.end, later.end};
}

// Scoring regions and the query rows each needs (cpu/score.hpp's score_region, one entry per region). fair_paper
// (cpu/score_paper.hpp): its two widened spans are the runs, SnapKV's window is split between them, H2O is one
// region over the whole sequence (a.paper and a.spans are set by the caller).
template <class S, class A, class KeySource, class Q>
[[nodiscard]] result build_attention(const S& scorer, const layer_inputs<KeySource, Q>& in, const plan_params& p,
                                     attention_params& a) noexcept {
  constexpr bool paper = fairkv::detail::is_paper_allocator_v<A>;
  constexpr bool whole = !A::segment_local || (paper && S::source == score_source::observed_attention);
  const std::int32_t L = p.tokens;
  a.n_regions = whole ? 1 : p.n_runs;
  a.q_heads = static_cast<std::int32_t>(in.q_heads());
  a.group = a.q_heads / p.heads;
  a.scale = in.scale != 0.f ? in.scale : 1.f / std::sqrt(static_cast<float>(in.keys.head_dim));
  a.from_queries = in.queries.data != nullptr;
  a.column_sums = !a.from_queries && in.attention == nullptr;
  if constexpr (S::source == score_source::window_attention) {
    a.window = scorer.window;
    a.kernel = scorer.kernel;
  }
  std::int32_t offset = 0;
  for (std::int32_t r = 0; r < a.n_regions; ++r) {
    attention_region& g = a.regions[r];
    g.begin = whole ? 0 : p.runs[r].begin;
    g.end = whole ? L : p.runs[r].end;
    const std::int32_t n = g.end - g.begin;
    if constexpr (S::source == score_source::window_attention) {
      // fair_paper: the window is split between the spans, a span without one scores 0; elsewhere a one-token
      // region is its own window.
      const auto windows = fairkv::detail::paper_window_split(scorer.window, a.spans.split, L);
      const auto w = static_cast<std::int32_t>(
          paper ? (r == 0 ? windows.earlier : windows.later) : std::min<std::int32_t>(scorer.window, n - 1));
      g.scored = w == 0 && !paper ? 0 : n - w;
      g.rows = w;
      g.row_begin = g.end - w;
    } else if constexpr (S::source == score_source::last_attention) {
      g.scored = n - 1;
      g.rows = 1;
      g.row_begin = g.end - 1;
    } else {
      g.scored = n;
      g.rows = a.column_sums ? 0 : n;
      g.row_begin = g.begin;
    }
    g.row_offset = offset;
    offset += g.rows;
    // The CPU reports the first query position (in region order) that the inputs do not cover.
    if (g.rows > 0 && a.from_queries && g.row_begin - (L - in.queries.tokens) < 0)
      return result::error(status::missing_input,
                           "scoring needs the query at position %lld but queries cover only the last %lld of %lld tokens",
                           static_cast<long long>(g.row_begin), static_cast<long long>(in.queries.tokens),
                           static_cast<long long>(L));
    if (g.rows > 0 && !a.from_queries && !a.column_sums && g.row_begin - (L - in.attention_rows) < 0)
      return result::error(status::missing_input,
                           "scoring needs the attention row of position %lld but attention covers only the last %lld rows",
                           static_cast<long long>(g.row_begin), static_cast<long long>(in.attention_rows));
  }
  a.total_rows = offset;
  return {};
}

// Everything the host can check and compute before a launch. `full` also builds the budgets (the run phase; the
// size query, like the CPU's, does not look at the whitelist budget).
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result prepare(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                             std::span<const segment> segments, std::span<const std::int32_t> whitelist, double ratio,
                             bool full, plan_params& p, attention_params& a) noexcept {
  static_assert(is_dense_view_v<KeySource>,
                "fairkv::cuda::plan: the keys must be a kv_view<const T> (contiguous or strided); paged keys are "
                "not supported by the CUDA planner (compact() does support paged views)");
  std::int64_t min_tokens = 0, max_tokens = 0;  // dense views: one length for the whole batch
  FAIRKV_TRY(fairkv::detail::validate_plan_request(pol, in, segments, whitelist, ratio, min_tokens, max_tokens));
  const std::int64_t batch = in.keys.batch, heads = in.keys.heads, L = in.keys.tokens;

  // ---- the CUDA backend's own limits ----
  if constexpr (A::needs_own_allocation) {
    return result::error(status::not_supported,
                         "allocator '%s' needs the plain policy's per-segment counts; the CUDA backend does not "
                         "implement it (use fairkv::cpu::plan)",
                         A::name);
  }
  if (segments.size() > static_cast<std::size_t>(max_segments))
    return result::error(status::not_supported, "%zu segments were given; the CUDA backend supports at most %d",
                         segments.size(), max_segments);
  const allocators::protection protect = fairkv::detail::protection_of(pol.allocator);
  const std::int64_t protected_n = fairkv::detail::protected_bound(protect, L, segments);
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
  if (batch * heads * (static_cast<std::int64_t>(segments.size()) + 1) > 65535)
    return result::error(status::not_supported,
                         "batch x heads x groups = %lld exceeds the CUDA backend's grid limit of 65535 problems",
                         static_cast<long long>(batch * heads * (static_cast<std::int64_t>(segments.size()) + 1)));
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

  p.batch = static_cast<std::int32_t>(batch);
  p.heads = static_cast<std::int32_t>(heads);
  p.tokens = static_cast<std::int32_t>(L);
  if constexpr (Sel::kind == selection_kind::head_adaptive) p.alpha = pol.selector.alpha_safeguard;
  if constexpr (fairkv::detail::is_paper_allocator_v<A>) {
    // The groups are the widened spans [0, split) and [split, L); the paper's StreamingLLM keeps one group.
    a.paper = true;
    a.spans = paper_spans_of(segments);
    const auto split = static_cast<std::int32_t>(a.spans.split);
    const segment widened[2] = {{0, split}, {split, p.tokens}};
    build_runs(fairkv::detail::is_streaming_llm_v<S> ? std::span<const segment>{} : std::span<const segment>(widened),
               p.tokens, p);
  } else {
    build_runs(segments, p.tokens, p);
  }
  if constexpr (is_attention_source(S::source)) FAIRKV_TRY((build_attention<S, A>(pol.scorer, in, p, a)));
  if (!full) return {};

  // ---- whitelist: sorted distinct positions, charged to their group ----
  for (std::size_t i = 0; i < whitelist.size(); ++i) p.forced[i] = whitelist[i];
  std::sort(p.forced, p.forced + whitelist.size());
  p.n_forced = static_cast<std::int32_t>(std::unique(p.forced, p.forced + whitelist.size()) - p.forced);
  const std::int64_t n_keep = keep_budget(L, ratio);
  // Every sequence of a kv_view has the same length, so the CPU would report sequence 0 first.
  if (p.n_forced > n_keep)
    return result::error(status::budget_exceeded,
                         "the whitelist holds %lld distinct positions but sequence %lld keeps only %lld of its %lld "
                         "tokens at ratio %g",
                         static_cast<long long>(p.n_forced), 0LL, static_cast<long long>(n_keep),
                         static_cast<long long>(L), ratio);
  // ---- sinks and boundary tokens, inserted into the sorted list (bounded above by max_whitelist) ----
  std::int64_t n_forced = p.n_forced;
  FAIRKV_TRY(fairkv::detail::add_protected(protect, segments, L, n_keep, 0, ratio, n_forced, [&](std::int64_t t) {
    std::int32_t* end = p.forced + p.n_forced;
    std::int32_t* at = std::lower_bound(p.forced, end, static_cast<std::int32_t>(t));
    if (at != end && *at == t) return false;
    std::copy_backward(at, end, end + 1);
    *at = static_cast<std::int32_t>(t);
    ++p.n_forced;
    return true;
  }));
  std::int64_t sizes[max_groups] = {}, forced_n[max_groups] = {}, scratch[max_groups] = {};
  for (std::int32_t g = 0; g < p.groups; ++g) sizes[g] = p.sizes[g];
  for (std::int32_t i = 0; i < p.n_forced; ++i) ++forced_n[group_of(p, p.forced[i])];

  // ---- budgets per (head, group), checked exactly as the CPU checks them ----
  std::int64_t budgets[max_budget_entries] = {};
  const std::int64_t groups = p.groups;
  const allocation_context ctx{n_keep,
                               heads,
                               {sizes, static_cast<std::size_t>(groups)},
                               {forced_n, static_cast<std::size_t>(groups)},
                               {},
                               {scratch, static_cast<std::size_t>(groups)}};
  FAIRKV_TRY(pol.allocator.allocate(ctx, {budgets, static_cast<std::size_t>(heads * groups)}));
  for (std::int64_t h = 0; h < heads; ++h) {
    std::int64_t sum = 0;
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t v = budgets[h * groups + g];
      if (v < forced_n[g] || v > sizes[g])
        return result::error(status::internal_error,
                             "allocator '%s' gave head %lld, group %lld a budget of %lld outside [%lld, %lld]", A::name,
                             static_cast<long long>(h), static_cast<long long>(g), static_cast<long long>(v),
                             static_cast<long long>(forced_n[g]), static_cast<long long>(sizes[g]));
      sum += v;
    }
    if (sum != n_keep)
      return result::error(status::internal_error, "allocator '%s' gave head %lld %lld tokens instead of %lld", A::name,
                           static_cast<long long>(h), static_cast<long long>(sum), static_cast<long long>(n_keep));
  }
  for (std::int64_t i = 0; i < heads * groups; ++i) p.budgets[i] = static_cast<std::int32_t>(budgets[i]);
  for (std::int64_t g = 0; g < groups; ++g) p.forced_n[g] = static_cast<std::int32_t>(forced_n[g]);
  return {};
}

// One layout for the size query and the run (CUB convention).
struct plan_workspace {
  float* scores = nullptr;      // [batch * heads, tokens]
  float* mean = nullptr;        // [batch, tokens] head-mean scores (union)
  std::uint8_t* keep = nullptr; // [batch * heads, tokens] keep mask ([batch, tokens] for union)
  row_stat* stats = nullptr;    // [batch, q_heads, total_rows] softmax statistics of the query rows
  float* acc = nullptr;         // [batch, q_heads, tokens] accumulated attention
  split_state* states = nullptr;  // [selection rows * groups] per-problem radix state (per_head, union)
  unsigned* slice_hist = nullptr; // [selection rows, total slices, 256] last-pass histogram of every slice
  std::int32_t* chunk_counts = nullptr;  // [batch * heads, emit chunks] kept tokens per emit chunk
};

template <class S, class Sel>
std::size_t layout(void* base, plan_workspace& w, const plan_params& p, const attention_params& a) noexcept {
  workspace_carver c(base);
  const auto B = static_cast<std::size_t>(p.batch), H = static_cast<std::size_t>(p.heads),
             L = static_cast<std::size_t>(p.tokens);
  constexpr bool uni = Sel::kind == selection_kind::union_heads;
  constexpr bool attn = is_attention_source(S::source);
  c.carve(w.scores, B * H * L);
  c.carve(w.mean, uni ? B * L : 0);
  c.carve(w.keep, (uni ? B : B * H) * L);
  c.carve(w.stats, attn ? B * static_cast<std::size_t>(a.q_heads) * static_cast<std::size_t>(a.total_rows) : 0);
  c.carve(w.acc, attn ? B * static_cast<std::size_t>(a.q_heads) * L : 0);
  constexpr bool split = Sel::kind != selection_kind::head_adaptive;
  const std::size_t sel_rows = uni ? B : B * H;
  c.carve(w.states, split ? sel_rows * static_cast<std::size_t>(p.groups) : 0);
  c.carve(w.slice_hist, split ? sel_rows * static_cast<std::size_t>(p.slice_begin[p.groups]) * 256u : 0);
  const std::size_t chunks = (L + static_cast<std::size_t>(emit_chunk) - 1) / static_cast<std::size_t>(emit_chunk);
  c.carve(w.chunk_counts, B * H * chunks);
  return c.bytes();
}

[[nodiscard]] inline unsigned grid_for(std::int64_t n, int threads) noexcept {
  const std::int64_t g = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(g, 1, 65535));
}

template <class S, class T, class Q>
[[nodiscard]] result launch_scores(const S& scorer, const layer_inputs<kv_view<const T>, Q>& in, const plan_params& p,
                                   const attention_params& a, const plan_workspace& w, cudaStream_t stream) noexcept {
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads;
  if constexpr (S::source == score_source::position) {
    auto positions = [&](const auto& f) {
      launch(score_position_kernel<std::decay_t<decltype(f)>>, grid_for(rows * p.tokens, 256), 256, 0, stream, f,
             p.batch, p.heads, p.tokens, w.scores);
    };
    if constexpr (fairkv::detail::is_streaming_llm_v<S>) {
      if (a.paper) {
        positions(paper_streaming_position{a.spans.split, std::min<std::int64_t>(scorer.n_sink, p.tokens)});
        return from_cuda(cudaGetLastError());
      }
    }
    positions(scorer);
  } else if constexpr (S::source == score_source::keys) {
    const kv_view<const T>& k = in.keys;
    const int per_block = staged_rows(k.head_dim, sizeof(T));
    if (per_block < 1)
      return result::error(status::not_supported, "head_dim = %lld is too large for the key scoring kernel",
                           static_cast<long long>(k.head_dim));
    const dim3 grid(static_cast<unsigned>((std::int64_t{p.tokens} + per_block - 1) / per_block),
                    static_cast<unsigned>(rows));
    const std::size_t smem = static_cast<std::size_t>(per_block) * 4u * staged_row_words(k.head_dim, sizeof(T));
    constexpr std::int64_t e = sizeof(T);
    const bool vec = k.stride_dim == 1 && (k.head_dim * e) % 16 == 0 &&
                     reinterpret_cast<std::uintptr_t>(k.data) % 16 == 0 && (k.stride_token * e) % 16 == 0 &&
                     (k.stride_head * e) % 16 == 0 && (k.stride_batch * e) % 16 == 0;
    launch(vec ? score_keys_kernel<S, T, true> : score_keys_kernel<S, T, false>, grid, key_score_threads, smem, stream,
           scorer, k, per_block, w.scores);
  } else {
    if (!a.column_sums && a.total_rows > 0)
      launch(attention_stats_kernel<T, Q>,
             dim3(static_cast<unsigned>(a.total_rows), static_cast<unsigned>(a.q_heads), static_cast<unsigned>(p.batch)),
             attention_threads, 0, stream, a, in, w.stats);
    launch(attention_accumulate_kernel<S::source, T, Q>,
           dim3(static_cast<unsigned>((std::int64_t{p.tokens} + attention_threads - 1) / attention_threads),
                static_cast<unsigned>(a.q_heads), static_cast<unsigned>(p.batch)),
           attention_threads, 0, stream, a, in, w.stats, w.acc);
    launch(attention_finalize_kernel<S::source>, grid_for(rows * p.tokens, 256), 256, 0, stream, a, p.batch, p.heads,
           p.tokens, w.acc, w.scores);
    if constexpr (S::source != score_source::observed_attention)
      launch(attention_pad_kernel<>,
             dim3(static_cast<unsigned>(a.n_regions), static_cast<unsigned>(p.batch),
                  static_cast<unsigned>(a.paper ? p.heads : 1)),
             attention_threads, 0, stream, a, p.heads, p.tokens, w.scores);
  }
  return from_cuda(cudaGetLastError());
}

}  // namespace detail

// Checks everything plan() checks on the host, without touching the device. `out` must describe device memory
// of the right extents. A success means plan() will launch (device errors aside).
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result can_implement(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                   std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                   double ratio, const keep_plan_view& out) noexcept {
  detail::plan_params p;
  detail::attention_params a;
  FAIRKV_TRY(detail::prepare(pol, in, segments, whitelist, ratio, true, p, a));
  if (out.indices == nullptr || out.counts == nullptr || out.lengths == nullptr)
    return result::error(status::null_pointer, "the output plan's indices, counts and lengths must be non-null");
  if (out.batch != in.keys.batch || out.heads != in.keys.heads || out.capacity < in.keys.tokens)
    return result::error(status::invalid_shape,
                         "the output plan is [batch %lld, heads %lld, capacity %lld] but the keys need "
                         "[%lld, %lld, >= %lld]",
                         static_cast<long long>(out.batch), static_cast<long long>(out.heads),
                         static_cast<long long>(out.capacity), static_cast<long long>(in.keys.batch),
                         static_cast<long long>(in.keys.heads), static_cast<long long>(in.keys.tokens));
  return {};
}

// Plans one layer on the device. With d_temp_storage == nullptr only temp_storage_bytes is written.
// On error nothing has been launched, except for device_error results from the launches themselves.
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(void* d_temp_storage, std::size_t& temp_storage_bytes, const policy<S, Sel, A>& pol,
                          const layer_inputs<KeySource, Q>& in, std::span<const segment> segments,
                          std::span<const std::int32_t> whitelist, double ratio, keep_plan_view out,
                          cudaStream_t stream = nullptr) noexcept {
  using T = typename KeySource::value_type;
  detail::plan_params p;
  detail::attention_params a;
  detail::plan_workspace w;
  if (d_temp_storage == nullptr) {
    FAIRKV_TRY(detail::prepare(pol, in, segments, whitelist, ratio, false, p, a));
    temp_storage_bytes = detail::layout<S, Sel>(nullptr, w, p, a);
    return {};
  }
  FAIRKV_TRY(detail::prepare(pol, in, segments, whitelist, ratio, true, p, a));
  const std::size_t needed = detail::layout<S, Sel>(nullptr, w, p, a);
  if (temp_storage_bytes < needed)
    return result::error(status::insufficient_workspace, "temp_storage_bytes = %zu but the plan needs %zu",
                         temp_storage_bytes, needed);
  FAIRKV_TRY(can_implement(pol, in, segments, whitelist, ratio, out));
  detail::layout<S, Sel>(detail::align_base(d_temp_storage), w, p, a);

  FAIRKV_TRY((detail::launch_scores<S, T, Q>(pol.scorer, in, p, a, w, stream)));
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads;
  if constexpr (Sel::kind == selection_kind::per_head || Sel::kind == selection_kind::union_heads) {
    constexpr bool uni = Sel::kind == selection_kind::union_heads;
    const float* sel_scores = w.scores;
    if constexpr (uni) {
      detail::launch(detail::head_mean_kernel<>, detail::grid_for(static_cast<std::int64_t>(p.batch) * p.tokens, 256),
                     256, 0, stream, w.scores, p.batch, p.heads, p.tokens, w.mean);
      sel_scores = w.mean;
    }
    const std::int64_t problems = (uni ? p.batch : rows) * p.groups;
    std::int32_t max_slices = 0;
    for (std::int32_t g = 0; g < p.groups; ++g) max_slices = std::max(max_slices, detail::slices_of(p.sizes[g]));
    FAIRKV_CUDA_TRY(cudaMemsetAsync(w.states, 0, static_cast<std::size_t>(problems) * sizeof(detail::split_state), stream));
    const dim3 grid(static_cast<unsigned>(max_slices), static_cast<unsigned>(problems));
    for (int pass = 0; pass < 4; ++pass)
      detail::launch(detail::split_hist_kernel<Sel::kind>, grid, detail::split_threads, 0, stream, p, sel_scores,
                     w.states, w.slice_hist, pass);
    detail::launch(detail::split_mark_kernel<Sel::kind>, grid, detail::split_threads, 0, stream, p, sel_scores,
                   w.states, w.slice_hist, w.keep);
  } else if constexpr (Sel::kind == selection_kind::head_adaptive) {
    detail::launch(detail::select_kernel<selection_kind::head_adaptive>,
                   dim3(static_cast<unsigned>(p.batch), static_cast<unsigned>(p.groups)), detail::select_threads, 0,
                   stream, p, w.scores, w.keep);
  } else {
    static_assert(dependent_false<Sel>, "fairkv::cuda::plan: unknown selection_kind");
  }
  const bool shared_mask = Sel::kind == selection_kind::union_heads;
  const dim3 emit_grid(static_cast<unsigned>((std::int64_t{p.tokens} + detail::emit_chunk - 1) / detail::emit_chunk),
                       static_cast<unsigned>(rows));
  detail::launch(detail::emit_count_kernel<>, emit_grid, detail::emit_threads, 0, stream, w.keep, p.heads, p.tokens,
                 shared_mask, w.chunk_counts);
  detail::launch(detail::emit_write_kernel<>, emit_grid, detail::emit_threads, 0, stream, w.keep, p.heads, p.tokens,
                 shared_mask, w.chunk_counts, out);
  return from_cuda(cudaGetLastError());
}

}  // namespace fairkv::cuda
