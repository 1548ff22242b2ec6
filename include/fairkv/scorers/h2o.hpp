// H2O / observed attention (kvpress ObservedAttentionPress): sum over queries q >= k of A[q, k], divided by the
// number of those queries (L - k), mean over the GQA group.
#pragma once

#include "fairkv/scorer.hpp"

namespace fairkv::scorers {

struct h2o {
  static constexpr score_source source = score_source::observed_attention;
  static constexpr const char* name = "h2o";
};
static_assert(Scorer<h2o>);

}  // namespace fairkv::scorers
