// The CUDA planner's scoring launches, per score source: position scores, the caller's scores (external), key rows staged in shared memory
// (opting in to more than 48 KiB for rows that need it), or the attention pipeline (statistics, accumulation,
// finalisation, padding). Each launch is checked as it is made (launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "fairkv/cuda/detail/launch.cuh"
#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/plan_workspace.cuh"
#include "fairkv/cuda/detail/score_attention.cuh"
#include "fairkv/cuda/detail/score_keys.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/cuda/error.cuh"
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cuda::detail {

// How the key scoring kernel is launched for one key view, decided once per planner::initialize.
struct key_launch {
  std::int32_t per_block = 1;  // key rows staged per block
  std::size_t smem = 0;        // dynamic shared memory of a block
  bool vec = false;            // 16-byte staging loads (contiguous, aligned rows)
};

template <class S, class Keys>
[[nodiscard]] auto key_kernel(bool vec) noexcept {
  return vec ? score_keys_kernel<S, Keys, true> : score_keys_kernel<S, Keys, false>;
}

// Whether every key row is 16-byte aligned and a whole number of 16-byte vectors (one stride check per level).
template <class T>
[[nodiscard]] bool vector_key_rows(const kv_view<const T>& k) noexcept {
  constexpr std::int64_t e = sizeof(T);
  return k.stride_dim == 1 && (k.head_dim * e) % 16 == 0 && reinterpret_cast<std::uintptr_t>(k.data) % 16 == 0 &&
         (k.stride_token * e) % 16 == 0 && (k.stride_head * e) % 16 == 0 && (k.stride_batch * e) % 16 == 0;
}
template <class T>
[[nodiscard]] bool vector_key_rows(const paged_side<const T>& k) noexcept {
  constexpr std::int64_t e = sizeof(T);
  return k.stride_dim == 1 && (k.head_dim * e) % 16 == 0 && reinterpret_cast<std::uintptr_t>(k.data) % 16 == 0 &&
         (k.stride_page * e) % 16 == 0 && (k.stride_slot * e) % 16 == 0 && (k.stride_head * e) % 16 == 0;
}

// Plans the key scoring launch and opts the kernel in to the shared memory it needs (a row of head_dim keys
// larger than key_score_smem_bytes is staged alone; not_supported only beyond the device's opt-in limit).
template <class S, class Keys>
[[nodiscard]] result prepare_key_launch(const Keys& k, key_launch& out) noexcept {
  constexpr std::int64_t e = sizeof(typename Keys::value_type);
  out.per_block = staged_rows(k.head_dim, e);
  out.smem = static_cast<std::size_t>(out.per_block) * 4u * static_cast<std::size_t>(staged_row_words(k.head_dim, e));
  out.vec = vector_key_rows(k);
  return reserve_dynamic_smem(key_kernel<S, Keys>(out.vec), out.smem, 0, "the key scoring kernel");
}

[[nodiscard]] inline unsigned grid_for(std::int64_t n, int threads) noexcept {
  const std::int64_t g = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(g, 1, 65535));
}

template <class S, class A, class Keys, class Q>
[[nodiscard]] result launch_scores(const S& scorer, const layer_inputs<Keys, Q>& in, const batch_params& bp,
                                   const key_launch& keys, const plan_workspace& w, cudaStream_t stream) noexcept {
  const std::int64_t rows = static_cast<std::int64_t>(bp.batch) * bp.heads;
  const unsigned elementwise = grid_for(rows * bp.pitch, elementwise_threads);
  constexpr bool paper = fairkv::detail::is_paper_allocator_v<A>;
  if constexpr (S::source == score_source::position) {
    constexpr bool paper_ramps = paper && fairkv::detail::is_streaming_llm_v<S>;
    return launch(score_position_kernel<S, paper_ramps>, elementwise, elementwise_threads, 0, stream, scorer, bp,
                  w.scores);
  } else if constexpr (S::source == score_source::external) {
    return launch(score_external_kernel<>, elementwise, elementwise_threads, 0, stream, in.scores, bp, w.scores);
  } else if constexpr (S::source == score_source::keys) {
    const dim3 grid(static_cast<unsigned>((std::int64_t{bp.pitch} + keys.per_block - 1) / keys.per_block),
                    static_cast<unsigned>(rows));
    return launch(key_kernel<S, Keys>(keys.vec), grid, key_score_threads, keys.smem, stream, scorer, in.keys, bp,
                  keys.per_block, w.scores);
  } else {
    const auto qh = static_cast<unsigned>(bp.q_heads), batch = static_cast<unsigned>(bp.batch);
    const bool column_sums = in.queries.data == nullptr && in.attention == nullptr;
    if (!column_sums && bp.stats_rows > 0)
      FAIRKV_TRY(launch(attention_stats_kernel<Keys, Q>, dim3(static_cast<unsigned>(bp.stats_rows), qh, batch),
                        attention_threads, 0, stream, bp, in, w.stats));
    FAIRKV_TRY(launch(attention_accumulate_kernel<S::source, Keys, Q>,
                      dim3(static_cast<unsigned>((std::int64_t{bp.pitch} + attention_threads - 1) / attention_threads),
                           qh, batch),
                      attention_threads, 0, stream, bp, in, w.stats, w.acc));
    FAIRKV_TRY(launch(attention_finalize_kernel<S::source>, elementwise, elementwise_threads, 0, stream, bp, w.acc,
                      w.scores));
    if constexpr (S::source != score_source::observed_attention) {
      return launch(attention_pad_kernel<>,
                    dim3(static_cast<unsigned>(bp.regions), batch, static_cast<unsigned>(paper ? bp.heads : 1)),
                    attention_threads, 0, stream, bp, w.scores);
    } else {
      return {};
    }
  }
}

}  // namespace fairkv::cuda::detail
