// Attention scorers (SnapKV window, TOVA last row, H2O observed) on the device, one scoring region at a time
// (the whole sequence, or each maximal run of one group when the allocator is segment-local), with the CPU's
// formulas (cpu/score.hpp) in the same order of operations where the order is a plain sum:
//   1. stats:      for every query row p the region needs: the softmax max and 1 / sum over keys [rb, p]
//                  (from the window's queries), or 1 / sum of the engine's row restricted to the region;
//   2. accumulate: acc[b, qh, t] = sum over the region's rows p (ascending) of the probability of key t;
//   3. finalize:   mean over the window and avg-pool (SnapKV), mean over query heads (TOVA), division by the
//                  number of causal queries (H2O), GQA mean;
//   4. pad:        window tokens / TOVA's anchor score (max over the region's scored tokens of every head) + 1.
// The paper's two-span mode (fair_paper, cpu/score_paper.hpp) uses the same kernels with `attention_params::paper`:
// every row's softmax spans keys [0, p] (slices of the full causal softmax, never re-normalised), a window or
// anchor token gets its own head's maximum over the region's scored tokens (no + 1), a span without a window
// scores 0, and H2O's queries of the later original span do not vote for keys of the earlier original span.
// Never an L x L matrix: the scratch is O(query rows + q_heads * tokens). Dot products and exp differ from the
// CPU's Eigen/libm in the last bits, so attention scores match the oracle to ~1e-6 relative, not bitwise.
#pragma once

#include <cub/block/block_reduce.cuh>

#include <cmath>
#include <cstdint>

#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/detail/order.hpp"
#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/detail/search.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/scorer.hpp"

