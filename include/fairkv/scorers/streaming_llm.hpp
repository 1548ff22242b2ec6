// StreamingLLM (kvpress StreamingLLMPress): keep the first n_sink tokens and the most recent ones.
// kvpress scores 1/0 for a single budget; here sinks score +inf and the rest a recency ramp, so the kept set
// under a uniform budget is the same as kvpress's, and a whitelist or a per-segment budget still keeps the most
// recent tokens of each segment.
#pragma once

#include <cstdint>
#include <limits>

#include "fairkv/scorer.hpp"

namespace fairkv::scorers {

template <int NSink = 4>
struct streaming_llm {
  static_assert(NSink >= 0, "streaming_llm<NSink>: NSink must be non-negative");
  static constexpr score_source source = score_source::position;
  static constexpr const char* name = "streaming_llm";

  std::int32_t n_sink = NSink;

  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr float operator()(const token_info& where) const noexcept {
    if (where.index < n_sink) return std::numeric_limits<float>::infinity();
    return static_cast<float>(where.index);  // exact up to 2^24 tokens; ties beyond resolve to the lower index
  }
};
static_assert(Scorer<streaming_llm<>>);

}  // namespace fairkv::scorers
