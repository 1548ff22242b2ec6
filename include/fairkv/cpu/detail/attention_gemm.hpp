// Attention of a block of query rows over one KV head's keys as a register-blocked matrix product (issue 17). The
// row-at-a-time path (score.hpp's attention_row) reads every key once per query row: SnapKV's window of 16
// queries x 4 query heads reads a KV head's keys 64 times and runs at matrix-vector speed. Here up to gemm_rows
// query rows share one pass over the keys; the softmax and the accumulation that follow compute the row path's
// statistic (the summation orders differ, and SnapKV sums a group's windows before pooling them: parity within
// float rounding, not bit for bit).
//
// The product is written with Eigen's packet primitives rather than as an Eigen GEMM. The query block is small
// (64 rows x head_dim) and the keys are long, so the block is transposed once ([head_dim, rows]: a packet holds
// one key's logits for `lanes` consecutive rows) and every key is read straight from the engine's cache and
// broadcast against it: the keys are never packed. An Eigen GEMM packs both operands of every product; at this
// shape that packing cost more than the multiply-adds (perf: gemm_pack_lhs 29 % of SnapKV's samples against
// 15 % in its kernel), and a GEMM over more than 128 keys would allocate its blocking buffer on the heap. The
// logits come out token-major ([tokens, rows]), so each row's max and sum are lane-wise packet operations.
//
// Only float keys and float queries with unit-stride rows take this path; other element types and strides keep
// the row path (they convert element by element anyway).
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

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

