// Selection of one (row, group) problem by one thread block, under the library's total order
// (detail/order.hpp): key = order_bits(score) << 32 | ~index.
//
// The index half of the key only breaks ties, and candidates are visited in ascending index order, so the block
// radix-selects the threshold T over the 32-bit score half only (4 passes of 8 bits, MSB first, shared-memory
// histograms) and counts r = how many candidates scoring exactly T are kept. A stable scan then keeps every
// candidate above T and the first r ties in ascending index order: exactly the k largest 64-bit keys.
// The histogram is walked from the kept side when k <= n - k and from the evicted side otherwise (the k-th
// largest is found as the (n-k)-th smallest), so the walk's target is always the smaller side.
#pragma once

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/detail/order.hpp"

namespace fairkv::cuda::detail {


struct select_smem {
  using scan_t = cub::BlockScan<int, select_threads>;
  typename scan_t::TempStorage scan;
  unsigned hist[256];
  // results of the warp that walks the histogram
  unsigned digit, before, bin_count, total;
};

// Threshold of one problem: candidates with bits > T are kept, and the first `ties` with bits == T.
struct threshold {
  std::uint32_t bits = 0;
  std::int32_t ties = 0;
  bool none = true;  // nothing to select (k <= 0)
};

// Visits every element of group g as (t, h): runs in ascending order, `width` heads per token interleaved
// (element e of a run is token begin + e / width, head e % width), strided over the block. For width 1, h = 0.
template <class F>
__device__ void for_each_in_group(const plan_params& p, std::int32_t g, std::int32_t width, F&& f) {
  for (std::int32_t r = 0; r < p.n_runs; ++r) {
    if (p.runs[r].group != g) continue;
    const std::int64_t n = static_cast<std::int64_t>(p.runs[r].end - p.runs[r].begin) * width;
    for (std::int64_t e = threadIdx.x; e < n; e += select_threads)
      f(p.runs[r].begin + static_cast<std::int32_t>(e / width), static_cast<std::int32_t>(e % width));
  }
}

// One warp walks the 256 bins (lane l owns 8 consecutive bins in walking order) to find the bin that holds the
// `target`-th element counted from the top (top = true) or from the bottom.
__device__ inline void walk_histogram(select_smem& s, unsigned target, bool top) {
  const unsigned lane = threadIdx.x & 31u;
  unsigned c[8];
  unsigned sum = 0;
  for (int i = 0; i < 8; ++i) {
    const unsigned pos = lane * 8u + static_cast<unsigned>(i);
    c[i] = s.hist[top ? 255u - pos : pos];
    sum += c[i];
  }
  unsigned incl = sum;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned v = __shfl_up_sync(0xFFFFFFFFu, incl, off);
    if (lane >= static_cast<unsigned>(off)) incl += v;
  }
  const unsigned total = __shfl_sync(0xFFFFFFFFu, incl, 31);
  const unsigned excl = incl - sum;
  // Only the counting call (target 0) writes it: later calls run while other warps may still be reading it.
  if (lane == 0 && target == 0) s.total = total;
  if (target >= 1 && excl < target && incl >= target) {
    unsigned acc = excl;
    for (int i = 0; i < 8; ++i) {
      if (acc + c[i] >= target) {
        const unsigned pos = lane * 8u + static_cast<unsigned>(i);
        s.digit = top ? 255u - pos : pos;
        s.before = acc;
        s.bin_count = c[i];
        break;
      }
      acc += c[i];
    }
  }
}

// k = how many candidates to keep. Bits(t, h, bits&) -> bool: is (t, h) a candidate, and its order bits.
template <class Bits>
__device__ threshold block_select(select_smem& s, const plan_params& p, std::int32_t g, std::int32_t width,
                                  std::int64_t k, Bits&& candidate_bits) {
  threshold out;
  if (k <= 0) return out;
  out.none = false;
  std::uint32_t prefix = 0;
  unsigned target = 0;
  bool top = true;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int i = threadIdx.x; i < 256; i += select_threads) s.hist[i] = 0;
    __syncthreads();
    const std::uint32_t high_mask = pass == 0 ? 0u : ~((1u << (shift + 8)) - 1u);
    for_each_in_group(p, g, width, [&](std::int32_t t, std::int32_t h) {
      std::uint32_t bits;
      if (candidate_bits(t, h, bits) && (bits & high_mask) == (prefix & high_mask)) {
        // Warp-aggregated: scores often share their top bytes, and same-bin shared atomics serialise.
        const unsigned bin = (bits >> shift) & 255u;
        const auto same = cooperative_groups::labeled_partition(cooperative_groups::coalesced_threads(), bin);
        if (same.thread_rank() == 0) atomicAdd(&s.hist[bin], same.size());
      }
    });
    __syncthreads();
    if (pass == 0) {
      // Direction and trivial cases need the candidate count, which the first histogram gives.
      if (threadIdx.x < 32) walk_histogram(s, 0u, true);
      __syncthreads();
      const unsigned n = s.total;
      if (k >= static_cast<std::int64_t>(n)) {  // every candidate is kept
        out.bits = 0;
        out.ties = 0x7FFFFFFF;
        __syncthreads();
        return out;
      }
      top = k <= static_cast<std::int64_t>(n) - k;
      target = top ? static_cast<unsigned>(k) : n - static_cast<unsigned>(k);
    }
    if (threadIdx.x < 32) walk_histogram(s, target, top);
    __syncthreads();
    prefix |= s.digit << shift;
    target -= s.before;
    const unsigned bin_count = s.bin_count;
    __syncthreads();
    if (pass == 3) {
      out.bits = prefix;
      // top: `target` of the ties are kept; bottom: `target` of the ties are evicted (the highest indices).
      out.ties = static_cast<std::int32_t>(top ? target : bin_count - target);
    }
  }
  return out;
}

// Marks the selected candidates: everything above the threshold and the first `ties` ties in element order.
// Every thread of the block must call it (it scans). Mark(t, h) is called once per kept candidate.
template <class Bits, class Mark>
__device__ void block_mark(select_smem& s, const plan_params& p, std::int32_t g, std::int32_t width,
                           const threshold& th, Bits&& candidate_bits, Mark&& mark) {
  if (th.none) return;
  int carry = 0;
  for (std::int32_t r = 0; r < p.n_runs; ++r) {
    if (p.runs[r].group != g) continue;
    const std::int64_t n = static_cast<std::int64_t>(p.runs[r].end - p.runs[r].begin) * width;
    for (std::int64_t base = 0; base < n; base += select_threads) {
      const std::int64_t e = base + threadIdx.x;
      std::int32_t t = 0, h = 0;
      std::uint32_t bits = 0;
      bool cand = false;
      if (e < n) {
        t = p.runs[r].begin + static_cast<std::int32_t>(e / width);
        h = static_cast<std::int32_t>(e % width);
        cand = candidate_bits(t, h, bits);
      }
      const int tie = (cand && bits == th.bits) ? 1 : 0;
      int rank = 0, agg = 0;
      select_smem::scan_t(s.scan).ExclusiveSum(tie, rank, agg);
      if (cand && (bits > th.bits || (tie && carry + rank < th.ties))) mark(t, h);
      carry += agg;
      __syncthreads();  // the scan storage is reused by the next tile
    }
  }
}

}  // namespace fairkv::cuda::detail
