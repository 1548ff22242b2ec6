// Attention of a block of query rows over one KV head's keys as a register-blocked matrix product. The
// row-at-a-time path (score.hpp's attention_row) reads every key once per query row: SnapKV's window of 16
// queries x 4 query heads reads a KV head's keys 64 times and runs at matrix-vector speed. Here up to gemm_rows
// query rows share one pass over the keys; the softmax and the accumulation that follow compute the row path's
// statistic (the summation orders differ, and SnapKV sums a group's windows before pooling them: parity within
// float rounding, not bit for bit).
//
// The product is written with packet primitives rather than as an Eigen GEMM. The query block is small
// (64 rows x head_dim) and the keys are long, so the block is transposed once ([head_dim, rows]: a packet holds
// one key's logits for `lanes` consecutive rows) and every key is read straight from the engine's cache and
// broadcast against it: the keys are never packed. An Eigen GEMM packs both operands of every product; at this
// shape that packing cost more than the multiply-adds (perf: gemm_pack_lhs 29 % of SnapKV's samples against
// 15 % in its kernel), and a GEMM over more than 128 keys would allocate its blocking buffer on the heap. The
// logits come out token-major ([tokens, rows]), so each row's max and sum are lane-wise packet operations.
//
// Only float keys and float queries with unit-stride rows take this path; other element types and strides keep
// the row path (they convert element by element anyway).
//
// The tile itself is attention_tile.inc, included here once per ISA: over simd_portable.hpp's packets for the compile
// flags, and on x86-64 also for AVX2 and AVX-512 over simd_x86.hpp's; add_attention_block runs the widest the CPU
// supports (cpu_isa.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "fairkv/cpu/detail/cpu_isa.hpp"
#include "fairkv/cpu/detail/simd_portable.hpp"
#include "fairkv/cpu/detail/simd_x86.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/views/kv_view.hpp"

namespace fairkv::cpu::detail {

// Query rows per pass over the keys. SnapKV's window of 16 queries times a GQA group of 4 query heads is 64 rows:
// one pass reads a KV head's keys once for its whole group (16 rows per pass read them `group` times, which at
// 32k tokens cost more than the baseline's whole plan). The logits of one pass live in the task's scratch
// ([region, gemm_rows] floats), so this also sizes the workspace of the attention scorers.
inline constexpr std::int64_t gemm_rows = 64;

// The longest head the GEMM path takes (longer heads keep the row path): the transposed query block lives in
// the scratch, gemm_rows x gemm_max_head_dim floats.
inline constexpr std::int64_t gemm_max_head_dim = 256;

// Sequences shorter than this take the GEMM path: causal masks compare token offsets as floats, exact below 2^24.
inline constexpr std::int64_t gemm_max_tokens = std::int64_t{1} << 24;

// Keys per chunk of a pass: a chunk's logits ([chunk, gemm_rows] floats, 12 KiB) stay in L1 between their
// product, their max and their exponentials, and each chunk keeps its own max and sum per row (chunks of 256 keys,
// 64 KiB in L2, were about 10 % slower in SnapKV's scoring at 4k tokens). A multiple of every register tile's key
// count, so no chunk ends in a partial tile.
inline constexpr std::int64_t gemm_chunk = 48;

// Floats of scratch one scoring task needs for regions of up to `tokens` tokens: three rows for the row path
// (probabilities, accumulator, pooling) and, for attention scorers, one pass's logits ([tokens, gemm_rows]), its
// query block transposed ([gemm_max_head_dim, gemm_rows]), each row's visible tail and each chunk's max and sum
// per row.
template <class S>
[[nodiscard]] constexpr std::int64_t scratch_floats(std::int64_t tokens) noexcept {
  return is_attention_source(S::source) ? (3 + gemm_rows) * tokens + gemm_rows * gemm_max_head_dim + gemm_rows +
                                              2 * gemm_rows * ((tokens + gemm_chunk - 1) / gemm_chunk)
                                        : 3 * tokens;
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
           in.keys.head_dim <= gemm_max_head_dim && in.keys.tokens < gemm_max_tokens;
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
  // Keys row i attends, counted from rb.
  [[nodiscard]] std::int64_t length(std::int64_t i, std::int64_t rb) const noexcept {
    return last0 + (i % per_head) * step - rb + 1;
  }
};

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // packet types (__m512, ...) as template arguments
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FAIRKV_TILE_INLINE inline __attribute__((always_inline))
#else
#define FAIRKV_TILE_INLINE inline
#endif

// The tile of the compile flags, over simd_portable.hpp's vector-extension packets: the ISA the flags give (SSE2
// on baseline x86-64, NEON on arm64, ...), and the only one where fairkv does not dispatch.
namespace tile {
using namespace portable;
using full = widest;
inline constexpr int registers = vector_registers;
inline constexpr bool fused_madd = contracts_madd;
#include "fairkv/cpu/detail/attention_tile.inc"
}  // namespace tile

#if defined(FAIRKV_ISA_DISPATCH)
// The same tile over simd_x86.hpp's intrinsics for AVX2 and AVX-512, each in its target region, run where the CPU
// has them (cpu_isa.hpp) whatever the flags: hand-written shuffles transpose the sums, where the portable packets go
// through memory. FAIRKV_TILE_AVX2 / FAIRKV_TILE_AVX512 say that this translation unit has them.
#define FAIRKV_TILE_AVX2 1
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX2)
namespace tile_avx2 {
using namespace x86;
using full = __m256;
inline constexpr int registers = 16;
inline constexpr bool fused_madd = true;
#include "fairkv/cpu/detail/attention_tile.inc"
}  // namespace tile_avx2
FAIRKV_TARGET_POP

