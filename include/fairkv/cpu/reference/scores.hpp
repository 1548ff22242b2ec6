// The scores every backend computes, written as their definitions (docs/kvpress-semantics.md): plain loops in
// double, one query row and one key at a time, no blocking, no SIMD, no Eigen. Slow on purpose (a softmax row is
// recomputed for every use) and simple enough to check by reading. The CPU backend's fast paths (cpu/score.hpp,
// the attention tiles) are held against it (tests/core/test_reference_scores.cpp); where float rounding keeps them
// from being bit-equal, this is the value they round.
//
// One scoring region [rb, re) of sequence b (the whole sequence, or one region of segment-local scoring,
// fairkv/scoring_regions.hpp), every KV head: out[h * (re - rb) + (t - rb)].
//  - position, keys: the scorer's own function (there is nothing else to compare it with).
//  - external: the caller's score.
//  - attention (from the queries; the engine's attention rows are the same softmax and are checked against the
//    queries elsewhere): a query at position p attends the region's keys [rb, p], softmax(scale * q.k).
//    SnapKV: the w = min(window, n - 1) last queries of the region; each scored key t < re - w gets the window's
//      mean attention, average-pooled over the scored keys (kernel, zero padding, divisor kernel), then the mean
//      over the KV head's query group. TOVA: the last query's attention, mean over every query head (the same for
//      every KV head). H2O: the sum of every query's attention to t divided by the queries that see t (re - t),
//      mean over the group.
//    The tokens SnapKV's window and TOVA's last query occupy are not scored but kept first: +infinity here (the
//    planners give them max + 1 raised by their index, detail/order.hpp). A one-token SnapKV region is its own
//    window and scores 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/detail/protected_tokens.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cpu::reference {

namespace detail {

// softmax(scale * q . k_t) over t in [rb, p] for query head qh at position p of sequence b, in double.
template <class KeySource, class Q>
std::vector<double> attention_row(const layer_inputs<KeySource, Q>& in, std::int64_t b, std::int64_t L,
                                  std::int64_t qh, std::int64_t p, std::int64_t rb) {
  const std::int64_t d = in.keys.head_dim, group = in.q_heads() / in.keys.heads;
  const std::int64_t qi = p - (L - in.queries.tokens);
  const auto* q = in.queries.row(b, qh, qi);
  const double scale = in.softmax_scale();
  std::vector<double> row(static_cast<std::size_t>(p - rb + 1));
  double top = -std::numeric_limits<double>::infinity();
  for (std::int64_t t = rb; t <= p; ++t) {
    const auto* k = in.keys.row(b, qh / group, t);
    double dot = 0.0;
    for (std::int64_t i = 0; i < d; ++i)
      dot += static_cast<double>(to_float(q[i * in.queries.stride_dim])) * to_float(k[i * in.keys.stride_dim]);
    row[static_cast<std::size_t>(t - rb)] = scale * dot;
    top = std::max(top, scale * dot);
  }
  double sum = 0.0;
  for (double& x : row) sum += (x = std::exp(x - top));
  for (double& x : row) x /= sum;
  return row;
}

}  // namespace detail

