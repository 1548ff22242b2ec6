// CPU scoring: every Scorer source (external scores are copied as they are), for one sequence and one scoring
// region [rb, re) at a time. Attention from float queries over float keys with unit-stride rows is computed
// gemm_rows query rows at a time as register-blocked matrix products (detail/attention_gemm.hpp); other element
// types and strides, and the engine's own attention rows, one query row at a time. Either way O(gemm_rows x
// region) memory, never L x L.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "fairkv/cpu/detail/attention_gemm.hpp"
#include "fairkv/detail/order.hpp"
#include "fairkv/detail/plan_front/attention_geometry.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cpu::detail {

// scale * <q, k_t> for t in [k0, k1); q is a query row of `head_dim` elements with stride qs.
template <class KeySource, class Q>
void dot_keys(const KeySource& keys, std::int64_t b, std::int64_t h, std::int64_t k0, std::int64_t k1,
              const Q* q, std::int64_t qs, float scale, float* out) {
  using T = typename KeySource::value_type;
  const std::int64_t d = keys.head_dim;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<std::remove_const_t<Q>, float> &&
                std::is_same_v<KeySource, kv_view<const float>>) {
    if (keys.stride_dim == 1 && qs == 1 && k1 > k0) {
      using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      const Eigen::Map<const row_major, 0, Eigen::OuterStride<>> k(keys.row(b, h, k0), k1 - k0, d,
                                                                   Eigen::OuterStride<>(keys.stride_token));
      const Eigen::Map<const Eigen::VectorXf> qv(q, d);
      Eigen::Map<Eigen::VectorXf>(out, k1 - k0).noalias() = scale * (k * qv);
      return;
    }
  }
  for (std::int64_t t = k0; t < k1; ++t) {
    const auto* kr = keys.row(b, h, t);
    float acc = 0.f;
    for (std::int64_t i = 0; i < d; ++i) acc += to_float(q[i * qs]) * to_float(kr[i * keys.stride_dim]);
    out[t - k0] = scale * acc;
  }
}

