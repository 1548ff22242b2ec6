#pragma once
#include "fairkv/selector.hpp"

namespace fairkv::selectors {

// Each KV head keeps its own top-b tokens per (head, segment) budget (kvpress default).
struct per_head {
  static constexpr selection_kind kind = selection_kind::per_head;
  static constexpr const char* name = "per_head";
};
static_assert(Selector<per_head>);

}  // namespace fairkv::selectors
