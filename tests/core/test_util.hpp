// Shared helpers of the core suite: random caches and an independent, deliberately naive reference of the
// selection rules (full sort with an explicit comparator instead of the library's 64-bit keys).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "fairkv/fairkv.hpp"

namespace fairkv_test {

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// "a is kept before b": higher score, NaN last, -0 == +0, lower index on ties.
inline bool better(float sa, int ia, float sb, int ib) {
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return ia < ib;
}

// Reference top-k of `candidates` (token indices) under `score`, returned sorted ascending.
inline std::vector<int> reference_top(const std::vector<int>& candidates, const std::vector<float>& score, int k) {
  std::vector<int> c = candidates;
  std::sort(c.begin(), c.end(), [&](int a, int b) { return better(score[a], a, score[b], b); });
  c.resize(static_cast<std::size_t>(std::clamp<int>(k, 0, static_cast<int>(c.size()))));
  std::sort(c.begin(), c.end());
  return c;
}

inline void check_plan_invariants(const fairkv::keep_plan& plan) {
  for (std::int64_t b = 0; b < plan.batch(); ++b)
    for (std::int64_t h = 0; h < plan.heads(); ++h) {
      const auto kept = plan.kept(b, h);
      for (std::size_t i = 0; i < kept.size(); ++i) {
        REQUIRE(kept[i] >= 0);
        REQUIRE(kept[i] < plan.length(b));
        if (i > 0) REQUIRE(kept[i] > kept[i - 1]);
      }
    }
}

}  // namespace fairkv_test
