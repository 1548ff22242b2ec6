// The layer budget: how many tokens each KV head of a sequence keeps, at a compression ratio or at a fixed token
// budget. Public because engines size their caches and report results with it; both backends' planners use
// exactly these functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace fairkv {

// floor(L * (1 - ratio)) as kvpress computes it (in double), and at least one token so a high ratio never empties
// a head (kvpress PR #264). ratio is checked by the planners (in [0, 1)); here it is taken as given.
[[nodiscard]] constexpr std::int64_t keep_budget(std::int64_t tokens, double ratio) noexcept {
  if (tokens <= 0) return 0;
  const auto n = static_cast<std::int64_t>(static_cast<double>(tokens) * (1.0 - ratio));
  return std::clamp<std::int64_t>(n, 1, tokens);
}

// What a plan keeps: a ratio (the fraction of each sequence evicted, kvpress's `compression_ratio`) or a token
// budget (tokens kept per KV head, what an engine with a fixed cache size asks for: kvpress issue #102). Exactly
// one is set; the planners refuse anything else with status::invalid_argument (detail/validate.hpp):
//   - a ratio outside [0, 1);
//   - a token budget below 1: a budget of 0 would empty the cache, which is the engine's decision (free the
//     sequence), not a plan's; kvpress's "never empty a head" rule holds for both kinds;
//   - a ratio other than 0 together with a token budget.
// A sequence shorter than the token budget is kept whole: the budget is a ceiling, not a target to pad to.
// A bare double converts to a ratio, so every call that passed a ratio still compiles and means the same.
struct keep_target {
  double ratio = 0.0;        // fraction evicted, in [0, 1)
  std::int64_t tokens = 0;   // tokens kept per KV head, >= 1; read only where by_tokens()
  bool token_budget = false; // a flag, not a sentinel value of `tokens`: every int64 a caller passes is checked

  constexpr keep_target() noexcept = default;
  constexpr keep_target(double r) noexcept : ratio(r) {}  // NOLINT(google-explicit-constructor): a ratio is a target

  [[nodiscard]] static constexpr keep_target of_ratio(double r) noexcept { return keep_target(r); }
  [[nodiscard]] static constexpr keep_target of_tokens(std::int64_t n) noexcept {
    keep_target t;
    t.tokens = n;
    t.token_budget = true;
    return t;
  }
  [[nodiscard]] constexpr bool by_tokens() const noexcept { return token_budget; }

  // Tokens each KV head of a sequence of L tokens keeps: keep_budget(L, ratio), or min(tokens, L). The target is
  // taken as given (the planners validate it first); a negative token budget gives 0 here.
  [[nodiscard]] constexpr std::int64_t n_keep(std::int64_t L) const noexcept {
    if (L <= 0) return 0;
    return by_tokens() ? std::clamp<std::int64_t>(tokens, 0, L) : keep_budget(L, ratio);
  }
};

namespace detail {

// "ratio 0.5" or "a budget of 8 tokens": the end of the planners' budget_exceeded messages. The ratio's wording
// is the one the messages had before token budgets existed (tests and logs compare them).
struct target_text {
  char text[48] = {};
};
[[nodiscard]] inline target_text describe_target(const keep_target& t) noexcept {
  target_text d;
  if (t.by_tokens())
    std::snprintf(d.text, sizeof(d.text), "a budget of %lld tokens", static_cast<long long>(t.tokens));
  else
    std::snprintf(d.text, sizeof(d.text), "ratio %g", t.ratio);
  return d;
}

}  // namespace detail
}  // namespace fairkv