#define FAIRKV_TILE_AVX512 1
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX512)
namespace tile_avx512 {
using namespace x86;
using full = __m512;
inline constexpr int registers = 32;
inline constexpr bool fused_madd = true;
#include "fairkv/cpu/detail/attention_tile.inc"
}  // namespace tile_avx512
FAIRKV_TARGET_POP
#endif  // FAIRKV_ISA_DISPATCH

#undef FAIRKV_TILE_INLINE

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

// Rows [i0, i0 + rows) of qr (rows <= gemm_rows) in one pass over the keys: each row's causal softmax (scale
// folded into the logits) is added to acc[t] for t < min(acc_n, its own length), by the widest tile the CPU runs
// (active_isa). scratch: scratch_floats's attention part for the block's longest row.
inline void add_attention_block(const kv_view<const float>& keys, std::int64_t b, std::int64_t h,
                                const query_rows& qr, std::int64_t i0, std::int64_t rows, std::int64_t rb,
                                float scale, float* acc, std::int64_t acc_n, float* scratch) {
#if defined(FAIRKV_ISA_DISPATCH)
  switch (active_isa()) {
#if defined(FAIRKV_TILE_AVX512)
    case cpu_isa::avx512: return tile_avx512::add_block(keys, b, h, qr, i0, rows, rb, scale, acc, acc_n, scratch);
#endif
#if defined(FAIRKV_TILE_AVX2)
    case cpu_isa::avx2: return tile_avx2::add_block(keys, b, h, qr, i0, rows, rb, scale, acc, acc_n, scratch);
#endif
    default: break;
  }
#endif
  tile::add_block(keys, b, h, qr, i0, rows, rb, scale, acc, acc_n, scratch);
}

// Every row of qr, gemm_rows at a time: each row's causal softmax (scale folded into the logits) is added to
// acc[t] for t < min(acc_n, its own length). scratch: scratch_floats's attention part for the longest row.
inline void add_attention_rows(const kv_view<const float>& keys, std::int64_t b, std::int64_t h,
                               const query_rows& qr, std::int64_t rb, float scale, float* acc, std::int64_t acc_n,
                               float* scratch) {
  const std::int64_t total = qr.heads * qr.per_head;
  for (std::int64_t i0 = 0; i0 < total; i0 += gemm_rows)
    add_attention_block(keys, b, h, qr, i0, std::min(gemm_rows, total - i0), rb, scale, acc, acc_n, scratch);
}

}  // namespace fairkv::cpu::detail
