// TOVA (kvpress TOVAPress): attention row of the last query, mean over all query heads, the same score for every
// KV head; the last token scores max + 1.
#pragma once

#include "fairkv/scorer.hpp"

namespace fairkv::scorers {

struct tova {
  static constexpr score_source source = score_source::last_attention;
  static constexpr const char* name = "tova";
};
static_assert(Scorer<tova>);

}  // namespace fairkv::scorers
