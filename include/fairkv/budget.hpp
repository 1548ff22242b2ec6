// The layer budget: how many tokens each KV head of a sequence keeps at a compression ratio. Public because
// engines size their caches and report results with it; both backends' planners use exactly this function.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fairkv {

// floor(L * (1 - ratio)) as kvpress computes it (in double), and at least one token so a high ratio never empties
// a head (kvpress PR #264). ratio is checked by the planners (in [0, 1)); here it is taken as given.
[[nodiscard]] constexpr std::int64_t keep_budget(std::int64_t tokens, double ratio) noexcept {
  if (tokens <= 0) return 0;
  const auto n = static_cast<std::int64_t>(static_cast<double>(tokens) * (1.0 - ratio));
  return std::clamp<std::int64_t>(n, 1, tokens);
}

}  // namespace fairkv