// In-place softmax of x[0, n) in float (kvpress computes it in float32).
inline void softmax(float* x, std::int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  float sum = 0.f;
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.f / sum;
  for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// Index among the given queries of the query at absolute position p, or the error the row path gives.
template <class KeySource, class Q>
result query_index(const layer_inputs<KeySource, Q>& in, std::int64_t L, std::int64_t p, std::int64_t& qi) {
  qi = p - (L - in.queries.tokens);
  if (qi < 0)
    return result::error(status::missing_input,
                         "scoring needs the query at position %lld but queries cover only the last %lld of %lld tokens",
                         static_cast<long long>(p), static_cast<long long>(in.queries.tokens),
                         static_cast<long long>(L));
  return {};
}

// The GEMM path (detail/attention_gemm.hpp), taken only where gemm_attention(in), over KV head kv_head's keys
// [rb, position], each row's softmax added to acc[0, acc_n). along_tokens: query heads qh .. qh + heads - 1, each
// at positions p0 .. p0 + count - 1 (a window, or every query of a region); otherwise the `count` query heads
// qh, qh + 1, ... at position p0 (TOVA's group; heads is 1).
template <class KeySource, class Q>
result add_query_rows(const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L, std::int64_t kv_head,
                      std::int64_t qh, std::int64_t heads, std::int64_t p0, std::int64_t count, bool along_tokens,
                      std::int64_t rb, float scale, float* acc, std::int64_t acc_n, float* logits) {
  if constexpr (gemm_types<KeySource, Q>) {
    std::int64_t qi = 0;
    FAIRKV_TRY(query_index(in, L, p0, qi));
    const auto& qv = in.queries;
    const query_rows rows = along_tokens
                                ? query_rows{qv.row(b, qh, qi), qv.stride_head, qv.stride_token, heads, count, p0, 1}
                                : query_rows{qv.row(b, qh, qi), 0, qv.stride_head, 1, count, p0, 0};
    add_attention_rows(in.keys, b, kv_head, rows, rb, scale, acc, acc_n, logits);
    return {};
  } else {
    return result::error(status::internal_error, "the GEMM attention path was taken for non-float inputs");
  }
}

// The attention row of the query at absolute position p (query head qh) over keys [rb, p], written to
// probs[0, p - rb]. From queries when given, else from the engine's rows renormalised to the region (a softmax
// restricted to a subset of keys and renormalised is the softmax over that subset).
template <class KeySource, class Q>
result attention_row(const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L, std::int64_t qh,
                     std::int64_t group_size, std::int64_t p, std::int64_t rb, float scale, float* probs) {
  const std::int64_t n = p - rb + 1;
  if (in.queries.data != nullptr) {
    std::int64_t qi = 0;
    FAIRKV_TRY(query_index(in, L, p, qi));
    dot_keys(in.keys, b, qh / group_size, rb, p + 1, in.queries.row(b, qh, qi), in.queries.stride_dim, scale, probs);
    softmax(probs, n);
    return {};
  }
  if (in.attention == nullptr)
    return result::error(status::missing_input, "attention scorer: neither queries nor attention were given");
  const std::int64_t ai = p - (L - in.attention_rows);
  if (ai < 0)
    return result::error(status::missing_input,
                         "scoring needs the attention row of position %lld but attention covers only the last %lld rows",
                         static_cast<long long>(p), static_cast<long long>(in.attention_rows));
  const std::int64_t ld = in.attention_ld != 0 ? in.attention_ld : L;
  const float* row = in.attention + ((b * in.q_heads() + qh) * in.attention_rows + ai) * ld;
  float sum = 0.f;
  for (std::int64_t i = 0; i < n; ++i) sum += row[rb + i];
  const float inv = (rb == 0) ? 1.f : 1.f / sum;  // the full row is already normalised
  for (std::int64_t i = 0; i < n; ++i) probs[i] = row[rb + i] * inv;
  return {};
}

// SnapKV's per-query-head statistic, added to out[0, m): the window's summed attention acc[0, m) divided by the
// window size w, then avg_pool1d(kernel, stride 1, zero padding kernel/2, count_include_pad): the divisor is
// always `kernel`. O(m) for any kernel (a sum per token would be O(m * kernel)): in blocks of `kernel` tokens, a
// window of at most `kernel` tokens is a block suffix plus the next block's prefix (van Herk / Gil-Werman), so no
// sum is ever subtracted and tiny attention next to large attention keeps its digits. Suffixes and prefixes are
// summed in double and stored as float. acc is overwritten (it ends holding the prefixes); pooled is scratch of m
// floats (the suffixes).
inline void add_pooled_window_mean(float* acc, std::int64_t m, std::int64_t w, std::int32_t kernel, float* pooled,
                                   float* out) {
  const std::int64_t k = kernel, half = k / 2;
  for (std::int64_t t = 0; t < m; ++t) acc[t] /= static_cast<float>(w);
  for (std::int64_t first = 0; first < m; first += k) {
    const std::int64_t last = std::min(m, first + k) - 1;
    double sum = 0.0;
    for (std::int64_t t = last; t >= first; --t) pooled[t] = static_cast<float>(sum += acc[t]);
    sum = 0.0;
    for (std::int64_t t = first; t <= last; ++t) acc[t] = static_cast<float>(sum += acc[t]);
  }
  for (std::int64_t t = 0; t < m; ++t) {
    // The window [a, b], clipped to the sequence: it crosses one block boundary, or it lies in one block and then
    // starts at the block's first token or ends at its last (a clipped window touches 0 or m - 1).
    const std::int64_t a = std::max<std::int64_t>(0, t - half), b = std::min(m - 1, t + half);
    const float sum = a / k != b / k ? pooled[a] + acc[b] : a % k == 0 ? acc[b] : pooled[a];
    out[t] += sum / static_cast<float>(kernel);
  }
}

// Window tokens (and TOVA's anchor) score max + 1 over the region's scored tokens of every head, as kvpress pads
// them: they are kept whenever the budget allows. Token j of the window is raised by j ulps (detail/order.hpp's
// raised_by), so a budget smaller than the window keeps its most recent tokens.
inline void pad_with_max_plus_one(float* scores, std::int64_t ld, std::int64_t heads, std::int64_t rb,
                                  std::int64_t scored_end, std::int64_t re) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = rb; t < scored_end; ++t)
      if (!std::isnan(scores[h * ld + t])) m = std::max(m, scores[h * ld + t]);
  const float pad = (scored_end > rb) ? m + 1.f : 1.f;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = scored_end; t < re; ++t)
      scores[h * ld + t] = fairkv::detail::raised_by(pad, static_cast<std::uint32_t>(t - scored_end));
}

// The per-head scorers of score_region_head, one per attention statistic. Each writes row h of scores over the
// region's scored keys; probs, acc, pooled and logits are the call's scratch (score_region_head carves them).
struct head_scratch {
  float* probs;   // [n]
  float* acc;     // [n]
  float* pooled;  // [n]
  float* logits;  // a pass's scratch (detail/attention_gemm.hpp)
};

// TOVA's score is one mean over every query head. On the block path each KV head adds its group's attention into
// its own row of scores (so heads can be parallel tasks) and finish_region sums the rows in head order: the
// additions a single accumulator would make, in the same order. The row path runs whole in finish_region.
template <class S, class KeySource, class Q>
result score_last_attention_head(const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L,
                                 std::int64_t rb, std::int64_t re, std::int64_t h, float* scores, std::int64_t ld,
                                 const head_scratch& x) {
  if (!gemm_attention(in)) return {};
  const std::int64_t group = in.q_heads() / in.keys.heads;
  const std::int64_t m = fairkv::detail::attention_geometry<S>(rb, re, 0, false, false).scored;
  float* row = scores + h * ld + rb;
  std::fill(row, row + m, 0.f);
  return add_query_rows(in, b, L, h, h * group, 1, re - 1, group, false, rb, in.softmax_scale(), row, m, x.logits);
}