template <class S, class KeySource, class Q>
[[nodiscard]] result score_region(const S& scorer, const layer_inputs<KeySource, Q>& in, std::int64_t b,
                                  std::int64_t rb, std::int64_t re, std::vector<double>& out) {
  // The sequence is checked before its length is read.
  const bool in_batch = b >= 0 && b < in.keys.batch;
  const std::int64_t heads = in.keys.heads, L = in_batch ? in.keys.tokens_of(b) : 0, n = re - rb;
  if (!in_batch || rb < 0 || re > L || n <= 0)
    return result::error(status::invalid_argument, "reference::score_region: no region [%lld, %lld) in sequence %lld",
                         static_cast<long long>(rb), static_cast<long long>(re), static_cast<long long>(b));
  out.assign(static_cast<std::size_t>(heads * n), 0.0);
  auto at = [&](std::int64_t h, std::int64_t t) -> double& { return out[static_cast<std::size_t>(h * n + t - rb)]; };
  constexpr double keep_first = std::numeric_limits<double>::infinity();

  if constexpr (S::source == score_source::position) {
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = rb; t < re; ++t) at(h, t) = scorer(token_info{t, L, h, b});
  } else if constexpr (S::source == score_source::keys) {
    using T = typename KeySource::value_type;
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = rb; t < re; ++t)
        at(h, t) = scorer(key_row<T, false>{in.keys.row(b, h, t), in.keys.head_dim, in.keys.stride_dim},
                          token_info{t, L, h, b});
  } else if constexpr (S::source == score_source::external) {
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = rb; t < re; ++t) at(h, t) = in.scores.at(b, h, t);
  } else {
    if (in.queries.data == nullptr)
      return result::error(status::missing_input, "reference::score_region: attention is computed from queries");
    const std::int64_t qheads = in.q_heads(), group = qheads / heads;
    std::int64_t w = 0;  // SnapKV's window
    if constexpr (S::source == score_source::window_attention) w = std::min<std::int64_t>(scorer.window, n - 1);
    // The first query the region needs must be among the given ones (the last queries.tokens positions).
    const std::int64_t first_query = S::source == score_source::window_attention ? re - std::max<std::int64_t>(w, 1)
                                     : S::source == score_source::last_attention ? re - 1
                                                                                 : rb;
    if (first_query < L - in.queries.tokens)
      return result::error(status::missing_input, "reference::score_region: the query at %lld is not given",
                           static_cast<long long>(first_query));
    if constexpr (S::source == score_source::window_attention) {
      const std::int64_t m = n - w, half = scorer.kernel / 2;
      if (w == 0) {
        for (std::int64_t h = 0; h < heads; ++h) at(h, rb) = 1.0;
        return {};
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t qh = h * group; qh < (h + 1) * group; ++qh) {
          std::vector<double> mean(static_cast<std::size_t>(m), 0.0);
          for (std::int64_t p = re - w; p < re; ++p) {
            const std::vector<double> row = detail::attention_row(in, b, L, qh, p, rb);
            for (std::int64_t t = 0; t < m; ++t)
              mean[static_cast<std::size_t>(t)] += row[static_cast<std::size_t>(t)] / static_cast<double>(w);
          }
          for (std::int64_t t = 0; t < m; ++t) {
            double pooled = 0.0;
            for (std::int64_t j = std::max<std::int64_t>(0, t - half); j <= std::min(m - 1, t + half); ++j)
              pooled += mean[static_cast<std::size_t>(j)];
            at(h, rb + t) += pooled / static_cast<double>(scorer.kernel * group);
          }
        }
        for (std::int64_t t = rb + m; t < re; ++t) at(h, t) = keep_first;
      }
    } else if constexpr (S::source == score_source::last_attention) {
      std::vector<double> mean(static_cast<std::size_t>(n - 1), 0.0);
      for (std::int64_t qh = 0; qh < qheads; ++qh) {
        const std::vector<double> row = detail::attention_row(in, b, L, qh, re - 1, rb);
        for (std::int64_t t = 0; t < n - 1; ++t)
          mean[static_cast<std::size_t>(t)] += row[static_cast<std::size_t>(t)] / static_cast<double>(qheads);
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t t = 0; t < n - 1; ++t) at(h, rb + t) = mean[static_cast<std::size_t>(t)];
        at(h, re - 1) = keep_first;
      }
    } else if constexpr (S::source == score_source::observed_attention) {
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t qh = h * group; qh < (h + 1) * group; ++qh)
          for (std::int64_t p = rb; p < re; ++p) {
            const std::vector<double> row = detail::attention_row(in, b, L, qh, p, rb);
            for (std::int64_t t = rb; t <= p; ++t)
              at(h, t) += row[static_cast<std::size_t>(t - rb)] / static_cast<double>((re - t) * group);
          }
    } else {
      static_assert(dependent_false<S>, "fairkv::cpu::reference: unknown score_source");
    }
  }
  return {};
}

