// Overflow-checked 64-bit arithmetic for validating engine-supplied extents and strides. A view's fields come
// from outside the library: a product like stride_head * (heads - 1) is signed overflow (undefined behaviour)
// before anything can compare it, so every such product and sum goes through these.
#pragma once

#include <cstdint>

namespace fairkv::detail {

// Portable forms, used where the compiler has no overflow builtins (and tested against 128-bit arithmetic).
[[nodiscard]] constexpr bool checked_mul_portable(std::int64_t a, std::int64_t b, std::int64_t& out) noexcept {
  if (a == 0 || b == 0) {
    out = 0;
    return true;
  }
  if ((a == -1 && b == INT64_MIN) || (b == -1 && a == INT64_MIN)) return false;
  // Compare against the limit by division (truncating towards zero), so nothing overflows on the way.
  const bool fits = (a < 0) != (b < 0) ? (a < 0 ? a >= INT64_MIN / b : b >= INT64_MIN / a)
                                       : (a < 0 ? a >= INT64_MAX / b : a <= INT64_MAX / b);
  if (!fits) return false;
  out = a * b;
  return true;
}
[[nodiscard]] constexpr bool checked_add_portable(std::int64_t a, std::int64_t b, std::int64_t& out) noexcept {
  if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return false;
  out = a + b;
  return true;
}

// `out` = a * b; false (and `out` unspecified) when the exact result does not fit in int64.
[[nodiscard]] constexpr bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  return !__builtin_mul_overflow(a, b, &out);
#else
  return checked_mul_portable(a, b, out);
#endif
}

// `out` = a + b; false when the exact result does not fit in int64.
[[nodiscard]] constexpr bool checked_add(std::int64_t a, std::int64_t b, std::int64_t& out) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  return !__builtin_add_overflow(a, b, &out);
#else
  return checked_add_portable(a, b, out);
#endif
}

// a * b, or INT64_MAX when it does not fit. For the view helpers, which cannot report an error: a saturated
// stride is always rejected by validate() (see views/extent.hpp) as an overflow naming that stride.
[[nodiscard]] constexpr std::int64_t saturating_mul(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t out = 0;
  return checked_mul(a, b, out) ? out : INT64_MAX;
}

}  // namespace fairkv::detail
