// What a backend may read to score one layer: the cached keys, and for attention scorers either the window's
// queries (the backend computes attention in blocks of query rows, never an L x L matrix) or attention the
// engine already computed; for scorers::external, the caller's own scores.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fairkv/views/kv_view.hpp"
#include "fairkv/views/paged_kv_view.hpp"
#include "fairkv/views/score_view.hpp"

namespace fairkv {

template <class KeySource, class QueryT = float>
struct layer_inputs {
  KeySource keys{};                 // kv_view<const T> [batch, kv_heads, tokens, head_dim] or paged_side<const T>
  kv_view<const QueryT> queries{};  // [batch, q_heads, q_tokens, head_dim]: post-RoPE queries of the LAST
                                    // q_tokens positions of each sequence (q_tokens = tokens for segment-local
                                    // scoring of segments that do not end the sequence)
  const float* attention = nullptr;  // [batch, q_heads, attention_rows, attention_ld]: softmaxed causal attention
                                     // rows of the last attention_rows queries over keys [0, tokens)
  std::int64_t attention_rows = 0;
  std::int64_t attention_ld = 0;     // leading dimension of `attention` and of both column sums (0 = tokens;
                                     // sequences of different lengths must give it)
  const float* attention_column_sums = nullptr;  // [batch, q_heads, attention_ld]: sum over all causal queries
                                                 // of A[q, k] (what H2O accumulates during prefill)
  std::int64_t attention_q_heads = 0;  // query heads of `attention` / `attention_column_sums` when no queries are
                                       // given (ignored otherwise: the queries' own head count is used)
  float scale = 0.0f;                // softmax scale; 0 means 1 / sqrt(head_dim)
  score_view scores{};               // [batch, kv_heads, tokens]: scorers::external's scores, higher = keep; batch
                                     // and heads equal the keys', tokens the longest sequence (sequence b reads
                                     // [0, tokens_of(b))). Read only by scorers::external, ignored otherwise.
  const float* attention_local_column_sums = nullptr;  // [batch, q_heads, attention_ld]: attention_column_sums
                                                       // with each query's row renormalised to the keys of its own
                                                       // scoring region (fairkv/scoring_regions.hpp): what
                                                       // segment-local H2O reads without queries or rows

  // The query heads the backends work with: the queries' own count when they are given, else attention_q_heads.
  [[nodiscard]] constexpr std::int64_t q_heads() const noexcept {
    return queries.data != nullptr ? queries.heads : attention_q_heads;
  }
  // The scale every backend applies to the logits: `scale`, or 1 / sqrt(head_dim) where it is 0.
  [[nodiscard]] float softmax_scale() const noexcept {
    return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(keys.head_dim));
  }
};

template <class T>
[[nodiscard]] constexpr layer_inputs<kv_view<const std::remove_const_t<T>>> keys_only(kv_view<T> keys) noexcept {
  return {keys.as_const()};
}

template <class T, class Q>
[[nodiscard]] constexpr layer_inputs<kv_view<const std::remove_const_t<T>>, std::remove_const_t<Q>> with_queries(
    kv_view<T> keys, kv_view<Q> queries) noexcept {
  layer_inputs<kv_view<const std::remove_const_t<T>>, std::remove_const_t<Q>> in{keys.as_const()};
  in.queries = queries.as_const();
  return in;
}

// External scores over a cache: the keys give the shape (and are what compaction moves), the scores the order.
template <class T>
[[nodiscard]] constexpr layer_inputs<kv_view<const std::remove_const_t<T>>> with_scores(kv_view<T> keys,
                                                                                        score_view scores) noexcept {
  layer_inputs<kv_view<const std::remove_const_t<T>>> in{keys.as_const()};
  in.scores = scores;
  return in;
}

// External scores alone, for a caller that plans before (or without) handing fairkv its cache: the keys are a
// shape with no data ([batch, heads, tokens] of the scores, head_dim 1), which only scorers::external accepts.
// Compaction still takes the real K and V views.
[[nodiscard]] constexpr layer_inputs<kv_view<const float>> scores_only(score_view scores) noexcept {
  layer_inputs<kv_view<const float>> in{{nullptr, scores.batch, scores.heads, scores.tokens, 1, 0, 0, 0, 1}};
  in.scores = scores;
  return in;
}

}  // namespace fairkv
