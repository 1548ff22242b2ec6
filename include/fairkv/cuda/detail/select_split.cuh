// Multi-block selection for per_head and union problems (one problem = one (row, group) budget), so that a long
// sequence is selected by many SMs rather than one block per head:
//   * a group's tokens (its runs, in ascending order) are cut into slices of `split_slice` tokens; slice s of
//     problem P is one block;
//   * split_hist_kernel(pass) x 4: every block builds the 256-bin histogram of its slice's candidates whose
//     higher bits match the problem's prefix (warp-aggregated shared atomics: K-Norm scores share their top
//     bytes, so plain atomics would serialise), adds it to the problem's global histogram, and the LAST block to
//     arrive (threadfence reduction) walks it (detail/select.cuh: walk_histogram, from the smaller side) and
//     advances the problem's prefix. The last pass also keeps every slice's own histogram;
//   * split_mark_kernel: a block keeps its candidates above the threshold and the ties whose rank among the
//     problem's ties (ties in earlier slices, read from their last-pass histograms, plus a block scan) is below
//     the number of ties to keep. Ties are therefore kept in ascending token order, as the 64-bit key demands.
// The state lives in the plan's workspace and is zeroed by cudaMemsetAsync at the start of each plan.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/select.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/detail/order.hpp"
#include "fairkv/selector.hpp"

