#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fairkv/dtype.hpp"

using fairkv::bfloat16_t;
using fairkv::from_float;
using fairkv::half_t;
using fairkv::to_float;

TEST_CASE("half_t converts exactly like the compiler's _Float16, for every bit pattern and rounding case") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const half_t h{static_cast<std::uint16_t>(bits)};
    _Float16 ref;
    const auto b16 = static_cast<std::uint16_t>(bits);
    std::memcpy(&ref, &b16, 2);
    const float f = to_float(h);
    if (std::isnan(f) != std::isnan(static_cast<float>(ref))) ++mismatches;
    if (!std::isnan(f)) {
      if (std::bit_cast<std::uint32_t>(f) != std::bit_cast<std::uint32_t>(static_cast<float>(ref))) ++mismatches;
      if (from_float<half_t>(f).bits != bits) ++mismatches;  // round trip
    }
  }
  CHECK(mismatches == 0);
  // Rounding: random floats over the whole range, including subnormals and overflow.
  std::uint32_t s = 12345;
  for (int i = 0; i < 2000000; ++i) {
    s = s * 1664525u + 1013904223u;
    const float f = std::bit_cast<float>(s);
    if (std::isnan(f)) continue;
    const _Float16 r = static_cast<_Float16>(f);
    std::uint16_t rb;
    std::memcpy(&rb, &r, 2);
    if (from_float<half_t>(f).bits != rb) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16_t: exact widening, round-to-nearest-even narrowing, NaN stays NaN") {
  CHECK(to_float(bfloat16_t{0x3F80}) == 1.0f);
  CHECK(to_float(bfloat16_t{0xC000}) == -2.0f);
  CHECK(from_float<bfloat16_t>(1.0f).bits == 0x3F80);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(from_float<bfloat16_t>(1.0f + 0.00390625f).bits == 0x3F80);
  // 1 + 3 * 2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even (up).
  CHECK(from_float<bfloat16_t>(1.0f + 3 * 0.00390625f).bits == 0x3F82);
  CHECK(std::isnan(to_float(from_float<bfloat16_t>(std::nanf("")))));
  CHECK(std::isinf(to_float(from_float<bfloat16_t>(INFINITY))));
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = to_float(bfloat16_t{static_cast<std::uint16_t>(bits)});
    if (!std::isnan(f)) REQUIRE(from_float<bfloat16_t>(f).bits == bits);
  }
}
