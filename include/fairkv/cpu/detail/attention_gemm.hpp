// Attention of a block of query rows over one KV head's keys as Eigen GEMMs (issue 17). The row-at-a-time path
// (score.hpp's attention_row) reads every key once per query row: SnapKV's window of 16 queries x 4 query heads
// reads a KV head's keys 64 times and runs at matrix-vector speed. Here up to gemm_rows query rows share one pass
// over the keys, so the same logits are computed at matrix-matrix speed; the softmax and the accumulation that
// follow are those of the row path (same statistic; the summation order within a row differs, and SnapKV sums a
// group's windows before pooling them: parity within float rounding, not bit for bit).
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

// Query rows per pass over the keys. SnapKV's window of 16 queries times a GQA group of 4 query heads is 64 rows:
// one pass reads a KV head's keys once for its whole group (16 rows per pass read them `group` times, which at
// 32k tokens cost more than the baseline's whole plan). The logits of one pass live in the task's scratch
// ([gemm_rows, region] floats), so this also sizes the workspace of the attention scorers.
inline constexpr std::int64_t gemm_rows = 64;

// Keys per GEMM call. Eigen packs the right-hand side of a product into a blocking buffer that it places on the
// stack below EIGEN_STACK_ALLOCATION_LIMIT (128 KiB) and on the heap above it; 128 keys x head_dim 128 floats is
// 64 KiB, so the (noexcept) planner never allocates for head dims up to 256.
inline constexpr std::int64_t gemm_keys = 128;

// The longest head the GEMM path takes (longer heads keep the row path).
inline constexpr std::int64_t gemm_max_head_dim = 256;

// Floats of scratch one scoring task needs for regions of up to `tokens` tokens: three rows for the row path
// (probabilities, accumulator, pooling) and, for attention scorers, one logits block of gemm_rows rows followed
// by the block's query rows gathered into one matrix (gemm_rows x gemm_max_head_dim).
template <class S>
[[nodiscard]] constexpr std::int64_t scratch_floats(std::int64_t tokens) noexcept {
  return is_attention_source(S::source) ? (3 + gemm_rows) * tokens + gemm_rows * gemm_max_head_dim : 3 * tokens;
}

// Whether the element types allow the GEMM path (a compile-time guard around its calls), and whether these
// inputs take it.
template <class KeySource, class Q>
inline constexpr bool gemm_types =
    std::is_same_v<KeySource, kv_view<const float>> && std::is_same_v<std::remove_const_t<Q>, float>;

template <class KeySource, class Q>
[[nodiscard]] bool gemm_attention(const layer_inputs<KeySource, Q>& in) noexcept {
  if constexpr (gemm_types<KeySource, Q>)
    return in.queries.data != nullptr && in.keys.stride_dim == 1 && in.queries.stride_dim == 1 &&
           in.keys.head_dim <= gemm_max_head_dim;
  else
    return false;
}

// The query rows of one scoring call: `heads` runs of `per_head` rows; row j of run g is the query at
// q + g * head_stride + j * row_stride and attends keys [rb, last0 + j * step] (step 1: consecutive positions, a
// window or every query of a region; step 0: one position, seen by several query heads, TOVA's last row).
struct query_rows {
  const float* q;
  std::int64_t head_stride, row_stride, heads, per_head, last0, step;
  // Row i of the flattened [heads, per_head] order.
  [[nodiscard]] const float* row(std::int64_t i) const noexcept {
    return q + (i / per_head) * head_stride + (i % per_head) * row_stride;
  }
};

// Rows [i0, i0 + rows) of qr (rows <= gemm_rows) in one pass over the keys, one GEMM per block of gemm_keys
// keys. Rows of several query heads are first gathered into one matrix, so each key block is packed once for
// every row (Eigen packs both operands of every product: with one GEMM per head, packing the keys cost more than
// the multiply-adds). logits: scratch of rows * (the block's longest row) floats, then gemm_rows * head_dim
// floats for the gathered rows.
inline void add_attention_block(const kv_view<const float>& keys, std::int64_t b, std::int64_t h,
                                const query_rows& qr, std::int64_t i0, std::int64_t rows, std::int64_t rb,
                                float scale, float* acc, std::int64_t acc_n, float* logits) {
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using strided = Eigen::OuterStride<>;
  const std::int64_t d = keys.head_dim;
  const std::int64_t j0 = i0 % qr.per_head;
  const std::int64_t j_last = j0 + rows - 1 >= qr.per_head ? qr.per_head - 1 : j0 + rows - 1;
  const std::int64_t n = qr.last0 + j_last * qr.step - rb + 1;  // columns: keys [rb, rb + n)
  const float* q = qr.row(i0);
  std::int64_t q_stride = qr.row_stride;
  if (j0 + rows > qr.per_head) {  // the block spans several heads
    float* gathered = logits + gemm_rows * n;
    for (std::int64_t r = 0; r < rows; ++r) std::copy(qr.row(i0 + r), qr.row(i0 + r) + d, gathered + r * d);
    q = gathered;
    q_stride = d;
  }
  const Eigen::Map<const row_major, 0, strided> Q(q, rows, d, strided(q_stride));
  for (std::int64_t k0 = 0; k0 < n; k0 += gemm_keys) {
    const std::int64_t kb = std::min(gemm_keys, n - k0);
    const Eigen::Map<const row_major, 0, strided> K(keys.row(b, h, rb + k0), kb, d, strided(keys.stride_token));
    Eigen::Map<row_major, 0, strided>(logits + k0, rows, kb, strided(n)).noalias() = scale * (Q * K.transpose());
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t len = qr.last0 + ((i0 + r) % qr.per_head) * qr.step - rb + 1;
    Eigen::Map<Eigen::ArrayXf> x(logits + r * n, len);
    x = (x - x.maxCoeff()).exp();
    const float inv = 1.f / x.sum();  // normalised while accumulating: one pass fewer than softmax, then add
    Eigen::Map<Eigen::ArrayXf>(acc, std::min(acc_n, len)) += x.head(std::min(acc_n, len)) * inv;
  }
}

// Every row of qr, gemm_rows at a time: each row's causal softmax (scale folded into the logits) is added to
// acc[t] for t < min(acc_n, its own length). logits: scratch of gemm_rows * (last key - rb + 1) floats.
inline void add_attention_rows(const kv_view<const float>& keys, std::int64_t b, std::int64_t h,
                               const query_rows& qr, std::int64_t rb, float scale, float* acc, std::int64_t acc_n,
                               float* logits) {
  const std::int64_t total = qr.heads * qr.per_head;
  for (std::int64_t i0 = 0; i0 < total; i0 += gemm_rows)
    add_attention_block(keys, b, h, qr, i0, std::min(gemm_rows, total - i0), rb, scale, acc, acc_n, logits);
}

}  // namespace fairkv::cpu::detail