// The paper's two-span statistics (allocators/fair_paper.hpp) for sequence b, every KV head: out[h * L + t], the
// definitions cpu/score_paper.hpp states, in double. The spans are [0, split) and [split, L), scored over the full
// causal softmax ([0, p], never renormalised). The tokens each span keeps first are +infinity here (its SnapKV
// window, its TOVA anchor: the fast path gives them the span's maximum raised by their position).
template <class S, class KeySource, class Q>
[[nodiscard]] result score_paper(const S& scorer, const layer_inputs<KeySource, Q>& in, std::int64_t b,
                                 const fairkv::detail::paper_spans& sp, std::vector<double>& out) {
  const bool in_batch = b >= 0 && b < in.keys.batch;
  const std::int64_t heads = in.keys.heads, L = in_batch ? in.keys.tokens_of(b) : 0, split = sp.split;
  if (!in_batch || split <= 0 || split >= L || sp.earlier_begin < 0 || sp.earlier_begin >= split ||
      sp.later_end <= split || sp.later_end > L)
    return result::error(status::invalid_argument, "reference::score_paper: no spans [%lld, %lld) [%lld, %lld) in "
                         "sequence %lld", static_cast<long long>(sp.earlier_begin), static_cast<long long>(split),
                         static_cast<long long>(split), static_cast<long long>(sp.later_end), static_cast<long long>(b));
  out.assign(static_cast<std::size_t>(heads * L), 0.0);
  auto at = [&](std::int64_t h, std::int64_t t) -> double& { return out[static_cast<std::size_t>(h * L + t)]; };
  constexpr double keep_first = std::numeric_limits<double>::infinity();
  const std::int64_t spans[2][2] = {{0, split}, {split, L}};

  if constexpr (S::source == score_source::position && fairkv::detail::is_streaming_llm_v<S>) {
    // Sinks score 1; each span ramps linearly from 0.1 to 0.9 over its tokens (one token: 0.1).
    const std::int64_t sinks = std::min<std::int64_t>(scorer.n_sink, L);
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < L; ++t) {
        const std::int64_t first = t < split ? sinks : split, n = (t < split ? split : L) - first;
        at(h, t) = t < sinks ? 1.0 : n == 1 ? 0.1 : 0.1 + 0.8 * static_cast<double>(t - first) / static_cast<double>(n - 1);
      }
    return {};
  } else if constexpr (!is_attention_source(S::source)) {
    return score_region(scorer, in, b, 0, L, out);
  } else {
    if (in.queries.data == nullptr || in.queries.tokens < L)
      return result::error(status::missing_input, "reference::score_paper: every position's query is needed");
    const std::int64_t qheads = in.q_heads(), group = qheads / heads;
    if constexpr (S::source == score_source::window_attention) {
      // The window: window / 2 to the earlier span, the rest to the later, each capped at its span.
      const std::int64_t we = std::min<std::int64_t>(scorer.window / 2, split);
      const std::int64_t windows[2] = {we, std::min<std::int64_t>(scorer.window - we, L - split)};
      const std::int64_t half = scorer.kernel / 2;
      for (int s = 0; s < 2; ++s) {
        const std::int64_t k0 = spans[s][0], end = spans[s][1], w = windows[s], k1 = end - w, m = k1 - k0;
        if (w == 0) continue;  // no window: the span scores 0
        for (std::int64_t h = 0; h < heads; ++h) {
          for (std::int64_t qh = h * group; qh < (h + 1) * group; ++qh) {
            std::vector<double> mean(static_cast<std::size_t>(m), 0.0);
            for (std::int64_t p = k1; p < end; ++p) {
              const std::vector<double> row = detail::attention_row(in, b, L, qh, p, 0);
              for (std::int64_t t = 0; t < m; ++t)
                mean[static_cast<std::size_t>(t)] += row[static_cast<std::size_t>(k0 + t)] / static_cast<double>(w);
            }
            for (std::int64_t t = 0; t < m; ++t) {
              double pooled = 0.0;  // avg_pool1d inside the span: zero padding, divisor kernel
              for (std::int64_t j = std::max<std::int64_t>(0, t - half); j <= std::min(m - 1, t + half); ++j)
                pooled += mean[static_cast<std::size_t>(j)];
              at(h, k0 + t) += pooled / static_cast<double>(scorer.kernel * group);
            }
          }
          for (std::int64_t t = k1; t < end; ++t) at(h, t) = keep_first;
        }
      }
    } else if constexpr (S::source == score_source::last_attention) {
      // Each span's last token is its anchor: the other tokens of the span get its attention, mean over every
      // query head.
      for (const auto& span : spans) {
        const std::int64_t anchor = span[1] - 1;
        std::vector<double> mean(static_cast<std::size_t>(anchor - span[0]), 0.0);
        for (std::int64_t qh = 0; qh < qheads; ++qh) {
          const std::vector<double> row = detail::attention_row(in, b, L, qh, anchor, 0);
          for (std::int64_t t = span[0]; t < anchor; ++t)
            mean[static_cast<std::size_t>(t - span[0])] += row[static_cast<std::size_t>(t)] / static_cast<double>(qheads);
        }
        for (std::int64_t h = 0; h < heads; ++h) {
          for (std::int64_t t = span[0]; t < anchor; ++t) at(h, t) = mean[static_cast<std::size_t>(t - span[0])];
          at(h, anchor) = keep_first;
        }
      }
    } else if constexpr (S::source == score_source::observed_attention) {
      // Column sums over the queries that see each key, except that queries of the later original span do not
      // vote for keys of the earlier original span; divided by split - t for those keys, L - t for the others.
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t qh = h * group; qh < (h + 1) * group; ++qh)
          for (std::int64_t p = 0; p < L; ++p) {
            const std::vector<double> row = detail::attention_row(in, b, L, qh, p, 0);
            const bool later_query = p >= split && p < sp.later_end;
            for (std::int64_t t = 0; t <= p; ++t) {
              const bool earlier_key = t >= sp.earlier_begin && t < split;
              if (later_query && earlier_key) continue;
              at(h, t) += row[static_cast<std::size_t>(t)] /
                          static_cast<double>((earlier_key ? split - t : L - t) * group);
            }
          }
    } else {
      static_assert(dependent_false<S>, "fairkv::cpu::reference: unknown score_source");
    }
  }
  return {};
}

}  // namespace fairkv::cpu::reference