namespace tile {

namespace ei = Eigen::internal;

// The widest packet the compile flags give, and its halves: a block of few rows (TOVA's group of 4) takes the
// narrowest packet that holds them instead of padding 4 rows to 16 lanes.
using full = ei::packet_traits<float>::type;
using half = ei::unpacket_traits<full>::half;
using quarter = ei::unpacket_traits<half>::half;
template <class Packet>
inline constexpr std::int64_t lanes = ei::unpacket_traits<Packet>::size;

// A register tile is keys<P> keys x P packets of rows: keys x P accumulators, P query packets and one broadcast key
// element fit the register file (32 vector registers with AVX-512: 6 keys x 4 packets; 16 with AVX2: 4 x 3; SSE2:
// 2 x 4). Each key element loaded feeds P multiply-adds and each query packet keys<P> of them, so the loads stay
// below the multiply-adds. With 16 registers and a fused multiply-add (AVX2), 4 packets leave room for 2 keys only:
// 8 accumulators do not hide the latency of two FMA ports; 3 packets x 4 keys (12) took SnapKV-16's scoring alone
// from 8.2 to 6.0 ms at 4k, its plan + compact 10 % (docs/benchmarks.md). Without an FMA (SSE2) each multiply-add
// needs a temporary, 3 x 4 spills, and 4 x 2 stays.
#if defined(EIGEN_HAS_SINGLE_INSTRUCTION_MADD)
inline constexpr int row_packets = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32 ? 4 : 3;
#else
inline constexpr int row_packets = 4;
#endif
template <int P>
inline constexpr int keys = std::clamp(static_cast<int>(EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS - P - 1) / P, 1, 8);
static_assert(gemm_chunk % keys<1> == 0 && gemm_chunk % keys<2> == 0 && gemm_chunk % keys<3> == 0 &&
              gemm_chunk % keys<4> == 0);

// f(0), ..., f(N - 1) with compile-time indices, so the accumulators are named registers at any optimisation level
// that inlines.
template <class F, std::size_t... I>
EIGEN_STRONG_INLINE void unrolled(F&& f, std::index_sequence<I...>) {
  (f(std::integral_constant<std::size_t, I>{}), ...);
}
template <std::size_t N, class F>
EIGEN_STRONG_INLINE void unroll(F&& f) {
  unrolled(f, std::make_index_sequence<N>{});
}

// exp(x) for x <= 0: a logit minus its row's max. Cephes' polynomial (as in Eigen's pexp) on r = x - n ln 2, times
// 2^n written straight into the exponent bits. x is clamped to -87, so 2^n stays a normal float and the
// overflow-safe pldexp of Eigen's generic pexp (SSE, AVX2: a third of its instructions) is not needed; in a loop
// over L1-resident packets this exp took 0.53x (SSE2), 0.60x (AVX2) and 0.87x (AVX-512, whose pexp is already
// specialised) of pexp's time. Below e^-87 (1.6e-38, under any probability a float sum can hold next to the max's
// exp(0) = 1) it gives e^-87, not 0. NaN stays NaN (pmax returns its first argument when one is NaN).
template <class Packet>
EIGEN_STRONG_INLINE Packet exp_nonpositive(const Packet& x) {
  if constexpr (lanes<Packet> == 1) {
    return ei::pexp(x);
  } else {
    using PacketI = typename ei::unpacket_traits<Packet>::integer_packet;
    const Packet c = ei::pmax(x, ei::pset1<Packet>(-87.f));
    // v = 1.5 * 2^23 + round(c / ln 2): the sum rounds to an integer, which its low mantissa bits hold.
    const Packet magic = ei::pset1<Packet>(12582912.f);
    const Packet v = ei::pmadd(c, ei::pset1<Packet>(1.44269504088896341f), magic);
    const Packet n = ei::psub(v, magic);
    Packet r = ei::pmadd(n, ei::pset1<Packet>(-0.693359375f), c);  // ln 2 in two parts: r exact to float rounding
    r = ei::pmadd(n, ei::pset1<Packet>(2.12194440e-4f), r);
    Packet p = ei::pset1<Packet>(1.9875691500e-4f);
    p = ei::pmadd(p, r, ei::pset1<Packet>(1.3981999507e-3f));
    p = ei::pmadd(p, r, ei::pset1<Packet>(8.3334519073e-3f));
    p = ei::pmadd(p, r, ei::pset1<Packet>(4.1665795894e-2f));
    p = ei::pmadd(p, r, ei::pset1<Packet>(1.6666665459e-1f));
    p = ei::pmadd(p, r, ei::pset1<Packet>(5.0000001201e-1f));
    p = ei::pmadd(p, ei::pmul(r, r), ei::padd(r, ei::pset1<Packet>(1.f)));
    // v's bits shifted by the 23 mantissa bits leave n << 23 (the bits of 1.5 * 2^23 shift out); adding the
    // exponent bias gives the bits of 2^n.
    const PacketI e =
        ei::padd(ei::plogical_shift_left<23>(ei::preinterpret<PacketI>(v)), ei::pset1<PacketI>(127 << 23));
    return ei::pmul(p, ei::preinterpret<Packet>(e));
  }
}

// out[i * rp + j] = scale * sum_c k[i * ks + c] * qt[c * rp + j] for i < NT keys and j < P packets of rows; with
// mx, also mx[j] = max(mx[j], out[i * rp + j] over i) while the tile is in registers. With prefetch, the next NT
// keys exist and are fetched ahead.
template <class Packet, int P, int NT>
inline void logits(const float* k, std::int64_t ks, const float* qt, std::int64_t rp, std::int64_t d, float scale,
                   float* out, float* mx, bool prefetch) {
  constexpr std::int64_t W = lanes<Packet>;
  Packet acc[NT * P];
  unroll<NT * P>([&](auto a) { acc[a] = ei::pset1<Packet>(0.f); });
  // The next tile's keys: at 32k tokens a KV head's keys (16 MiB) come from memory, and the hardware prefetcher
  // does not follow NT interleaved rows far enough ahead (SnapKV's scoring 38 -> 31 ms there).
  if (prefetch)
    for (std::int64_t i = NT; i < 2 * NT; ++i)
      for (std::int64_t c = 0; c < d; c += 16) __builtin_prefetch(k + i * ks + c);
  for (std::int64_t c = 0; c < d; ++c) {
    Packet q[P];
    unroll<P>([&](auto j) { q[j] = ei::ploadu<Packet>(qt + c * rp + static_cast<std::int64_t>(j) * W); });
    unroll<NT>([&](auto i) {
      const Packet x = ei::pset1<Packet>(k[static_cast<std::int64_t>(i) * ks + c]);
      unroll<P>([&](auto j) { acc[i * P + j] = ei::pmadd(x, q[j], acc[i * P + j]); });
    });
  }
  const Packet s = ei::pset1<Packet>(scale);
  unroll<NT * P>([&](auto a) { acc[a] = ei::pmul(acc[a], s); });
  unroll<NT>([&](auto i) {
    unroll<P>([&](auto j) {
      ei::pstoreu(out + static_cast<std::int64_t>(i) * rp + static_cast<std::int64_t>(j) * W, acc[i * P + j]);
    });
  });
  if (mx != nullptr) {
    unroll<P>([&](auto j) {
      Packet m = ei::ploadu<Packet>(mx + static_cast<std::int64_t>(j) * W);
      unroll<NT>([&](auto i) { m = ei::pmax(m, acc[i * P + j]); });
      ei::pstoreu(mx + static_cast<std::int64_t>(j) * W, m);
    });
  }
}

// Keys [0, nk) against P packets of rows, keys<P> at a time (keys [nk, nvalid) exist and may be prefetched). The
// tiles that lie within keys [0, nmax) fold their maxima into mx; returns the first key whose maximum is not
// folded (a tile crossing nmax is not).
template <class Packet, int P>
inline std::int64_t logits_run(const float* k, std::int64_t ks, std::int64_t nk, std::int64_t nvalid,
                               std::int64_t nmax, const float* qt, std::int64_t rp, std::int64_t d, float scale,
                               float* out, float* mx) {
  constexpr int NT = keys<P>;
  const std::int64_t whole = nk / NT * NT;  // keys in whole tiles; the rest go one at a time
  std::int64_t t = 0;
  for (; t < whole; t += NT)
    logits<Packet, P, NT>(k + t * ks, ks, qt, rp, d, scale, out + t * rp, t + NT <= nmax ? mx : nullptr,
                          t + 2 * NT <= nvalid);
  for (; t < nk; ++t)
    logits<Packet, P, 1>(k + t * ks, ks, qt, rp, d, scale, out + t * rp, t < nmax ? mx : nullptr, t + 2 <= nvalid);
  return nmax <= whole ? nmax / NT * NT : std::min(nmax, nk);
}

// Keys [0, nk) against every row of qt, row_packets packets of rows at a time (keys [nk, nvalid) exist), folding
// the maxima of keys [0, nmax) into mx[0, rp) tile by tile. Returns the first key from which the caller must fold
// them itself.
template <class Packet>
inline std::int64_t logits_rows(const float* k, std::int64_t ks, std::int64_t nk, std::int64_t nvalid,
                                std::int64_t nmax, const float* qt, std::int64_t rp, std::int64_t d, float scale,
                                float* out, float* mx) {
  constexpr std::int64_t W = lanes<Packet>;
  const std::int64_t np = rp / W;
  std::int64_t unfolded = nk;
  for (std::int64_t s = 0; s < np; s += row_packets) {
    const float* q = qt + s * W;
    float* o = out + s * W;
    float* m = mx + s * W;
    std::int64_t u = 0;
    switch (std::min<std::int64_t>(row_packets, np - s)) {
      case 1: u = logits_run<Packet, 1>(k, ks, nk, nvalid, nmax, q, rp, d, scale, o, m); break;
      case 2: u = logits_run<Packet, 2>(k, ks, nk, nvalid, nmax, q, rp, d, scale, o, m); break;
      case 3: u = logits_run<Packet, 3>(k, ks, nk, nvalid, nmax, q, rp, d, scale, o, m); break;
      default: u = logits_run<Packet, 4>(k, ks, nk, nvalid, nmax, q, rp, d, scale, o, m); break;
    }
    unfolded = std::min(unfolded, u);
  }
  return unfolded;
}

// acc[t] += sum_j e[t * rp + j] * w[j] for t < nt: W tokens' packet sums transposed and added, so one packet
// reduction serves W tokens (a horizontal sum per token cost more than its multiply-adds).
template <class Packet>
inline void add_weighted_rows(const float* e, std::int64_t rp, std::int64_t nt, const float* w, float* acc) {
  constexpr std::int64_t W = lanes<Packet>;
  const std::int64_t np = rp / W;
  const auto row_sum = [&](std::int64_t t) {
    Packet p = ei::pmul(ei::ploadu<Packet>(e + t * rp), ei::ploadu<Packet>(w));
    for (std::int64_t j = 1; j < np; ++j)
      p = ei::pmadd(ei::ploadu<Packet>(e + t * rp + j * W), ei::ploadu<Packet>(w + j * W), p);
    return p;
  };
  std::int64_t t = 0;
  for (; t + W <= nt; t += W) {
    ei::PacketBlock<Packet, static_cast<int>(W)> block;
    for (std::int64_t u = 0; u < W; ++u) block.packet[u] = row_sum(t + u);
    ei::ptranspose(block);
    for (std::int64_t u = 1; u < W; ++u) block.packet[0] = ei::padd(block.packet[0], block.packet[u]);
    ei::pstoreu(acc + t, ei::padd(ei::ploadu<Packet>(acc + t), block.packet[0]));
  }
  for (; t < nt; ++t) acc[t] += ei::predux(row_sum(t));
}

// One pass over rows [i0, i0 + rows) of qr with packets of Packet (see add_attention_block).
template <class Packet>
inline void attention_block(const kv_view<const float>& keys, std::int64_t b, std::int64_t h, const query_rows& qr,
                            std::int64_t i0, std::int64_t rows, std::int64_t rb, float scale, float* acc,
                            std::int64_t acc_n, float* scratch) {
  constexpr std::int64_t W = lanes<Packet>;
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const std::int64_t d = keys.head_dim;
  const std::int64_t rp = (rows + W - 1) / W * W;  // rows padded to whole packets
  const std::int64_t np = rp / W;
  // Every row sees keys [0, full); key t >= full is seen by the rows whose length exceeds it (the causal tail).
  std::int64_t n = 0, full = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t r = 0; r < rows; ++r) {
    n = std::max(n, qr.length(i0 + r, rb));
    full = std::min(full, qr.length(i0 + r, rb));
  }
  float* lt = scratch;                             // [n, rp] logits, then exponentials, token-major
  float* qt = lt + gemm_rows * n;                  // [d, rp] the rows transposed, padding rows zero
  float* seen = qt + gemm_rows * gemm_max_head_dim;  // [rp] keys of the tail each row sees (length - full)
  float* stats = seen + gemm_rows;                 // [chunks, 2, rp] each chunk's max, then its sum of exponentials
  for (std::int64_t r = 0; r < rp; ++r) {
    seen[r] = static_cast<float>((r < rows ? qr.length(i0 + r, rb) : n) - full);
    const float* q = r < rows ? qr.row(i0 + r) : nullptr;
    for (std::int64_t c = 0; c < d; ++c) qt[c * rp + r] = q != nullptr ? q[c] : 0.f;
  }