// SnapKV: scored keys [rb, rb + m), the window's rows [re - w, re) (detail/plan_front/attention_geometry.hpp),
// the window mean pooled, averaged over the KV head's query heads.
template <class S, class KeySource, class Q>
result score_window_attention_head(const S& scorer, const layer_inputs<KeySource, Q>& in, std::int64_t b,
                                   std::int64_t L, std::int64_t rb, std::int64_t re, std::int64_t h, float* scores,
                                   std::int64_t ld, const head_scratch& x) {
  const std::int64_t group = in.q_heads() / in.keys.heads;
  const float scale = in.softmax_scale();
  const std::int64_t w = fairkv::detail::region_window(scorer, re - rb);
  const std::int64_t m = fairkv::detail::attention_geometry<S>(rb, re, w, false, false).scored;
  float* row = scores + h * ld + rb;
  if (w == 0) {  // a one-token region: nothing to attend from, the token is its own window
    row[0] = 1.f;
    return {};
  }
  std::fill(row, row + m, 0.f);
  if (gemm_attention(in)) {
    // The whole group in one pass over the keys; the window mean and the pooling are linear, so pooling the
    // group's summed windows once is the sum of the per-head poolings (up to float rounding).
    std::fill(x.acc, x.acc + m, 0.f);
    FAIRKV_TRY(add_query_rows(in, b, L, h, h * group, group, re - w, w, true, rb, scale, x.acc, m, x.logits));
    add_pooled_window_mean(x.acc, m, w, scorer.kernel, x.pooled, row);
  } else {
    for (std::int64_t g = 0; g < group; ++g) {
      std::fill(x.acc, x.acc + m, 0.f);
      for (std::int64_t p = re - w; p < re; ++p) {
        FAIRKV_TRY(attention_row(in, b, L, h * group + g, group, p, rb, scale, x.probs));
        for (std::int64_t t = 0; t < m; ++t) x.acc[t] += x.probs[t];
      }
      add_pooled_window_mean(x.acc, m, w, scorer.kernel, x.pooled, row);
    }
  }
  for (std::int64_t t = 0; t < m; ++t) row[t] /= static_cast<float>(group);
  return {};
}

// H2O: each key's attention summed over the region's queries that see it, divided by their number, averaged over
// the KV head's query heads; from the queries, the attention rows, or the engine's column sums.
template <class KeySource, class Q>
result score_observed_attention_head(const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L,
                                     std::int64_t rb, std::int64_t re, std::int64_t h, float* scores,
                                     std::int64_t ld, const head_scratch& x) {
  const std::int64_t qheads = in.q_heads(), group = qheads / in.keys.heads, n = re - rb;
  const float scale = in.softmax_scale();
  const bool from_queries = in.queries.data != nullptr || in.attention != nullptr;
  float* row = scores + h * ld + rb;
  std::fill(row, row + n, 0.f);
  if (gemm_attention(in)) {  // the group's column sums in one call (a sum over every row of every head)
    std::fill(x.acc, x.acc + n, 0.f);
    FAIRKV_TRY(add_query_rows(in, b, L, h, h * group, group, rb, n, true, rb, scale, x.acc, n, x.logits));
    for (std::int64_t t = 0; t < n; ++t) row[t] = x.acc[t] / static_cast<float>(re - (rb + t));
  } else {
    for (std::int64_t g = 0; g < group; ++g) {
      const std::int64_t qh = h * group + g;
      if (from_queries) {
        std::fill(x.acc, x.acc + n, 0.f);
        for (std::int64_t p = rb; p < re; ++p) {
          FAIRKV_TRY(attention_row(in, b, L, qh, group, p, rb, scale, x.probs));
          for (std::int64_t t = 0; t <= p - rb; ++t) x.acc[t] += x.probs[t];
        }
      } else {
        const std::int64_t ldc = in.attention_ld != 0 ? in.attention_ld : L;
        const float* col = in.attention_column_sums + (b * qheads + qh) * ldc;
        for (std::int64_t t = 0; t < n; ++t) x.acc[t] = col[rb + t];
      }
      for (std::int64_t t = 0; t < n; ++t) row[t] += x.acc[t] / static_cast<float>(re - (rb + t));
    }
  }
  for (std::int64_t t = 0; t < n; ++t) row[t] /= static_cast<float>(group);
  return {};
}

