// The planning kernels after scoring: head-mean scores (union), per-(row, group) selection into a keep mask, and
// the stable scan-based gather of the mask into the keep plan.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/select.cuh"
#include "fairkv/detail/order.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/selector.hpp"

namespace fairkv::cuda::detail {

// mean [batch, tokens] = sum over heads in head order, then / heads (the CPU's exact expression; a NaN in any
// head propagates). scores [batch * heads, tokens]
__global__ void head_mean_kernel(const float* scores, std::int32_t batch, std::int32_t heads, std::int32_t tokens,
                                 float* mean) {
  const std::int64_t total = static_cast<std::int64_t>(batch) * tokens;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = i / tokens, t = i % tokens;
    float s = 0.f;
    for (std::int32_t h = 0; h < heads; ++h) s += scores[(b * heads + h) * tokens + t];
    mean[i] = s / static_cast<float>(heads);
  }
}

// One block per (problem row, group). Writes keep[row, t] for every token t of the group: 1 if whitelisted or
// selected. per_head / union: rows = batch * heads / batch, scores [rows, tokens], keep [rows, tokens].
// head_adaptive: rows = batch, scores [batch * heads, tokens], keep [batch * heads, tokens].
template <selection_kind Kind>
__global__ void __launch_bounds__(select_threads)
    select_kernel(const plan_params p, const float* __restrict__ scores, std::uint8_t* __restrict__ keep) {
  __shared__ select_smem s;
  const std::int32_t row = blockIdx.x, g = blockIdx.y;
  const std::int64_t L = p.tokens;
  if constexpr (Kind == selection_kind::per_head || Kind == selection_kind::union_heads) {
    const float* sc = scores + row * L;
    std::uint8_t* kp = keep + row * L;
    const std::int32_t h = Kind == selection_kind::per_head ? row % p.heads : 0;
    for_each_in_group(p, g, 1, [&](std::int32_t t, std::int32_t) { kp[t] = is_forced(p, t) ? 1 : 0; });
    auto bits = [&](std::int32_t t, std::int32_t, std::uint32_t& out) {
      if (is_forced(p, t)) return false;
      out = fairkv::detail::order_bits(sc[t]);
      return true;
    };
    const std::int64_t k = static_cast<std::int64_t>(p.budgets[h * p.groups + g]) - p.forced_n[g];
    const threshold th = block_select(s, p, g, 1, k, bits);
    __syncthreads();  // the forced marks above are written before the selected ones
    block_mark(s, p, g, 1, th, bits, [&](std::int32_t t, std::int32_t) { kp[t] = 1; });
  } else if constexpr (Kind == selection_kind::head_adaptive) {
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
      const std::int64_t extra = safe - p.forced_n[g] > 0 ? safe - p.forced_n[g] : 0;
      pool += budget - p.forced_n[g] - extra;
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
  } else {
    static_assert(fairkv::dependent_false<decltype(Kind)>, "fairkv::cuda: unknown selection_kind");
  }
}

inline constexpr int emit_threads = 256;
inline constexpr int emit_items = 8;

// The stable gather: one block per (batch, head) row scans the keep mask in ascending token order and writes the
// kept indices, the count and the length. keep [batch * heads or batch (shared_mask), tokens]
__global__ void __launch_bounds__(emit_threads)
    emit_kernel(const std::uint8_t* __restrict__ keep, std::int32_t heads, std::int32_t tokens, bool shared_mask,
                keep_plan_view out) {
  using scan_t = cub::BlockScan<int, emit_threads>;
  __shared__ typename scan_t::TempStorage scan;
  const std::int64_t row = blockIdx.x;
  const std::uint8_t* m = keep + (shared_mask ? row / heads : row) * tokens;
  std::int32_t* idx = out.indices + row * out.capacity;
  int carry = 0;
  constexpr int tile = emit_threads * emit_items;
  for (std::int64_t base = 0; base < tokens; base += tile) {
    int flag[emit_items], pos[emit_items];
    for (int i = 0; i < emit_items; ++i) {
      const std::int64_t t = base + threadIdx.x * emit_items + i;
      flag[i] = (t < tokens && m[t] != 0) ? 1 : 0;
    }
    int agg = 0;
    scan_t(scan).ExclusiveSum(flag, pos, agg);
    for (int i = 0; i < emit_items; ++i)
      if (flag[i]) idx[carry + pos[i]] = static_cast<std::int32_t>(base + threadIdx.x * emit_items + i);
    carry += agg;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out.counts[row] = carry;
    if (row % heads == 0) out.lengths[row / heads] = tokens;
  }
}

}  // namespace fairkv::cuda::detail
