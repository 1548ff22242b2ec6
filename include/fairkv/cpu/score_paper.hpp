// Scores of the paper's two-span fair presses (allocators/fair_paper.hpp), for one sequence, on the CPU.
// The earlier original span is [eb, split), the later [split, le); widened, they are [0, split) and [split, L).
// Attention statistics are slices of the full causal softmax (attention_row over [0, p]), never re-normalised:
//  - SnapKV: window w_e = min(window / 2, split) for the earlier span, w_l = min(window - w_e, L - split) for the
//    later; each span's window is its last tokens; its other tokens get the window's mean attention, avg-pooled
//    inside the span (zero padding, divisor kernel), GQA mean; the window tokens get the span's maximum for that
//    head (1 when nothing is scored), raised by one ulp per position (recency, detail/order.hpp). No window
//    (w = 0): the span scores 0.
//  - TOVA: anchors split - 1 and L - 1; the span's other tokens get the anchor's attention, mean over all query
//    heads; the anchor gets the span's maximum (1 when nothing is scored).
//  - H2O: column sums of the attention over the queries that see each key, minus the later original span's
//    queries for keys of the earlier original span, divided by split - k there and by L - k elsewhere; GQA mean.
//  - StreamingLLM: ramps 0.1 .. 0.9 (torch.linspace in float) over [n_sink, split) and [split, L), sinks 1.
//  - Key scorers (K-Norm, user scorers) score as usual.
#pragma once

#include <algorithm>
#include <cstdint>

#include "fairkv/cpu/score.hpp"
#include "fairkv/detail/order.hpp"
#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/detail/protected_tokens.hpp"

namespace fairkv::cpu::detail {

// The spans, the StreamingLLM ramps and the window split are shared with the CUDA backend (detail/paper_spans.hpp).
using fairkv::detail::paper_spans;

// Every head's window tokens [w0, w1) get the head's maximum over [k0, k1) (1 if empty), raised for recency.
inline void pad_with_span_max(float* scores, std::int64_t ld, std::int64_t heads, std::int64_t k0, std::int64_t k1,
                              std::int64_t w0, std::int64_t w1) {
  for (std::int64_t h = 0; h < heads; ++h) {
    float m = 1.f;
    if (k1 > k0) m = *std::max_element(scores + h * ld + k0, scores + h * ld + k1);
    for (std::int64_t t = w0; t < w1; ++t)
      scores[h * ld + t] = fairkv::detail::raised_by(m, static_cast<std::uint32_t>(t - w0));
  }
}

template <class S, class KeySource, class Q>
result score_paper(const S& scorer, const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L,
                   const paper_spans& sp, float* scores, std::int64_t ld, float* tmp) {
  const std::int64_t heads = in.keys.heads;
  const std::int64_t split = sp.split;
  if constexpr (S::source == score_source::position && fairkv::detail::is_streaming_llm_v<S>) {
    const std::int64_t sinks = std::min<std::int64_t>(scorer.n_sink, L);
    for (std::int64_t h = 0; h < heads; ++h) {
      float* row = scores + h * ld;
      for (std::int64_t t = 0; t < L; ++t) row[t] = fairkv::detail::paper_streaming_score(t, L, split, sinks);
    }
    return {};
  } else if constexpr (!is_attention_source(S::source)) {
    return score_region(scorer, in, b, L, 0, L, scores, ld, tmp);
  } else {
    const std::int64_t qheads = in.q_heads();
    const std::int64_t group = qheads / heads;
    const float scale = in.softmax_scale();
    float* probs = tmp;           // [L]
    float* acc = tmp + L;         // [L]
    float* pooled = tmp + 2 * L;  // [L]
    if constexpr (S::source == score_source::window_attention) {
      const auto windows = fairkv::detail::paper_window_split(scorer.window, split, L);
      const std::int64_t spans[2][3] = {{0, split, windows.earlier}, {split, L, windows.later}};  // begin, end, window
      for (const auto& span : spans) {
        const std::int64_t k0 = span[0], w = span[2], k1 = span[1] - w;  // scored keys [k0, k1), window [k1, end)
        for (std::int64_t h = 0; h < heads; ++h) {
          std::fill(scores + h * ld + k0, scores + h * ld + k1, 0.f);
          if (w == 0) continue;
          for (std::int64_t g = 0; g < group; ++g) {
            std::fill(acc, acc + (k1 - k0), 0.f);
            for (std::int64_t p = k1; p < span[1]; ++p) {
              FAIRKV_TRY(attention_row(in, b, L, h * group + g, group, p, 0, scale, probs));
              for (std::int64_t t = k0; t < k1; ++t) acc[t - k0] += probs[t];
            }
            add_pooled_window_mean(acc, k1 - k0, w, scorer.kernel, pooled, scores + h * ld + k0);
          }
          for (std::int64_t t = k0; t < k1; ++t) scores[h * ld + t] /= static_cast<float>(group);
        }
        if (w > 0) pad_with_span_max(scores, ld, heads, k0, k1, k1, span[1]);
      }
      return {};
    } else if constexpr (S::source == score_source::last_attention) {
      const std::int64_t spans[2][2] = {{0, split}, {split, L}};
      for (const auto& span : spans) {
        const std::int64_t k0 = span[0], anchor = span[1] - 1;
        std::fill(acc, acc + (anchor - k0), 0.f);
        for (std::int64_t qh = 0; qh < qheads; ++qh) {
          FAIRKV_TRY(attention_row(in, b, L, qh, group, anchor, 0, scale, probs));
          for (std::int64_t t = k0; t < anchor; ++t) acc[t - k0] += probs[t];
        }
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t t = k0; t < anchor; ++t) scores[h * ld + t] = acc[t - k0] / static_cast<float>(qheads);
        pad_with_span_max(scores, ld, heads, k0, anchor, anchor, anchor + 1);
      }
      return {};
    } else if constexpr (S::source == score_source::observed_attention) {
      for (std::int64_t h = 0; h < heads; ++h) {
        std::fill(scores + h * ld, scores + h * ld + L, 0.f);
        for (std::int64_t g = 0; g < group; ++g) {
          std::fill(acc, acc + L, 0.f);
          for (std::int64_t p = 0; p < L; ++p) {
            FAIRKV_TRY(attention_row(in, b, L, h * group + g, group, p, 0, scale, probs));
            // A later-span query does not vote for keys of the earlier original span.
            const bool later_query = p >= split && p < sp.later_end;
            for (std::int64_t t = 0; t <= p; ++t)
              if (!(later_query && t >= sp.earlier_begin && t < split)) acc[t] += probs[t];
          }
          for (std::int64_t t = 0; t < L; ++t) {
            const std::int64_t seen = (t >= sp.earlier_begin && t < split) ? split - t : L - t;
            scores[h * ld + t] += acc[t] / static_cast<float>(std::max<std::int64_t>(seen, 1));
          }
        }
        for (std::int64_t t = 0; t < L; ++t) scores[h * ld + t] /= static_cast<float>(group);
      }
      return {};
    } else {
      static_assert(dependent_false<S>, "fairkv::cpu: unknown score_source");
    }
  }
}

}  // namespace fairkv::cpu::detail
