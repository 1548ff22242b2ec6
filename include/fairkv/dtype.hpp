// 16-bit storage types for the host side. They are bit-compatible with CUDA's __half and __nv_bfloat16
// (the CUDA backend reinterprets engine buffers), so a view over engine memory never needs a conversion pass.
// Scores are always computed in float.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "fairkv/config.hpp"

namespace fairkv {

struct half_t {
  std::uint16_t bits;
};
struct bfloat16_t {
  std::uint16_t bits;
};
static_assert(sizeof(half_t) == 2 && std::is_trivially_copyable_v<half_t>);
static_assert(sizeof(bfloat16_t) == 2 && std::is_trivially_copyable_v<bfloat16_t>);

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, half_t> || std::is_same_v<T, bfloat16_t>;

template <class T>
concept element_type = is_element_type_v<std::remove_const_t<T>>;

[[nodiscard]] constexpr float to_float(float x) noexcept { return x; }

[[nodiscard]] constexpr float to_float(bfloat16_t x) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}

[[nodiscard]] constexpr float to_float(half_t x) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  std::uint32_t exp = (x.bits >> 10) & 0x1Fu;
  std::uint32_t mant = x.bits & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal half: normalise into a float exponent.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    exp = static_cast<std::uint32_t>(127 - 15 - e);
    return std::bit_cast<float>(sign | (exp << 23) | ((mant & 0x3FFu) << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

template <class T>
[[nodiscard]] constexpr T from_float(float f) noexcept;

template <>
[[nodiscard]] constexpr float from_float<float>(float f) noexcept {
  return f;
}

template <>
[[nodiscard]] constexpr bfloat16_t from_float<bfloat16_t>(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return {static_cast<std::uint16_t>((u >> 16) | 0x40u)};  // quiet nan
  const std::uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  return {static_cast<std::uint16_t>((u + rounding) >> 16)};
}

template <>
[[nodiscard]] constexpr half_t from_float<half_t>(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return {static_cast<std::uint16_t>(sign | 0x7E00u)};
  if (a >= 0x477FF000u) return {static_cast<std::uint16_t>(sign | 0x7C00u)};  // overflow (after rounding) -> inf
  if (a < 0x38800000u) {
    // Result is subnormal or zero in half: shift the implicit-one mantissa, round to nearest even.
    if (a < 0x33000000u) return {sign};
    const std::uint32_t e = a >> 23;
    const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14 + (127 - 1 - e) - 13 ... so that 2^-24 maps to 1
    const std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    const std::uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return {static_cast<std::uint16_t>(sign | r)};
  }
  const std::uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
  return {static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}

}  // namespace fairkv
