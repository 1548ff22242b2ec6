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

template <class S, class T>
[[nodiscard]] auto key_kernel(bool vec) noexcept {
  return vec ? score_keys_kernel<S, T, true> : score_keys_kernel<S, T, false>;
}

// Plans the key scoring launch and opts the kernel in to the shared memory it needs (a row of head_dim keys
// larger than key_score_smem_bytes is staged alone; not_supported only beyond the device's opt-in limit).
template <class S, class T>
[[nodiscard]] result prepare_key_launch(const kv_view<const T>& k, key_launch& out) noexcept {
  constexpr std::int64_t e = sizeof(T);
  out.per_block = staged_rows(k.head_dim, e);
  out.smem = static_cast<std::size_t>(out.per_block) * 4u * static_cast<std::size_t>(staged_row_words(k.head_dim, e));
  out.vec = k.stride_dim == 1 && (k.head_dim * e) % 16 == 0 && reinterpret_cast<std::uintptr_t>(k.data) % 16 == 0 &&
            (k.stride_token * e) % 16 == 0 && (k.stride_head * e) % 16 == 0 && (k.stride_batch * e) % 16 == 0;
  return reserve_dynamic_smem(key_kernel<S, T>(out.vec), out.smem, 0, "the key scoring kernel");
}

[[nodiscard]] inline unsigned grid_for(std::int64_t n, int threads) noexcept {
  const std::int64_t g = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(g, 1, 65535));
}

template <class S, class T, class Q>
[[nodiscard]] result launch_scores(const S& scorer, const layer_inputs<kv_view<const T>, Q>& in, const plan_params& p,
                                   const attention_params& a, const key_launch& keys, const plan_workspace& w,
                                   cudaStream_t stream) noexcept {
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads;
  if constexpr (S::source == score_source::position) {
    auto positions = [&](const auto& f) {
      return launch(score_position_kernel<std::decay_t<decltype(f)>>, grid_for(rows * p.tokens, elementwise_threads),
                    elementwise_threads, 0, stream, f, p.batch, p.heads, p.tokens, w.scores);
    };
    if constexpr (fairkv::detail::is_streaming_llm_v<S>) {
      if (a.paper) return positions(paper_streaming_position{a.spans.split, std::min<std::int64_t>(scorer.n_sink, p.tokens)});
    }
    return positions(scorer);
  } else if constexpr (S::source == score_source::external) {
    return launch(score_external_kernel<>, grid_for(rows * p.tokens, elementwise_threads), elementwise_threads, 0,
                  stream, in.scores, p.batch, p.heads, p.tokens, w.scores);
  } else if constexpr (S::source == score_source::keys) {
    const dim3 grid(static_cast<unsigned>((std::int64_t{p.tokens} + keys.per_block - 1) / keys.per_block),
                    static_cast<unsigned>(rows));
    return launch(key_kernel<S, T>(keys.vec), grid, key_score_threads, keys.smem, stream, scorer, in.keys,
                  keys.per_block, w.scores);
  } else {
    if (!a.column_sums && a.total_rows > 0)
      FAIRKV_TRY(launch(attention_stats_kernel<T, Q>,
                        dim3(static_cast<unsigned>(a.total_rows), static_cast<unsigned>(a.q_heads),
                             static_cast<unsigned>(p.batch)),
                        attention_threads, 0, stream, a, in, w.stats));
    FAIRKV_TRY(launch(attention_accumulate_kernel<S::source, T, Q>,
                      dim3(static_cast<unsigned>((std::int64_t{p.tokens} + attention_threads - 1) / attention_threads),
                           static_cast<unsigned>(a.q_heads), static_cast<unsigned>(p.batch)),
                      attention_threads, 0, stream, a, in, w.stats, w.acc));
    FAIRKV_TRY(launch(attention_finalize_kernel<S::source>, grid_for(rows * p.tokens, elementwise_threads),
                      elementwise_threads, 0, stream, a, p.batch, p.heads, p.tokens, w.acc, w.scores));
    if constexpr (S::source != score_source::observed_attention) {
      return launch(attention_pad_kernel<>,
                    dim3(static_cast<unsigned>(a.n_regions), static_cast<unsigned>(p.batch),
                         static_cast<unsigned>(a.paper ? p.heads : 1)),
                    attention_threads, 0, stream, a, p.heads, p.tokens, w.scores);
    } else {
      return {};
    }
  }
}

}  // namespace fairkv::cuda::detail
