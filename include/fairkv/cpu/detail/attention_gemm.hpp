// Attention of a block of query rows over one KV head's keys as Eigen GEMMs (issue 17). The row-at-a-time path
// (score.hpp's attention_row) reads every key once per query row: SnapKV's window of 16 queries x 4 query heads
// reads a KV head's keys 64 times and runs at matrix-vector speed. Here up to gemm_rows query rows share one pass
// over the keys, so the same logits are computed at matrix-matrix speed; the softmax and the accumulation that
// follow are those of the row path (same statistic, summation order within a row aside: parity within float
// rounding, not bit for bit).
//
// Only float keys and float queries with unit-stride rows take this path; other element types and strides keep
// the row path (they convert element by element anyway).
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fairkv/layer_inputs.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/views/kv_view.hpp"

namespace fairkv::cpu::detail {

// Query rows per GEMM: the paper's SnapKV window. The logits of one block live in the task's scratch
// ([gemm_rows, region] floats), so this also sizes the workspace of the attention scorers.
inline constexpr std::int64_t gemm_rows = 16;

// Keys per GEMM call. Eigen packs the right-hand side of a product into a blocking buffer that it places on the
// stack below EIGEN_STACK_ALLOCATION_LIMIT (128 KiB) and on the heap above it; 128 keys x head_dim 128 floats is
// 64 KiB, so the (noexcept) planner never allocates for head dims up to 256.
inline constexpr std::int64_t gemm_keys = 128;

// Floats of scratch per token of the longest sequence that one scoring task needs: three rows for the row path
// (probabilities, accumulator, pooling) and, for attention scorers, one logits block.
template <class S>
inline constexpr std::int64_t scratch_per_token = 3 + (is_attention_source(S::source) ? gemm_rows : 0);

// Whether the element types allow the GEMM path (a compile-time guard around its calls), and whether these
// inputs take it.
template <class KeySource, class Q>
inline constexpr bool gemm_types =
    std::is_same_v<KeySource, kv_view<const float>> && std::is_same_v<std::remove_const_t<Q>, float>;

template <class KeySource, class Q>
[[nodiscard]] bool gemm_attention(const layer_inputs<KeySource, Q>& in) noexcept {
  if constexpr (gemm_types<KeySource, Q>)
    return in.queries.data != nullptr && in.keys.stride_dim == 1 && in.queries.stride_dim == 1 &&
           in.keys.head_dim <= 256;
  else
    return false;
}

// One block of at most gemm_rows query rows: row r at q[r * q_stride] attends keys [rb, last0 + r * step].
// logits: scratch of rows * (last key - rb + 1) floats.
inline void add_attention_block(const kv_view<const float>& keys, std::int64_t b, std::int64_t h, const float* q,
                                std::int64_t q_stride, std::int64_t rows, std::int64_t rb, std::int64_t last0,
                                std::int64_t step, float scale, float* acc, std::int64_t acc_n, float* logits) {
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using strided = Eigen::OuterStride<>;
  const std::int64_t d = keys.head_dim;
  const std::int64_t n = last0 + (rows - 1) * step - rb + 1;  // columns: keys [rb, rb + n)
  const Eigen::Map<const row_major, 0, strided> Q(q, rows, d, strided(q_stride));
  for (std::int64_t k0 = 0; k0 < n; k0 += gemm_keys) {
    const std::int64_t kb = std::min(gemm_keys, n - k0);
    const Eigen::Map<const row_major, 0, strided> K(keys.row(b, h, rb + k0), kb, d, strided(keys.stride_token));
    Eigen::Map<row_major, 0, strided>(logits + k0, rows, kb, strided(n)).noalias() = scale * (Q * K.transpose());
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t len = last0 + r * step - rb + 1;
    Eigen::Map<Eigen::ArrayXf> x(logits + r * n, len);
    x = (x - x.maxCoeff()).exp();
    const float inv = 1.f / x.sum();  // normalised while accumulating: one pass fewer than softmax, then add
    Eigen::Map<Eigen::ArrayXf>(acc, std::min(acc_n, len)) += x.head(std::min(acc_n, len)) * inv;
  }
}

// Query rows r = 0..rows-1 at q[r * q_stride], row r attending keys [rb, last0 + r * step] (step 1: consecutive
// positions, a window; step 0: one position seen by several query heads, TOVA's last row), gemm_rows at a time.
// Each row's causal softmax (scale folded into the logits) is added to acc[t] for t < min(acc_n, its own length).
// logits: scratch of gemm_rows * (last key - rb + 1) floats.
inline void add_attention_rows(const kv_view<const float>& keys, std::int64_t b, std::int64_t h, const float* q,
                               std::int64_t q_stride, std::int64_t rows, std::int64_t rb, std::int64_t last0,
                               std::int64_t step, float scale, float* acc, std::int64_t acc_n, float* logits) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += gemm_rows)
    add_attention_block(keys, b, h, q + r0 * q_stride, q_stride, std::min(gemm_rows, rows - r0), rb,
                        last0 + r0 * step, step, scale, acc, acc_n, logits);
}

}  // namespace fairkv::cpu::detail
