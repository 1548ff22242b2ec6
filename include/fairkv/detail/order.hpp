// The one total order of the library, shared by every backend: higher score first, NaN last (evicted first),
// -0 equal to +0, and on equal scores the lower token index first. Encoding it as a 64-bit key lets the CPU use
// plain integer nth_element and the GPU a radix select, with bit-identical results.
#pragma once

#include <bit>
#include <cstdint>

#include "fairkv/config.hpp"

namespace fairkv::detail {

// Order-preserving map float -> uint32 (larger float, larger code), NaN -> 0 (below -inf).
[[nodiscard]] FAIRKV_HOST_DEVICE constexpr std::uint32_t order_bits(float f) noexcept {
  if (f != f) return 0u;
  if (f == 0.0f) f = 0.0f;  // -0 and +0 tie
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// Larger key = kept first.
[[nodiscard]] FAIRKV_HOST_DEVICE constexpr std::uint64_t selection_key(float score, std::uint32_t index) noexcept {
  return (static_cast<std::uint64_t>(order_bits(score)) << 32) | static_cast<std::uint64_t>(~index);
}

[[nodiscard]] FAIRKV_HOST_DEVICE constexpr std::uint32_t key_index(std::uint64_t key) noexcept {
  return ~static_cast<std::uint32_t>(key);
}

// The score `steps` places above `score` in the order above (one ulp per step), saturating at the largest finite
// float. Scorers that pad a run of tokens with one value (SnapKV's window) raise token j of the run by j steps,
// so when the budget cannot keep the whole run the most recent tokens win the tie, not the earliest, while every
// padded token still outranks every scored one.
[[nodiscard]] FAIRKV_HOST_DEVICE constexpr float raised_by(float score, std::uint32_t steps) noexcept {
  constexpr std::uint32_t top = 0xFF7FFFFFu;  // order_bits(FLT_MAX)
  const std::uint32_t code = order_bits(score);
  const std::uint32_t raised = code >= top || top - code < steps ? (code > top ? code : top) : code + steps;
  return std::bit_cast<float>((raised & 0x80000000u) != 0u ? (raised & 0x7FFFFFFFu) : ~raised);
}

}  // namespace fairkv::detail