namespace fairkv::cuda::detail {

// fair_paper's H2O: is key t in the earlier original span, whose votes from the later original span are dropped?
[[nodiscard]] __device__ inline bool paper_cut_key(const plan_params& p, std::int64_t t) {
  return p.paper && t >= p.spans.earlier_begin && t < p.spans.split;
}

// The regions tile [0, tokens) by their begins and the stats buffer by their row offsets, both ascending.
[[nodiscard]] __device__ inline const attention_region& region_of_token(const attention_params& a, std::int32_t t) {
  return a.regions[fairkv::detail::last_at_most(a.regions, a.n_regions, &attention_region::begin, t)];
}

[[nodiscard]] __device__ inline const attention_region& region_of_row(const attention_params& a, std::int32_t r) {
  return a.regions[fairkv::detail::last_at_most(a.regions, a.n_regions, &attention_region::row_offset, r)];
}

template <class T, class Q>
[[nodiscard]] __device__ inline float scaled_dot(const kv_view<const Q>& queries, std::int64_t b, std::int64_t qh,
                                                 std::int64_t qi, const T* k, std::int64_t ks, std::int64_t d,
                                                 float scale) {
  const Q* q = queries.row(b, qh, qi);
  float acc = 0.f;
  for (std::int64_t i = 0; i < d; ++i) acc += to_float(q[i * queries.stride_dim]) * to_float(k[i * ks]);
  return scale * acc;
}


struct row_stat {
  float max, inv;  // softmax max (queries) and 1 / sum
};

// grid = (bp.stats_rows, q_heads, batch). stats [batch, q_heads, bp.stats_rows]
template <class Keys, class Q>
__global__ void __launch_bounds__(attention_threads)
    attention_stats_kernel(__grid_constant__ const batch_params bp, layer_inputs<Keys, Q> in, row_stat* stats) {
  using reduce_t = cub::BlockReduce<float, attention_threads>;
  __shared__ typename reduce_t::TempStorage tmp;
  __shared__ float shared_max;
  const std::int32_t r = blockIdx.x, qh = blockIdx.y, b = blockIdx.z;
  const attention_params& a = bp.attention_of(b);
  if (r >= a.total_rows || bp.keys_unreadable()) return;  // the whole block: fewer rows here, or a bad page table
  const attention_region& reg = region_of_row(a, r);
  const std::int64_t p = reg.row_begin + (r - reg.row_offset);
  const std::int64_t L = bp.of(b).tokens;
  const std::int64_t kvh = qh / a.group;
  const std::int64_t k0 = bp.of(b).paper ? 0 : reg.begin;  // the softmax's first key
  row_stat st{0.f, 1.f};
  if (a.from_queries) {
    const std::int64_t qi = p - (L - in.queries.tokens);
    float m = -INFINITY;
    for (std::int64_t t = k0 + threadIdx.x; t <= p; t += attention_threads)
      m = fmaxf(m, scaled_dot(in.queries, b, qh, qi, in.keys.row(b, kvh, t), in.keys.stride_dim, in.keys.head_dim,
                              a.scale));
    const float bm = reduce_t(tmp).Reduce(m, [](float x, float y) { return fmaxf(x, y); });
    if (threadIdx.x == 0) shared_max = bm;
    __syncthreads();
    const float mx = shared_max;
    float s = 0.f;
    for (std::int64_t t = k0 + threadIdx.x; t <= p; t += attention_threads)
      s += expf(scaled_dot(in.queries, b, qh, qi, in.keys.row(b, kvh, t), in.keys.stride_dim, in.keys.head_dim,
                           a.scale) - mx);
    const float sum = reduce_t(tmp).Sum(s);
    st = {mx, 1.f / sum};
  } else {
    const std::int64_t ld = in.attention_ld != 0 ? in.attention_ld : bp.pitch;
    const float* row = in.attention + ((b * a.q_heads + qh) * in.attention_rows + (p - (L - in.attention_rows))) * ld;
    float s = 0.f;
    for (std::int64_t t = k0 + threadIdx.x; t <= p; t += attention_threads) s += row[t];
    const float sum = reduce_t(tmp).Sum(s);
    st = {0.f, k0 == 0 ? 1.f : 1.f / sum};  // the full row is already normalised
  }
  if (threadIdx.x == 0) stats[(static_cast<std::int64_t>(b) * a.q_heads + qh) * bp.stats_rows + r] = st;
}

// grid = (ceil(pitch / threads), q_heads, batch). acc [batch, q_heads, pitch]
template <score_source Source, class Keys, class Q>
__global__ void __launch_bounds__(attention_threads)
    attention_accumulate_kernel(__grid_constant__ const batch_params bp, layer_inputs<Keys, Q> in,
                                const row_stat* stats, float* acc) {
  using T = typename Keys::value_type;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * attention_threads + threadIdx.x;
  const std::int32_t qh = blockIdx.y, b = blockIdx.z;
  const plan_params& pp = bp.of(b);
  const attention_params& a = bp.attention_of(b);
  const std::int64_t L = pp.tokens;
  if (t >= L || bp.keys_unreadable()) return;
  const attention_region& reg = region_of_token(a, static_cast<std::int32_t>(t));
  float sum = 0.f;
  if (t - reg.begin < reg.scored) {
    if (a.column_sums) {
      const std::int64_t ldc = in.attention_ld != 0 ? in.attention_ld : bp.pitch;
      const float* sums = a.local_sums ? in.attention_local_column_sums : in.attention_column_sums;
      sum = sums[(static_cast<std::int64_t>(b) * a.q_heads + qh) * ldc + t];
    } else {
      const std::int64_t kvh = qh / a.group;
      const T* k = in.keys.row(b, kvh, t);
      const row_stat* st = stats + (static_cast<std::int64_t>(b) * a.q_heads + qh) * bp.stats_rows + reg.row_offset;
      const std::int64_t ld = in.attention_ld != 0 ? in.attention_ld : bp.pitch;
      const bool cut = Source == score_source::observed_attention && paper_cut_key(pp, t);
      for (std::int32_t i = 0; i < reg.rows; ++i) {
        const std::int64_t p = reg.row_begin + i;
        if (p < t) continue;  // causal: only queries at or after the key see it (H2O's rows start at the region)
        if (cut && p >= pp.spans.split && p < pp.spans.later_end) continue;  // fair_paper: a later-span query
        float prob;
        if (a.from_queries) {
          const float l = scaled_dot(in.queries, b, qh, p - (L - in.queries.tokens), k, in.keys.stride_dim,
                                     in.keys.head_dim, a.scale);
          prob = expf(l - st[i].max) * st[i].inv;
        } else {
          prob = in.attention[((static_cast<std::int64_t>(b) * a.q_heads + qh) * in.attention_rows +
                               (p - (L - in.attention_rows))) * ld + t] * st[i].inv;
        }
        sum += prob;
      }
    }
  }
  acc[(static_cast<std::int64_t>(b) * a.q_heads + qh) * bp.pitch + t] = sum;
}

// scores [batch * heads, pitch] for the scored tokens of every region. acc [batch, q_heads, pitch]
template <score_source Source>
__global__ void attention_finalize_kernel(__grid_constant__ const batch_params bp, const float* acc, float* scores) {
  const std::int64_t tokens = bp.pitch, heads = bp.heads;
  const std::int64_t total = static_cast<std::int64_t>(bp.batch) * heads * tokens;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / tokens, b = row / heads, h = row % heads;
    const std::int32_t t = static_cast<std::int32_t>(i % tokens);
    const plan_params& pp = bp.of(b);
    if (t >= pp.tokens) continue;
    const attention_params& a = bp.attention_of(b);
    const attention_region& reg = region_of_token(a, t);
    const std::int32_t lt = t - reg.begin;  // position inside the region
    if (lt >= reg.scored) {
      if constexpr (Source == score_source::window_attention)
        if (reg.rows == 0) scores[i] = 1.f;  // a one-token region is its own window
      continue;                              // padded by attention_pad_kernel
    }
    const float* ab = acc + b * a.q_heads * static_cast<std::int64_t>(tokens);
    float s = 0.f;
    if constexpr (Source == score_source::window_attention) {
      if (reg.rows == 0) {  // fair_paper: a span without a window scores 0 (elsewhere no rows means nothing scored)
        scores[i] = 0.f;
        continue;
      }
      const std::int32_t half = a.kernel / 2, m = reg.scored;
      const std::int32_t j0 = lt - half > 0 ? lt - half : 0, j1 = lt + half < m - 1 ? lt + half : m - 1;
      for (std::int32_t g = 0; g < a.group; ++g) {
        const float* ar = ab + static_cast<std::int64_t>(h * a.group + g) * tokens + reg.begin;
        float pool = 0.f;
        for (std::int32_t j = j0; j <= j1; ++j) pool += ar[j] / static_cast<float>(reg.rows);
        s += pool / static_cast<float>(a.kernel);
      }
      s /= static_cast<float>(a.group);
    } else if constexpr (Source == score_source::last_attention) {
      for (std::int32_t qh = 0; qh < a.q_heads; ++qh) s += ab[static_cast<std::int64_t>(qh) * tokens + t];
      s /= static_cast<float>(a.q_heads);
    } else {
      // Queries that see t: up to the region's end, or up to the split for fair_paper's cut keys.
      const std::int64_t seen = paper_cut_key(pp, t) ? pp.spans.split - t : reg.end - t;
      for (std::int32_t g = 0; g < a.group; ++g)
        s += ab[static_cast<std::int64_t>(h * a.group + g) * tokens + t] / static_cast<float>(seen);
      s /= static_cast<float>(a.group);
    }
    scores[i] = s;
  }
}

