// Fair eviction exactly as the paper's code does it ("The Pitfalls of KV Cache Compression", Chen et al. 2025,
// its {knorm,snapkv,tova,observed_attention,streamingllm}_fair_eviction presses): two adjacent segments, the
// defense and the system instructions, in either order.
//
// - The two spans are widened to cover the whole sequence: the earlier owns [0, its end), the later
//   [its begin, L), so chat-template tokens belong to a span and there is no remainder group.
// - The earlier span keeps floor(n_keep * len_earlier / L) tokens, the later the rest (no largest remainder).
// - Segment-local statistics are slices of the full causal softmax, not re-normalised per span; SnapKV's window
//   budget is split (window / 2 to the earlier span) and each window is padded with its span's maximum; TOVA is
//   anchored at each span's last token; H2O drops the attention from the later original span to the earlier one
//   and divides by the number of queries left. StreamingLLM ramps each span and keeps one global top-k.
//   (cpu/score_paper.hpp has the formulas; the CUDA backend computes the same with its attention kernels,
//   cuda/detail/score_attention.cuh, and the shared pieces in detail/paper_spans.hpp.)
// - Sinks are off by default (the paper keeps none explicitly); `protect.n_sink` turns them on. A whitelist and
//   boundary tokens are charged to the widened span they sit in.
// The proportional mode (allocators/fair.hpp) is fairkv's default; docs/kvpress-semantics.md compares the two.
#pragma once

#include <algorithm>
#include <span>

#include "fairkv/allocator.hpp"
#include "fairkv/allocators/protection.hpp"

namespace fairkv::allocators {

struct fair_paper {
  static constexpr bool uses_segments = true;
  static constexpr bool uses_whitelist = true;
  static constexpr bool segment_local = true;
  static constexpr bool needs_own_allocation = false;
  static constexpr bool paper_spans = true;  // the planner widens the two spans and scores them as the paper does
  static constexpr const char* name = "fair_paper";

  protection protect{0, 0};

  // Groups: the two widened spans in position order, or one group (StreamingLLM's global top-k).
  [[nodiscard]] result allocate(const allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    const auto g = static_cast<std::size_t>(ctx.groups());
    for (std::int64_t h = 0; h < ctx.heads; ++h) {
      std::int64_t* b = budgets.data() + h * static_cast<std::int64_t>(g);
      if (g == 1) {
        b[0] = ctx.n_keep;
        continue;
      }
      const std::int64_t len = ctx.sizes[0] + ctx.sizes[1];
      std::int64_t earlier = ctx.n_keep * ctx.sizes[0] / len;
      // The paper's split cannot violate these; forced tokens (whitelist, sinks) can, and win.
      earlier = std::clamp(earlier, std::max(ctx.forced[0], ctx.n_keep - ctx.sizes[1]),
                           std::min(ctx.sizes[0], ctx.n_keep - ctx.forced[1]));
      b[0] = earlier;
      b[1] = ctx.n_keep - earlier;
    }
    return {};
  }
};
static_assert(SegmentAllocator<fair_paper>);

}  // namespace fairkv::allocators
