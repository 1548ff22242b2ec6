// The planning kernels after scoring: head-mean scores (union), per-(row, group) selection into a keep mask, and
// the stable scan-based gather of the mask into the keep plan.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "fairkv/cuda/detail/page_table_checks.cuh"
#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/select.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/detail/order.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/selector.hpp"

namespace fairkv::cuda::detail {

// Non-template kernels are templates with a defaulted parameter: a plain __global__ function defined in a header
// would be defined once per translation unit and break the link of a program with two .cu files.

// mean [batch, pitch] = sum over heads in head order, then / heads (the CPU's exact expression; a NaN in any
// head propagates). scores [batch * heads, pitch]
template <int = 0>
__global__ void head_mean_kernel(const float* scores, __grid_constant__ const batch_params bp, float* mean) {
  const std::int64_t tokens = bp.pitch, heads = bp.heads;
  const std::int64_t total = static_cast<std::int64_t>(bp.batch) * tokens;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = i / tokens, t = i % tokens;
    if (t >= bp.of(b).tokens) continue;
    float s = 0.f;
    for (std::int32_t h = 0; h < heads; ++h) s += scores[(b * heads + h) * tokens + t];
    mean[i] = s / static_cast<float>(heads);
  }
}

// Paged keys and padded kv_views are planned with the host's copy of each sequence's length (the sequences'
// parameters): the page table or the view's lengths must say the same, or the kernels would read past the
// sequence. A template: see the note above.
template <class Side>
__global__ void check_lengths_kernel(Side s, __grid_constant__ const batch_params bp, device_verdict* st) {
  const std::int64_t tid = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t b = tid; b < s.batch; b += stride) {
    if constexpr (requires { s.indptr; })
      if (s.indptr[b + 1] < s.indptr[b]) continue;  // validate_pages_kernel reports it
    const std::int64_t table = s.tokens_of(b), host = bp.of(b).tokens;
    if (table != host)
      report(st, keys_length_mismatch, static_cast<int>(b), static_cast<int>(host), static_cast<int>(table));
  }
}

// head_adaptive: one block per (sequence, group), because the layer-global choice of a group depends on every
// head's safeguard. Writes keep[b * heads + h, t] for every token t of the group: 1 if whitelisted or selected.
// grid = (batch, bp.groups). scores [batch * heads, pitch], keep [batch * heads, pitch]. (per_head and union use
// select_split.cuh.) A template: see the note at the top of this file.
template <int = 0>
__global__ void __launch_bounds__(select_threads)
    head_adaptive_select_kernel(__grid_constant__ const batch_params bp, const float* __restrict__ scores,
                                std::uint8_t* __restrict__ keep) {
  __shared__ select_smem s;
  const std::int32_t row = blockIdx.x, g = blockIdx.y;
  const plan_params& p = bp.of(row);
  if (g >= p.groups) return;  // the whole block: this sequence has fewer groups
  const std::int64_t L = bp.pitch;  // the row pitch; the group's runs lie inside the sequence
  const std::int32_t H = p.heads;
  const float* sc = scores + static_cast<std::int64_t>(row) * H * L;  // this sequence's [heads, tokens]
  std::uint8_t* kp = keep + static_cast<std::int64_t>(row) * H * L;
  for_each_in_group(p, g, H, [&](std::int32_t t, std::int32_t h) { kp[h * L + t] = is_forced(p, t) ? 1 : 0; });
  __syncthreads();
  // Safeguard: each head first keeps floor(alpha * budget) of its best tokens, whitelisted ones included.
  std::int64_t pool = 0;
  for (std::int32_t h = 0; h < H; ++h) {
    const std::int64_t budget = p.budgets[h * p.groups + g];
    const auto safe = static_cast<std::int64_t>(static_cast<double>(budget) * static_cast<double>(p.alpha));
    const std::int64_t extra = safe - p.forced_per_group[g] > 0 ? safe - p.forced_per_group[g] : 0;
    pool += budget - p.forced_per_group[g] - extra;
    auto bits = [&](std::int32_t t, std::int32_t, std::uint32_t& out) {
      if (is_forced(p, t)) return false;
      out = fairkv::detail::order_bits(sc[h * L + t]);
      return true;
    };
    const threshold th = block_select(s, p, g, 1, extra, bits);
    block_mark(s, p, g, 1, th, bits, [&](std::int32_t t, std::int32_t) { kp[h * L + t] = 1; });
    __syncthreads();
  }
  // The segment's remaining budget, summed over heads, goes to the best (head, token) pairs not kept yet;
  // elements are visited as index t * heads + h, the CPU's tie order (lower token, then lower head).
  auto pair_bits = [&](std::int32_t t, std::int32_t h, std::uint32_t& out) {
    if (kp[h * L + t]) return false;
    out = fairkv::detail::order_bits(sc[h * L + t]);
    return true;
  };
  const threshold th = block_select(s, p, g, H, pool, pair_bits);
  // Each element is tested once, in its own tile, before it is marked: marking in place is safe.
  block_mark(s, p, g, H, th, pair_bits, [&](std::int32_t t, std::int32_t h) { kp[h * L + t] = 1; });
}