// One block per (region, batch): the window tokens (or TOVA's anchor) score max + 1 over the region's scored
// tokens of every head, NaN ignored; 1 when nothing is scored; window token j raised by j ulps so ties keep the
// most recent (as cpu/score.hpp). fair_paper: one block per (region, batch, head), the pad is that head's maximum
// as std::max_element finds it in cpu/score_paper.hpp (NaN only when the first scored token is NaN), 1 when
// nothing is scored. grid = (bp.regions, batch, paper ? heads : 1). scores [batch * heads, pitch]
template <int = 0>
__global__ void __launch_bounds__(attention_threads)
    attention_pad_kernel(__grid_constant__ const batch_params bp, float* scores) {
  using reduce_t = cub::BlockReduce<float, attention_threads>;
  __shared__ typename reduce_t::TempStorage tmp;
  __shared__ float pad;
  const std::int64_t b = blockIdx.y, heads = bp.heads, tokens = bp.pitch;
  const attention_params& a = bp.attention_of(b);
  if (static_cast<std::int32_t>(blockIdx.x) >= a.n_regions) return;  // the whole block
  const attention_region& reg = a.regions[blockIdx.x];
  const bool paper = bp.of(b).paper;
  const std::int64_t h0 = paper ? blockIdx.z : 0, nh = paper ? 1 : heads;  // the heads this block pads
  float* first = scores + (b * heads + h0) * tokens + reg.begin;                // first scored token of head h0
  const std::int64_t n = nh * reg.scored;
  float m = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < n; i += attention_threads) {
    const float v = first[(i / reg.scored) * tokens + i % reg.scored];
    if (!isnan(v)) m = fmaxf(m, v);
  }
  const float bm = reduce_t(tmp).Reduce(m, [](float x, float y) { return fmaxf(x, y); });
  if (threadIdx.x == 0) {
    if (reg.scored == 0)
      pad = 1.f;
    else
      pad = !paper ? bm + 1.f : isnan(first[0]) ? first[0] : bm;
  }
  __syncthreads();
  const std::int64_t w = reg.end - reg.begin - reg.scored;
  for (std::int64_t i = threadIdx.x; i < nh * w; i += attention_threads)
    first[(i / w) * tokens + reg.scored + i % w] = fairkv::detail::raised_by(pad, static_cast<std::uint32_t>(i % w));
}

}  // namespace fairkv::cuda::detail
