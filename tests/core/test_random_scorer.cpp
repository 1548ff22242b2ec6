// scorers::random: golden values from an independent implementation of the same hash (Python, integers mod 2^64:
//   mix(z) = splitmix64's finaliser of z + 0x9E3779B97F4A7C15; h = mix(mix(mix(mix(seed) ^ b) ^ h) ^ t);
//   score = (h >> 40) / 2^24), and the properties a random baseline must have.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "fairkv/fairkv.hpp"

using namespace fairkv;

namespace {
float score(std::uint32_t seed, std::int64_t b, std::int64_t h, std::int64_t t) {
  scorers::random s{};
  s.seed = seed;
  return s(token_info{t, 1 << 20, h, b});
}
}  // namespace

TEST_CASE("random: the hash of (seed, batch, head, position), as an independent implementation computes it") {
  // (seed, batch, head, position) -> (h >> 40), from the Python implementation in the header comment.
  CHECK(score(0, 0, 0, 0) * 0x1.0p24f == 2175092.0f);
  CHECK(score(0, 0, 0, 1) * 0x1.0p24f == 2772753.0f);
  CHECK(score(0, 0, 1, 0) * 0x1.0p24f == 14282487.0f);
  CHECK(score(0, 1, 0, 0) * 0x1.0p24f == 13746215.0f);
  CHECK(score(7, 0, 0, 0) * 0x1.0p24f == 2881272.0f);
  CHECK(score(12345, 2, 3, 4095) * 0x1.0p24f == 10786034.0f);
  // The sequence length is not an input: a token keeps its score as the sequence grows.
  scorers::random s{};
  CHECK(s(token_info{5, 6, 0, 0}) == s(token_info{5, 1000, 0, 0}));
  static_assert(scorers::random{}(token_info{0, 1, 0, 0}) == 2175092.0f * 0x1.0p-24f, "constexpr, host and device");
}

TEST_CASE("random: plans keep a uniform random subset, different per head and per seed, reproducibly") {
  constexpr std::int64_t heads = 4, L = 4096;
  std::vector<float> k(static_cast<std::size_t>(heads * L), 0.f);  // keys are not read
  const auto in = keys_only(make_contiguous_view(k.data(), 1, heads, L, 1));
  auto plan_with = [&](std::uint32_t seed) {
    policy<scorers::random, selectors::per_head, allocators::uniform> p{};
    p.scorer.seed = seed;
    keep_plan plan;
    REQUIRE(cpu::plan(p, in, {}, {}, 0.5, plan).ok());
    return plan;
  };
  const keep_plan a = plan_with(1), again = plan_with(1), other = plan_with(2);
  std::set<std::vector<int>> distinct;
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::vector<int> kept = a.kept(0, h);
    REQUIRE(kept.size() == static_cast<std::size_t>(L / 2));
    CHECK(kept == again.kept(0, h));
    CHECK(kept != other.kept(0, h));
    distinct.insert(kept);
    // Uniform over positions: each quarter of the sequence keeps about half its tokens (binomial, n = 1024: the
    // bound is over 6 standard deviations; the hash is fixed, so this is deterministic, not flaky).
    for (int quarter = 0; quarter < 4; ++quarter) {
      std::int64_t n = 0;
      for (const int t : kept) n += t / (L / 4) == quarter;
      CHECK(n > 512 - 100);
      CHECK(n < 512 + 100);
    }
  }
  CHECK(distinct.size() == static_cast<std::size_t>(heads));
}

TEST_CASE("random: by name, through parse and dispatch, with the spec's seed") {
  policy_spec spec;
  REQUIRE(parse("random", spec.scorer).ok());
  spec.seed = 9;
  std::uint32_t seen = 0;
  const result r = dispatch(spec, [&](const auto& p) -> result {
    if constexpr (requires { p.scorer.seed; }) seen = p.scorer.seed;
    return {};
  });
  CHECK(r.ok());
  CHECK(seen == 9);
  CHECK(registry::info(spec.scorer)->source == score_source::position);
}
