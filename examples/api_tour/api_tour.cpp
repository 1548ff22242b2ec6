// The README's API tour, compiled and run by the test suite (tests/core) and built as an example.
#include <cstdio>
#include <vector>

#include "fairkv/fairkv.hpp"

int api_tour() {
  // tour:begin
  // An engine's layer cache: [batch 1, kv_heads 2, 64 tokens, head_dim 8], owned by the engine.
  std::vector<float> k(2 * 64 * 8, 0.5f), v(2 * 64 * 8, 0.25f), q(6 * 64 * 8, 0.1f);
  auto keys = fairkv::make_contiguous_view(k.data(), 1, 2, 64, 8);
  auto values = fairkv::make_contiguous_view(v.data(), 1, 2, 64, 8);
  auto queries = fairkv::make_contiguous_view(q.data(), 1, 6, 64, 8);  // GQA: 6 query heads

  // Compose a policy at compile time: SnapKV (paper window 16) x per-head top-k x fair with a whitelist.
  using policy = fairkv::policy<fairkv::scorers::snapkv<16>, fairkv::selectors::per_head,
                                fairkv::allocators::fair_with_whitelist>;
  const std::vector<fairkv::segment> segments{{0, 20}, {20, 64}};  // e.g. the defense, the instructions
  const std::vector<std::int32_t> whitelist{0, 1, 2};               // force-keep these positions

  fairkv::keep_plan plan;
  fairkv::result r = fairkv::cpu::plan(policy{}, fairkv::with_queries(keys, queries), segments, whitelist,
                                       /*ratio=*/0.5, plan);
  if (!r) {
    std::fprintf(stderr, "fairkv: %s\n", r.message());
    return 1;
  }
  r = fairkv::cpu::compact(plan.view(), keys, values);  // in place; the engine sets lengths to plan.count()
  if (!r) return 1;
  std::printf("head 0 keeps %d of 64 tokens\n", plan.count(0, 0));
  // tour:end
  return plan.count(0, 0) == 32 ? 0 : 1;
}

#ifdef FAIRKV_API_TOUR_AS_TEST
#include <doctest/doctest.h>
TEST_CASE("README API tour runs") { CHECK(api_tour() == 0); }
#else
int main() { return api_tour(); }
#endif
