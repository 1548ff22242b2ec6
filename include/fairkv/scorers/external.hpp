// External scores: the caller computed the importance of every cached token itself (an engine's own scorer, a
// kvpress press, a learned model) and passes them in layer_inputs::scores, [batch, kv_heads, tokens], higher =
// keep. fairkv reads them as they are and applies its allocators, selectors and compaction to them.
// Scoring is the caller's business: segment-local scoring (each segment scored on its own, as the paper does for
// attention scorers) must be done by the caller before the scores reach fairkv. fair_paper, which computes the
// paper's own per-span statistics from keys and queries, refuses external scores.
// NaN and infinities follow the library's total order (detail/order.hpp): a NaN score is evicted first, +inf kept
// first, -inf evicted before every finite score; forced tokens (whitelist, sinks, boundaries) are kept whatever
// their score.
#pragma once

#include "fairkv/scorer.hpp"

namespace fairkv::scorers {

struct external {
  static constexpr score_source source = score_source::external;
  static constexpr const char* name = "external";
};
static_assert(Scorer<external>);

}  // namespace fairkv::scorers