  // Per chunk: logits; rows that do not see a key of the tail get -inf there; each row's max m and
  // exponentials exp(logit - m) in place (0 where masked: exp(-inf) is not exactly 0 in every packet exp); their sum.
  const float* k0 = keys.row(b, h, rb);
  const Packet masked = ei::pset1<Packet>(ninf), zero = ei::pset1<Packet>(0.f);
  const std::int64_t chunks = (n + gemm_chunk - 1) / gemm_chunk;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t c0 = c * gemm_chunk, c1 = std::min(n, c0 + gemm_chunk);
    float* m = stats + c * 2 * rp;
    float* s = m + rp;
    const std::int64_t tail = std::clamp(full, c0, c1);  // keys [c0, tail) are seen by every row
    std::fill(m, m + rp, ninf);
    const std::int64_t unfolded = c0 + logits_rows<Packet>(k0 + c0 * keys.stride_token, keys.stride_token, c1 - c0,
                                                           n - c0, tail - c0, qt, rp, d, scale, lt + c0 * rp, m);
    for (std::int64_t j = 0; j < np; ++j) {
      // The maxima of the keys the tiles did not fold in: those of a tile that reaches the tail, and the tail,
      // where the rows that do not see a key get -inf.
      const Packet vis = ei::ploadu<Packet>(seen + j * W);
      Packet mj = ei::ploadu<Packet>(m + j * W);
      for (std::int64_t t = unfolded; t < c1; ++t) {
        float* l = lt + t * rp + j * W;
        Packet x = ei::ploadu<Packet>(l);
        if (t >= full) {
          x = ei::pselect(ei::pcmp_lt(ei::pset1<Packet>(static_cast<float>(t - full)), vis), x, masked);
          ei::pstoreu(l, x);
        }
        mj = ei::pmax(mj, x);
      }
      Packet sj = zero;
      for (std::int64_t t = c0; t < c1; ++t) {
        float* l = lt + t * rp + j * W;
        const Packet x = ei::ploadu<Packet>(l);
        Packet e = exp_nonpositive(ei::psub(x, mj));
        if (t >= full) e = ei::pselect(ei::pcmp_eq(x, masked), zero, e);
        ei::pstoreu(l, e);
        sj = ei::padd(sj, e);
      }
      ei::pstoreu(m + j * W, mj);
      ei::pstoreu(s + j * W, sj);
    }
  }

  // Each row's max M and sum S over the chunks; a chunk's exponentials times exp(m - M) / S are the probabilities.
  // exp(m - M), then the chunk weights, overwrite the chunk maxima (padding rows weigh 0).
  for (std::int64_t j = 0; j < np; ++j) {
    Packet mx = masked, sum = zero;
    for (std::int64_t c = 0; c < chunks; ++c) mx = ei::pmax(mx, ei::ploadu<Packet>(stats + c * 2 * rp + j * W));
    for (std::int64_t c = 0; c < chunks; ++c) {
      float* m = stats + c * 2 * rp + j * W;
      const Packet f = exp_nonpositive(ei::psub(ei::ploadu<Packet>(m), mx));
      ei::pstoreu(m, f);
      sum = ei::pmadd(ei::ploadu<Packet>(m + rp), f, sum);
    }
    const Packet inv = ei::pdiv(ei::pset1<Packet>(1.f), sum);
    for (std::int64_t c = 0; c < chunks; ++c) {
      float* m = stats + c * 2 * rp + j * W;
      ei::pstoreu(m, ei::pmul(ei::ploadu<Packet>(m), inv));
    }
  }
  for (std::int64_t c = 0; c < chunks; ++c)
    for (std::int64_t r = rows; r < rp; ++r) stats[c * 2 * rp + r] = 0.f;

  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t c0 = c * gemm_chunk, c1 = std::min({n, acc_n, c0 + gemm_chunk});
    if (c1 > c0) add_weighted_rows<Packet>(lt + c0 * rp, rp, c1 - c0, stats + c * 2 * rp, acc + c0);
  }
}

}  // namespace tile

// Rows [i0, i0 + rows) of qr (rows <= gemm_rows) in one pass over the keys: each row's causal softmax (scale
// folded into the logits) is added to acc[t] for t < min(acc_n, its own length). scratch: scratch_floats's
// attention part for the block's longest row.
inline void add_attention_block(const kv_view<const float>& keys, std::int64_t b, std::int64_t h,
                                const query_rows& qr, std::int64_t i0, std::int64_t rows, std::int64_t rb,
                                float scale, float* acc, std::int64_t acc_n, float* scratch) {
  if (rows <= tile::lanes<tile::quarter>)
    tile::attention_block<tile::quarter>(keys, b, h, qr, i0, rows, rb, scale, acc, acc_n, scratch);
  else if (rows <= tile::lanes<tile::half>)
    tile::attention_block<tile::half>(keys, b, h, qr, i0, rows, rb, scale, acc, acc_n, scratch);
  else
    tile::attention_block<tile::full>(keys, b, h, qr, i0, rows, rb, scale, acc, acc_n, scratch);
}

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

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
