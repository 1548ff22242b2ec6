// K-Norm (kvpress KnormPress): score = -||k||_2; small-norm keys attract attention and are kept.
#pragma once

#include <cmath>

#include "fairkv/rounded_math.hpp"
#include "fairkv/scorer.hpp"

namespace fairkv::scorers {

struct knorm {
  static constexpr score_source source = score_source::keys;
  static constexpr const char* name = "knorm";

  template <class Row>
  [[nodiscard]] FAIRKV_HOST_DEVICE float operator()(const Row& k, const token_info& /*where*/) const noexcept {
    // Sixteen partial sums, then a fixed pairwise tree: one AVX-512 register, two AVX2 or four SSE registers
    // without -ffast-math, and one summation order on every host and the device. Each square is rounded before
    // its sum on the device whatever nvcc's -fmad (rounded_math.hpp); on the host, fused only where the
    // engine's flags enable FMA contraction. g++ 12 with -march=native turns four scalar sums into shuffles and
    // scalar adds (docs/design-notes.md, "Kernel choices, measured").
    constexpr int lanes = 16;
    float s[lanes] = {};
    const std::int64_t n = k.size();
    std::int64_t i = 0;
    for (; i + lanes <= n; i += lanes)
      for (int j = 0; j < lanes; ++j) {
        const float x = k[i + j];
        s[j] = mul_add_rounded(x, x, s[j]);
      }
    for (int j = 0; i < n; ++i, ++j) {
      const float x = k[i];
      s[j] = mul_add_rounded(x, x, s[j]);
    }
    for (int half = lanes / 2; half > 0; half /= 2)
      for (int j = 0; j < half; ++j) s[j] += s[j + half];
    return -std::sqrt(s[0]);
  }
};
static_assert(Scorer<knorm>);

}  // namespace fairkv::scorers
