// The pieces of the paper's two-span mode (allocators/fair_paper.hpp) that every backend computes the same way:
// the spans, the SnapKV window split and the StreamingLLM ramps. Host and device code (no Eigen, no CUDA), so
// the CPU oracle (cpu/score_paper.hpp) and the CUDA backend evaluate the same float expressions.
#pragma once

#include <cstdint>

#include "fairkv/config.hpp"
#include "fairkv/rounded_math.hpp"

namespace fairkv::detail {

struct paper_spans {
  std::int64_t earlier_begin = 0;  // the earlier original span [earlier_begin, split)
  std::int64_t split = 0;          // end of the earlier span = begin of the later one
  std::int64_t later_end = 0;      // the later original span [split, later_end)
};

// torch.linspace(0.1, 0.9, n) in float32, element i (the halves are computed from either end, as torch does).
[[nodiscard]] FAIRKV_HOST_DEVICE inline float linspace_01_09(std::int64_t i, std::int64_t n) noexcept {
  if (n == 1) return 0.1f;
  const float start = 0.1f, end = 0.9f, step = (end - start) / static_cast<float>(n - 1);
  // start + step * i and end - step * (n - 1 - i), each product rounded before its sum on every
  // backend (rounded_math.hpp).
  return i < n / 2 ? mul_add_rounded(step, static_cast<float>(i), start)
                   : mul_add_rounded(-step, static_cast<float>(n - 1 - i), end);
}

// The paper's StreamingLLM score of token t (L tokens, the first `sinks` of them sinks): 1 for a sink, else the
// 0.1 .. 0.9 ramp of its span, [sinks, split) or [split, L).
[[nodiscard]] FAIRKV_HOST_DEVICE inline float paper_streaming_score(std::int64_t t, std::int64_t L, std::int64_t split,
                                                                    std::int64_t sinks) noexcept {
  if (t < sinks) return 1.f;
  return t < split ? linspace_01_09(t - sinks, split - sinks) : linspace_01_09(t - split, L - split);
}

// SnapKV's window budget: window / 2 to the earlier span [0, split), the rest to the later [split, L), each
// capped at its span's length.
struct paper_windows {
  std::int64_t earlier, later;
};
[[nodiscard]] constexpr paper_windows paper_window_split(std::int64_t window, std::int64_t split,
                                                         std::int64_t L) noexcept {
  const std::int64_t e = window / 2 < split ? window / 2 : split;
  const std::int64_t l = window - e < L - split ? window - e : L - split;
  return {e, l};
}

}  // namespace fairkv::detail
