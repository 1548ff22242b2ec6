// Hand-worked selector cases: tie rule, NaN and infinities, union, head-adaptive.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "fairkv/fairkv.hpp"

using namespace fairkv;

namespace {
template <class Sel>
keep_plan plan_knorm(std::vector<float>& k, std::int64_t heads, std::int64_t tokens, double ratio, Sel sel = {}) {
  keep_plan plan;
  const result r = cpu::plan(policy<scorers::knorm, Sel, allocators::uniform>{{}, sel, {}},
                             keys_only(make_contiguous_view(k.data(), 1, heads, tokens, 1)), {}, {}, ratio, plan);
  REQUIRE_MESSAGE(r.ok(), r.message());
  return plan;
}
}  // namespace

TEST_CASE("ties are broken by the lower token index, and -0 ties with +0") {
  std::vector<float> k(8, 1.0f);
  CHECK(plan_knorm<selectors::per_head>(k, 1, 8, 0.5).kept(0, 0) == std::vector<int>{0, 1, 2, 3});
  std::vector<float> z = {1.f, -0.f, 1.f, 0.f};  // scores -1, 0 (from -0), -1, 0
  CHECK(plan_knorm<selectors::per_head>(z, 1, 4, 0.75).kept(0, 0) == std::vector<int>{1});
}

TEST_CASE("NaN scores are evicted first, -inf before them is kept, +inf is kept first") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> k = {nan, inf, 1.f, 2.f};  // scores NaN, -inf, -1, -2
  CHECK(plan_knorm<selectors::per_head>(k, 1, 4, 0.25).kept(0, 0) == std::vector<int>{1, 2, 3});
  CHECK(plan_knorm<selectors::per_head>(k, 1, 4, 0.5).kept(0, 0) == std::vector<int>{2, 3});
  // streaming sinks score +inf and survive any budget, lower sinks first.
  std::vector<float> any(10, 0.f);
  keep_plan plan;
  REQUIRE(cpu::plan(policy<scorers::streaming_llm<>, selectors::per_head, allocators::uniform>{},
                    keys_only(make_contiguous_view(any.data(), 1, 1, 10, 1)), {}, {}, 0.75, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1});
}

TEST_CASE("union: one token set for all heads, chosen on the head-mean score") {
  // head 0 norms [1, 5, 2, 6], head 1 norms [4, 1, 4, 1]; mean scores -2.5, -3, -3, -3.5 -> keep {0, 1} at 0.5
  // (token 1 beats token 2 on the tie by index), whereas per head would keep {0, 2} and {1, 3}.
  std::vector<float> k = {1, 5, 2, 6, 4, 1, 4, 1};
  const auto u = plan_knorm<selectors::union_heads>(k, 2, 4, 0.5);
  CHECK(u.kept(0, 0) == std::vector<int>{0, 1});
  CHECK(u.kept(0, 1) == std::vector<int>{0, 1});
  const auto p = plan_knorm<selectors::per_head>(k, 2, 4, 0.5);
  CHECK(p.kept(0, 0) == std::vector<int>{0, 2});
  CHECK(p.kept(0, 1) == std::vector<int>{1, 3});
}

TEST_CASE("head_adaptive: safeguard per head, then the best (head, token) pairs of the layer; ragged counts") {
  // head 0 scores -1, -1.1, -1.2, -1.3; head 1 scores -2, -3, -4, -5; keep 2 per head = 4 in total.
  std::vector<float> k = {1.f, 1.1f, 1.2f, 1.3f, 2.f, 3.f, 4.f, 5.f};
  // alpha 0: no safeguard, the 4 best pairs are all in head 0.
  auto p0 = plan_knorm(k, 2, 4, 0.5, selectors::head_adaptive{0.f});
  CHECK(p0.kept(0, 0) == std::vector<int>{0, 1, 2, 3});
  CHECK(p0.kept(0, 1).empty());
  // alpha 0.5: each head first keeps floor(0.5 * 2) = 1 token; the 2 left go to head 0's next best.
  auto p5 = plan_knorm(k, 2, 4, 0.5, selectors::head_adaptive{0.5f});
  CHECK(p5.kept(0, 0) == std::vector<int>{0, 1, 2});
  CHECK(p5.kept(0, 1) == std::vector<int>{0});
  // alpha 1: every head keeps exactly its own budget, which is per_head.
  auto p1 = plan_knorm(k, 2, 4, 0.5, selectors::head_adaptive{1.f});
  CHECK(p1.kept(0, 0) == std::vector<int>{0, 1});
  CHECK(p1.kept(0, 1) == std::vector<int>{0, 1});
}
