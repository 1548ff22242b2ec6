#pragma once
#include "fairkv/selector.hpp"

namespace fairkv::selectors {

// AdaKV-style: within each segment every head first keeps floor(alpha_safeguard * budget) of its best tokens
// (whitelisted ones count towards it), then the rest of the segment's budget summed over heads goes to the best
// remaining (head, token) pairs of the whole layer. Per-head counts become ragged, which a paged engine can really
// free (kvpress only masks).
struct head_adaptive {
  static constexpr selection_kind kind = selection_kind::head_adaptive;
  static constexpr const char* name = "head_adaptive";
  float alpha_safeguard = 0.20f;
};
static_assert(Selector<head_adaptive>);

}  // namespace fairkv::selectors
