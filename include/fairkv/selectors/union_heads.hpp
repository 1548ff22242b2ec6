#pragma once
#include "fairkv/selector.hpp"

namespace fairkv::selectors {

// One token set for every KV head, chosen on the mean score over heads (a NaN in any head makes the token
// score NaN and it goes first). A paged engine can then free whole pages. Named union_heads because `union` is
// a keyword; like every policy its name is its type's name. fairkv::parse still accepts the older "union".
struct union_heads {
  static constexpr selection_kind kind = selection_kind::union_heads;
  static constexpr const char* name = "union_heads";
};
static_assert(Selector<union_heads>);

}  // namespace fairkv::selectors
