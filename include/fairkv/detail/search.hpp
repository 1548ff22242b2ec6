// The one search the planners need over their sorted tables (runs, attention regions, their rows): the last entry
// whose key is at most a value. Host and device code, so the host front end and the kernels agree by construction.
#pragma once

#include <cstdint>

#include "fairkv/config.hpp"

namespace fairkv::detail {

// Index of the last item of items[0, n) with item.*key <= value, for keys ascending and items[0].*key <= value
// (a tiling of [0, end) by its begins, or by its row offsets). n >= 1.
template <class Item, class Key>
[[nodiscard]] FAIRKV_HOST_DEVICE inline std::int32_t last_at_most(const Item* items, std::int32_t n, Key Item::*key,
                                                                  Key value) noexcept {
  std::int32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const std::int32_t mid = (lo + hi + 1) / 2;
    if (items[mid].*key <= value) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace fairkv::detail