namespace fairkv::cuda::detail {


enum split_mode : int { split_radix = 0, split_keep_none = 1, split_keep_all = 2 };

struct split_state {
  unsigned hist[256];  // the current pass's histogram over all slices (zeroed again by the deciding block)
  unsigned prefix;     // order bits fixed so far
  unsigned target;     // rank still to find inside the prefix, counted from the walking side
  unsigned bin_count;  // candidates in the last chosen bin
  int mode;            // split_mode
  int top;             // walking from the kept side
  unsigned arrived;    // blocks done with the current pass
};

[[nodiscard]] __host__ __device__ inline std::int32_t slices_of(std::int32_t size) noexcept {
  return (size + split_slice - 1) / split_slice;
}

// Visits the tokens [e0, e1) of group g's concatenated runs (virtual positions) as whole-block tiles: every
// thread runs the same number of iterations (so warp-wide intrinsics and block scans are safe); `f(t, valid)`.
template <class F>
__device__ void for_slice_tiles(const plan_params& p, std::int32_t g, std::int32_t e0, std::int32_t e1, F&& f) {
  // Cursor over the group's runs: run r starts at virtual position base.
  std::int32_t r = 0, base = 0;
  while (p.runs[r].group != g) ++r;
  for (std::int32_t tile = e0; tile < e1; tile += split_threads) {
    const std::int32_t e = tile + static_cast<std::int32_t>(threadIdx.x);
    const bool valid = e < e1;
    std::int32_t t = 0;
    if (valid) {
      while (e >= base + (p.runs[r].end - p.runs[r].begin)) {
        base += p.runs[r].end - p.runs[r].begin;
        do ++r; while (p.runs[r].group != g);
      }
      t = p.runs[r].begin + (e - base);
    }
    f(t, valid);
  }
}

// Problem = selection row x bp.groups + group; a sequence with fewer groups leaves its last problems idle.
template <selection_kind Kind>
struct split_problem {
  std::int32_t row, g, h;  // score/keep row, group, head whose budget applies
  const plan_params& p;    // the row's sequence
  __device__ split_problem(const batch_params& bp, std::int32_t problem)
      : row(problem / bp.groups),
        g(problem % bp.groups),
        h(Kind == selection_kind::per_head ? row % bp.heads : 0),
        p(bp.of(Kind == selection_kind::per_head ? row / bp.heads : row)) {}
  [[nodiscard]] __device__ std::int64_t k() const {
    return static_cast<std::int64_t>(p.budgets[h * p.groups + g]) - p.forced_per_group[g];
  }
};

// grid = (max slices of a group, problems). slice_hist [rows, bp.slices, 256]
template <selection_kind Kind>
__global__ void __launch_bounds__(split_threads)
    split_hist_kernel(__grid_constant__ const batch_params bp, const float* __restrict__ scores, split_state* states,
                      unsigned* slice_hist, int pass) {
  __shared__ unsigned hist[256];
  __shared__ bool last;
  __shared__ select_smem walk;  // only hist/digit/before/bin_count/total are used here
  const split_problem<Kind> pr(bp, static_cast<std::int32_t>(blockIdx.y));
  const plan_params& p = pr.p;
  if (pr.g >= p.groups) return;
  const std::int32_t s = blockIdx.x, size = p.sizes[pr.g];
  if (s >= slices_of(size)) return;
  split_state& st = states[blockIdx.y];
  if (*static_cast<volatile int*>(&st.mode) != split_radix) return;  // decided in an earlier pass
  for (int i = threadIdx.x; i < 256; i += split_threads) hist[i] = 0;
  __syncthreads();
  const int shift = 24 - 8 * pass;
  const unsigned high_mask = pass == 0 ? 0u : ~((1u << (shift + 8)) - 1u);
  const unsigned prefix = *static_cast<volatile unsigned*>(&st.prefix);
  const float* sc = scores + static_cast<std::int64_t>(pr.row) * bp.pitch;
  const std::int32_t e0 = s * split_slice, e1 = e0 + split_slice < size ? e0 + split_slice : size;
  for_slice_tiles(p, pr.g, e0, e1, [&](std::int32_t t, bool valid) {
    unsigned bin = 0xFFFFFFFFu;
    if (valid && !is_forced(p, t)) {
      const unsigned bits = fairkv::detail::order_bits(sc[t]);
      if ((bits & high_mask) == (prefix & high_mask)) bin = (bits >> shift) & 255u;
    }
    const unsigned same = __match_any_sync(0xFFFFFFFFu, bin);
    if (bin != 0xFFFFFFFFu && (threadIdx.x & 31u) == static_cast<unsigned>(__ffs(same) - 1))
      atomicAdd(&hist[bin], static_cast<unsigned>(__popc(same)));
  });
  __syncthreads();
  unsigned* mine = slice_hist + (static_cast<std::int64_t>(pr.row) * bp.slices + p.slice_begin[pr.g] + s) * 256;
  for (int i = threadIdx.x; i < 256; i += split_threads) {
    if (hist[i] != 0) atomicAdd(&st.hist[i], hist[i]);
    if (pass == 3) mine[i] = hist[i];
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&st.arrived, 1u) == static_cast<unsigned>(slices_of(size) - 1);
  __syncthreads();
  if (!last) return;
  // The deciding block: every other slice's histogram is in st.hist.
  __threadfence();
  for (int i = threadIdx.x; i < 256; i += split_threads) {
    walk.hist[i] = __ldcg(&st.hist[i]);
    st.hist[i] = 0;  // ready for the next pass
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    unsigned target = st.target;
    bool top = st.top != 0;
    int mode = split_radix;
    if (pass == 0) {
      walk_histogram(walk, 0u, true);
      __syncwarp();
      const unsigned n = walk.total;
      const std::int64_t k = pr.k();
      if (k <= 0) mode = split_keep_none;
      else if (k >= static_cast<std::int64_t>(n)) mode = split_keep_all;
      top = k <= static_cast<std::int64_t>(n) - k;
      target = top ? static_cast<unsigned>(k) : n - static_cast<unsigned>(k);
    }
    if (mode == split_radix) {
      walk_histogram(walk, target, top);
      __syncwarp();
      if (threadIdx.x == 0) {
        st.prefix = prefix | (walk.digit << shift);
        st.target = target - walk.before;
        st.bin_count = walk.bin_count;
        st.top = top ? 1 : 0;
      }
    }
    if (threadIdx.x == 0) {
      st.mode = mode;
      st.arrived = 0;
    }
  }
}

// grid = (max slices of a group, problems). keep [rows, tokens]: 1 for whitelisted or selected tokens, else 0.
template <selection_kind Kind>
__global__ void __launch_bounds__(split_threads)
    split_mark_kernel(__grid_constant__ const batch_params bp, const float* __restrict__ scores,
                      const split_state* states, const unsigned* slice_hist, std::uint8_t* keep) {
  using scan_t = cub::BlockScan<int, split_threads>;
  __shared__ typename scan_t::TempStorage scan;
  const split_problem<Kind> pr(bp, static_cast<std::int32_t>(blockIdx.y));
  const plan_params& p = pr.p;
  if (pr.g >= p.groups) return;
  const std::int32_t s = blockIdx.x, size = p.sizes[pr.g];
  if (s >= slices_of(size)) return;
  const split_state& st = states[blockIdx.y];
  const int mode = st.mode;
  const unsigned T = st.prefix;
  const std::int64_t ties = st.top ? static_cast<std::int64_t>(st.target)
                                   : static_cast<std::int64_t>(st.bin_count) - st.target;
  // Ties in the earlier slices of this problem (their last-pass histograms count exactly the bits == T).
  std::int64_t carry = 0;
  if (mode == split_radix) {
    const unsigned* h0 = slice_hist + (static_cast<std::int64_t>(pr.row) * bp.slices + p.slice_begin[pr.g]) * 256;
    for (std::int32_t q = 0; q < s; ++q) carry += h0[q * 256 + (T & 255u)];
  }
  const float* sc = scores + static_cast<std::int64_t>(pr.row) * bp.pitch;
  std::uint8_t* kp = keep + static_cast<std::int64_t>(pr.row) * bp.pitch;
  const std::int32_t e0 = s * split_slice, e1 = e0 + split_slice < size ? e0 + split_slice : size;
  for_slice_tiles(p, pr.g, e0, e1, [&](std::int32_t t, bool valid) {
    const bool forced = valid && is_forced(p, t);
    const unsigned bits = valid ? fairkv::detail::order_bits(sc[t]) : 0u;
    const int tie = (valid && !forced && mode == split_radix && bits == T) ? 1 : 0;
    int rank = 0, agg = 0;
    scan_t(scan).ExclusiveSum(tie, rank, agg);
    if (valid) {
      bool k = forced || mode == split_keep_all;
      if (!k && mode == split_radix) k = bits > T || (tie && carry + rank < ties);
      kp[t] = k ? 1 : 0;
    }
    carry += agg;
    __syncthreads();
  });
}

}  // namespace fairkv::cuda::detail
