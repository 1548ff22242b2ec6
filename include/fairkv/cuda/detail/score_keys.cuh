// Scoring kernels for the scorers that read nothing (position, fair_paper's StreamingLLM ramps), one key row at a
// time (keys, e.g. K-Norm), or the caller's own scores (external).
// The scorer's own operator() runs on the device, so GPU and CPU evaluate the same float expression; its products
// are rounded before their sums (fairkv/rounded_math.hpp), so the scores are bit-identical to the CPU oracle's
// under any -fmad.
#pragma once

#include <cstdint>

#include "fairkv/cuda/detail/launch.cuh"
#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/views/kv_view.hpp"
#include "fairkv/views/score_view.hpp"

namespace fairkv::cuda::detail {

// The scorers that read only the position. Paper: fair_paper's StreamingLLM (detail/paper_spans.hpp), the ramps
// 0.1 .. 0.9 of [sinks, split) and [split, L) and the sinks 1, in the CPU oracle's float expression.
// scores [batch * heads, pitch]
template <class S, bool Paper>
__global__ void score_position_kernel(S scorer, __grid_constant__ const batch_params bp, float* scores) {
  const std::int64_t total = static_cast<std::int64_t>(bp.batch) * bp.heads * bp.pitch;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / bp.pitch, t = i % bp.pitch, b = row / bp.heads;
    const plan_params& p = bp.of(b);
    if (t >= p.tokens) continue;
    if constexpr (Paper) {
      const std::int64_t sinks = scorer.n_sink < p.tokens ? scorer.n_sink : p.tokens;
      scores[i] = fairkv::detail::paper_streaming_score(t, p.tokens, p.spans.split, sinks);
    } else {
      scores[i] = scorer(token_info{t, p.tokens, row % bp.heads, b});
    }
  }
}

// The caller's scores (scorers::external) gathered from their strided view into the planner's dense rows, as they
// are: the CPU oracle copies the same floats, so the plans are bit-identical.
// scores [batch * heads, pitch]. A template for the reason plan_kernels.cuh gives (one definition per program).
template <int = 0>
__global__ void score_external_kernel(score_view in, __grid_constant__ const batch_params bp, float* scores) {
  const std::int64_t total = static_cast<std::int64_t>(bp.batch) * bp.heads * bp.pitch;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / bp.pitch, t = i % bp.pitch, b = row / bp.heads;
    if (t < bp.of(b).tokens) scores[i] = in.at(b, row % bp.heads, t);
  }
}

// Word pitch of one staged key row: one spare 32-bit word so that thread i reading row i hits bank i.
[[nodiscard]] inline constexpr int staged_row_words(std::int64_t head_dim, std::int64_t elem_bytes) noexcept {
  return static_cast<int>((head_dim * elem_bytes + 3) / 4) + 1;
}
// Rows one block stages: as many as key_score_smem_bytes holds (at most one per thread), and at least one: a row
// larger than that budget is staged alone, in the device's opt-in shared memory (launch.cuh).
[[nodiscard]] inline constexpr int staged_rows(std::int64_t head_dim, std::int64_t elem_bytes) noexcept {
  const int r = key_score_smem_bytes / (4 * staged_row_words(head_dim, elem_bytes));
  return r < 1 ? 1 : (r < key_score_threads ? r : key_score_threads);
}

// One block scores `rows_per_block` consecutive tokens of one (batch, head): the rows are staged in shared
// memory with coalesced loads (16-byte vectors when `Vec` is true), then each thread calls the scorer on its
// staged row as a contiguous key_row. Keys: a kv_view or a paged_side (read through its page table).
// grid = (ceil(pitch / rows), batch * heads). scores [batch * heads, pitch]
template <class S, class Keys, bool Vec>
__global__ void __launch_bounds__(key_score_threads)
    score_keys_kernel(S scorer, Keys keys, __grid_constant__ const batch_params bp, std::int32_t rows_per_block,
                      float* scores) {
  using T = typename Keys::value_type;
  std::uint32_t* staged = dynamic_shared<std::uint32_t>();  // [rows_per_block, pitch] 32-bit words
  const std::int64_t row = blockIdx.y;
  const std::int64_t b = row / keys.heads, h = row % keys.heads;
  const std::int64_t L = bp.of(b).tokens;
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * rows_per_block;
  if (t0 >= L || bp.keys_unreadable()) return;  // the whole block: past this sequence's end, or a bad page table
  const std::int64_t n = (L - t0) < rows_per_block ? L - t0 : rows_per_block;
  const int pitch = staged_row_words(keys.head_dim, sizeof(T));
  if constexpr (Vec) {
    // Row bytes are a multiple of 16 and every row is 16-byte aligned (checked by the host).
    const int vecs = static_cast<int>(keys.head_dim * static_cast<std::int64_t>(sizeof(T)) / 16);
    for (std::int64_t i = threadIdx.x; i < n * vecs; i += key_score_threads) {
      const std::int64_t r = i / vecs;
      const int v = static_cast<int>(i % vecs);
      const uint4 x = reinterpret_cast<const uint4*>(keys.row(b, h, t0 + r))[v];
      std::uint32_t* d = staged + r * pitch + 4 * v;
      d[0] = x.x;
      d[1] = x.y;
      d[2] = x.z;
      d[3] = x.w;
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < n * keys.head_dim; i += key_score_threads) {
      const std::int64_t r = i / keys.head_dim, d = i % keys.head_dim;
      reinterpret_cast<T*>(staged + r * pitch)[d] = keys.row(b, h, t0 + r)[d * keys.stride_dim];
    }
  }
  __syncthreads();
  if (threadIdx.x < n) {
    const std::int64_t t = t0 + threadIdx.x;
    const key_row<T, true> k{reinterpret_cast<const T*>(staged + threadIdx.x * pitch), keys.head_dim, 1};
    scores[row * bp.pitch + t] = scorer(k, token_info{t, L, h, b});
  }
}

}  // namespace fairkv::cuda::detail