// Scores of region [rb, re) of sequence b (length L) for KV head h: scores[h * ld + t], before the padding of the
// window / anchor tokens (finish_region), which needs every head. Writes only row h; tmp must hold
// scratch_floats<S>(re - rb) floats of this call's own.
template <class S, class KeySource, class Q>
result score_region_head(const S& scorer, const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L,
                         std::int64_t rb, std::int64_t re, std::int64_t h, float* scores, std::int64_t ld,
                         float* tmp) {
  if constexpr (S::source == score_source::position) {
    for (std::int64_t t = rb; t < re; ++t) scores[h * ld + t] = scorer(token_info{t, L, h, b});
    return {};
  } else if constexpr (S::source == score_source::external) {
    for (std::int64_t t = rb; t < re; ++t) scores[h * ld + t] = in.scores.at(b, h, t);
    return {};
  } else if constexpr (S::source == score_source::keys) {
    using T = typename KeySource::value_type;
    if (in.keys.stride_dim == 1) {
      for (std::int64_t t = rb; t < re; ++t)
        scores[h * ld + t] = scorer(key_row<T, true>{in.keys.row(b, h, t), in.keys.head_dim, 1}, token_info{t, L, h, b});
    } else {
      for (std::int64_t t = rb; t < re; ++t)
        scores[h * ld + t] = scorer(key_row<T, false>{in.keys.row(b, h, t), in.keys.head_dim, in.keys.stride_dim},
                                    token_info{t, L, h, b});
    }
    return {};
  } else {
    const std::int64_t n = re - rb;
    const head_scratch x{tmp, tmp + n, tmp + 2 * n, tmp + 3 * n};
    if constexpr (S::source == score_source::last_attention)
      return score_last_attention_head<S>(in, b, L, rb, re, h, scores, ld, x);
    else if constexpr (S::source == score_source::window_attention)
      return score_window_attention_head(scorer, in, b, L, rb, re, h, scores, ld, x);
    else if constexpr (S::source == score_source::observed_attention)
      return score_observed_attention_head(in, b, L, rb, re, h, scores, ld, x);
    else
      static_assert(dependent_false<S>, "fairkv::cpu: unknown score_source");
  }
}

// What follows the per-head scores of region [rb, re): the padding of SnapKV's window with the maximum over every
// head, and TOVA's mean over the heads' rows (its whole statistic on the row path). tmp must hold
// scratch_floats<S>(re - rb) floats.
template <class S, class KeySource, class Q>
result finish_region(const S& scorer, const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L,
                     std::int64_t rb, std::int64_t re, float* scores, std::int64_t ld, float* tmp) {
  const std::int64_t heads = in.keys.heads;
  const std::int64_t n = re - rb;
  if constexpr (S::source == score_source::window_attention) {
    const std::int64_t w = fairkv::detail::region_window(scorer, n);
    if (w == 0) return {};
    const std::int64_t m = fairkv::detail::attention_geometry<S>(rb, re, w, false, false).scored;
    pad_with_max_plus_one(scores, ld, heads, rb, rb + m, re);
  } else if constexpr (S::source == score_source::last_attention) {
    const std::int64_t qheads = in.q_heads();
    const std::int64_t group = qheads / heads;
    const float scale = in.softmax_scale();
    float* probs = tmp;    // [n]
    float* acc = tmp + n;  // [n]
    // Keys [rb, re - 1) are scored, the anchor re - 1 is padded.
    const std::int64_t m = fairkv::detail::attention_geometry<S>(rb, re, 0, false, false).scored;
    std::fill(acc, acc + m, 0.f);
    if (gemm_attention(in)) {  // each KV head's group, summed into its row by score_region_head
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t t = 0; t < m; ++t) acc[t] += scores[h * ld + rb + t];
    } else {
      for (std::int64_t qh = 0; qh < qheads; ++qh) {
        FAIRKV_TRY(attention_row(in, b, L, qh, group, re - 1, rb, scale, probs));
        for (std::int64_t t = 0; t < m; ++t) acc[t] += probs[t];
      }
    }
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < m; ++t) scores[h * ld + rb + t] = acc[t] / static_cast<float>(qheads);
    pad_with_max_plus_one(scores, ld, heads, rb, rb + m, re);
  }
  return {};
}

// Scores of region [rb, re) of sequence b (length L) for every KV head: scores[h * ld + t].
// tmp must hold scratch_floats<S>(re - rb) floats.
template <class S, class KeySource, class Q>
result score_region(const S& scorer, const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L,
                    std::int64_t rb, std::int64_t re, float* scores, std::int64_t ld, float* tmp) {
  for (std::int64_t h = 0; h < in.keys.heads; ++h)
    FAIRKV_TRY(score_region_head(scorer, in, b, L, rb, re, h, scores, ld, tmp));
  return finish_region(scorer, in, b, L, rb, re, scores, ld, tmp);
}

}  // namespace fairkv::cpu::detail