// The stable gather, in two launches so that a long row is spread over many blocks:
// emit_count_kernel counts the kept tokens of every chunk of emit_chunk tokens, emit_write_kernel scans its
// chunk (CUB BlockScan) and writes the kept indices in ascending order at the row's offset (the counts of the
// earlier chunks), plus the count and the length. grid = (chunks of the longest row, batch * heads): a row's
// chunks past its sequence's end count nothing. keep [batch * heads or batch (shared_mask), pitch],
// chunk_counts [batch * heads, chunks per row]
template <int = 0>
__global__ void __launch_bounds__(emit_threads)
    emit_count_kernel(const std::uint8_t* __restrict__ keep, __grid_constant__ const batch_params bp, bool shared_mask,
                      std::int32_t* chunk_counts) {
  using reduce_t = cub::BlockReduce<int, emit_threads>;
  __shared__ typename reduce_t::TempStorage tmp;
  const std::int64_t row = blockIdx.y, heads = bp.heads;
  const std::int64_t tokens = bp.of(row / heads).tokens;
  const std::uint8_t* m = keep + (shared_mask ? row / heads : row) * static_cast<std::int64_t>(bp.pitch);
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * emit_chunk + threadIdx.x * emit_items;
  int n = 0;
#pragma unroll
  for (int i = 0; i < emit_items; ++i) n += (base + i < tokens && m[base + i] != 0) ? 1 : 0;
  const int total = reduce_t(tmp).Sum(n);
  if (threadIdx.x == 0) chunk_counts[row * gridDim.x + blockIdx.x] = total;
}

template <int = 0>
__global__ void __launch_bounds__(emit_threads)
    emit_write_kernel(const std::uint8_t* __restrict__ keep, __grid_constant__ const batch_params bp, bool shared_mask,
                      const std::int32_t* __restrict__ chunk_counts, keep_plan_view out) {
  using scan_t = cub::BlockScan<int, emit_threads>;
  __shared__ typename scan_t::TempStorage scan;
  __shared__ int offset;
  const std::int64_t row = blockIdx.y, heads = bp.heads;
  const std::int64_t tokens = bp.of(row / heads).tokens;
  const std::int32_t* cc = chunk_counts + row * gridDim.x;
  if (threadIdx.x == 0) {
    int before = 0;
    for (unsigned c = 0; c < blockIdx.x; ++c) before += cc[c];
    offset = before;
    if (blockIdx.x == gridDim.x - 1) {
      out.counts[row] = before + cc[blockIdx.x];
      if (row % heads == 0) out.lengths[row / heads] = tokens;
    }
  }
  const std::uint8_t* m = keep + (shared_mask ? row / heads : row) * static_cast<std::int64_t>(bp.pitch);
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * emit_chunk + threadIdx.x * emit_items;
  int flag[emit_items], pos[emit_items];
#pragma unroll
  for (int i = 0; i < emit_items; ++i) flag[i] = (base + i < tokens && m[base + i] != 0) ? 1 : 0;
  scan_t(scan).ExclusiveSum(flag, pos);
  __syncthreads();  // `offset` is written by thread 0
  std::int32_t* idx = out.indices + row * out.capacity + offset;
#pragma unroll
  for (int i = 0; i < emit_items; ++i)
    if (flag[i]) idx[pos[i]] = static_cast<std::int32_t>(base + i);
}

}  // namespace fairkv::cuda::detail
