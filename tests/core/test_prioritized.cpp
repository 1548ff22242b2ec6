// allocators::prioritized: hand-worked budgets (weights, floors, the unweighted tier, caller order), its errors,
// and, on random inputs, exact equality with fair_with_whitelist when every weight is equal and no floor is set,
// plus the invariants of unequal weights.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "plan_by_spec.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

using budgets_t = std::vector<std::int64_t>;

result allocate_into(const allocators::prioritized& a, std::int64_t n_keep, std::int64_t heads, const budgets_t& sizes,
                     const budgets_t& forced, const std::vector<std::int32_t>& origin, budgets_t& out) {
  out.assign(static_cast<std::size_t>(heads) * sizes.size(), -7);
  budgets_t scratch(2 * sizes.size());
  const allocation_context ctx{n_keep, heads, sizes, forced, {}, scratch, origin};
  return a.allocate(ctx, out);
}

budgets_t allocate(const allocators::prioritized& a, std::int64_t n_keep, const budgets_t& sizes,
                   const budgets_t& forced, const std::vector<std::int32_t>& origin) {
  budgets_t out;
  const result r = allocate_into(a, n_keep, 1, sizes, forced, origin, out);
  REQUIRE_MESSAGE(r.ok(), r.message());
  return out;
}

allocators::prioritized with(const std::vector<segment_priority>& p, segment_priority rest = {}) {
  return allocators::prioritized{p, rest, {0, 0}};
}

}  // namespace

TEST_CASE("prioritized: budgets proportional to weight x size, within [floor, size], summing to the budget") {
  const std::vector<std::int32_t> two{0, 1}, three{0, 1, 2};
  // Weights 3 and 1 over sizes 10 and 10, keep 8: lambda * 30 + lambda * 10 = 8 -> 6 and 2.
  const std::vector<segment_priority> w31{{3.f, 0.f}, {1.f, 0.f}};
  CHECK(allocate(with(w31), 8, {10, 10}, {0, 0}, two) == budgets_t{6, 2});
  // The heavier segment is capped at its size and the rest flows to the other: keep 14 -> 10 and 4.
  CHECK(allocate(with(w31), 14, {10, 10}, {0, 0}, two) == budgets_t{10, 4});
  // Weight 2 vs 1 over sizes 4 and 8, keep 5: lambda * 8 + lambda * 8 = 5 -> 2.5 / 2.5; equal fractional
  // parts: the lower group gets the leftover.
  CHECK(allocate(with({{2.f, 0.f}, {1.f, 0.f}}), 5, {4, 8}, {0, 0}, two) == budgets_t{3, 2});
  // A floor of 0.5 on an unweighted segment: it keeps exactly ceil(0.5 * 10) = 5; the weighted one the rest.
  const std::vector<segment_priority> floor0{{0.f, 0.5f}, {1.f, 0.f}};
  CHECK(allocate(with(floor0), 8, {10, 10}, {0, 0}, two) == budgets_t{5, 3});
  // The unweighted tier shares only what is left once every weighted group is whole: keep 17 -> 7 and 10.
  CHECK(allocate(with(floor0), 17, {10, 10}, {0, 0}, two) == budgets_t{7, 10});
  // A floor rounds up (ceil(0.3 * 7) = 3) and counts the forced tokens already in the segment.
  CHECK(allocate(with({{1.f, 0.3f}, {1.f, 0.f}}), 4, {7, 13}, {0, 0}, two) == budgets_t{3, 1});
  CHECK(allocate(with({{1.f, 0.3f}, {1.f, 0.f}}), 4, {7, 13}, {2, 0}, two) == budgets_t{3, 1});
  CHECK(allocate(with({{1.f, 0.3f}, {1.f, 0.f}}), 5, {7, 13}, {4, 0}, two) == budgets_t{4, 1});
  // The remainder group (after the segments: origin has no entry for it) takes `remainder`'s priority.
  CHECK(allocate(with({{1.f, 0.f}, {1.f, 0.f}}, {0.f, 0.f}), 6, {5, 5, 10}, {0, 0, 0}, two) == budgets_t{3, 3, 0});
  // Every weight 0: one tier, proportional to size (fair).
  CHECK(allocate(with({{0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}}), 4, {2, 3, 5}, {0, 0, 0}, three) == budgets_t{1, 1, 2});
  // Weights follow the caller's order: group 0 is the caller's segment 1.
  CHECK(allocate(with(w31), 8, {10, 10}, {0, 0}, {1, 0}) == budgets_t{2, 6});
  // Every head gets the same budgets.
  budgets_t out;
  REQUIRE(allocate_into(with(w31), 8, 3, {10, 10}, {0, 0}, two, out).ok());
  CHECK(out == budgets_t{6, 2, 6, 2, 6, 2});
}

TEST_CASE("prioritized: default priorities are fair_with_whitelist's budgets") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t groups = 1 + rng() % 6;
    budgets_t sizes(groups), forced(groups);
    std::int64_t total = 0, forced_total = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      sizes[g] = 1 + static_cast<std::int64_t>(rng() % 40);
      forced[g] = static_cast<std::int64_t>(rng() % (static_cast<unsigned>(sizes[g]) + 1)) / 2;
      total += sizes[g];
      forced_total += forced[g];
    }
    const std::int64_t n_keep = forced_total + static_cast<std::int64_t>(rng() % (total - forced_total + 1));
    std::vector<std::int32_t> origin(groups - (rng() % 2));  // with or without a remainder group
    std::iota(origin.begin(), origin.end(), 0);
    std::shuffle(origin.begin(), origin.end(), rng);
    budgets_t fair_out(groups), scratch(2 * groups);
    const allocation_context ctx{n_keep, 1, sizes, forced, {}, scratch, {}};
    REQUIRE(allocators::fair_with_whitelist{}.allocate(ctx, fair_out).ok());
    CHECK(allocate(with({}), n_keep, sizes, forced, origin) == fair_out);
    // Any common weight, and the remainder's too, gives the same.
    const std::vector<segment_priority> same(origin.size(), segment_priority{2.5f, 0.f});
    CHECK(allocate(with(same, {2.5f, 0.f}), n_keep, sizes, forced, origin) == fair_out);
  }
}

TEST_CASE("prioritized: unequal weights keep the invariants and order fractions by weight") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t groups = 2 + rng() % 6;
    budgets_t sizes(groups), forced(groups, 0);
    std::vector<segment_priority> pr(groups);
    std::int64_t total = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      sizes[g] = 1 + static_cast<std::int64_t>(rng() % 60);
      pr[g].weight = (rng() % 5 == 0) ? 0.f : std::ldexp(static_cast<float>(1 + rng() % 1000), -static_cast<int>(rng() % 8));
      // Dyadic floors: exact in float, so ceil(floor * size) below needs no rounding rule.
      pr[g].floor = (rng() % 3 == 0) ? static_cast<float>(rng() % 33) / 128.f : 0.f;
      total += sizes[g];
    }
    std::vector<std::int32_t> origin(groups);
    std::iota(origin.begin(), origin.end(), 0);
    budgets_t lo(groups);
    std::int64_t lo_sum = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      lo[g] = static_cast<std::int64_t>(std::ceil(static_cast<double>(pr[g].floor) * static_cast<double>(sizes[g])));
      lo_sum += lo[g];
    }
    const std::int64_t n_keep = lo_sum + static_cast<std::int64_t>(rng() % (total - lo_sum + 1));
    if (n_keep == 0) continue;
    const budgets_t b = allocate(with(pr), n_keep, sizes, forced, origin);
    CHECK(std::accumulate(b.begin(), b.end(), std::int64_t{0}) == n_keep);
    for (std::size_t g = 0; g < groups; ++g) {
      CHECK(b[g] >= lo[g]);
      CHECK(b[g] <= sizes[g]);
    }
    // Between two weighted groups at neither bound, the heavier keeps at least the lighter's fraction, up to one
    // token of rounding each; an unweighted group above its floor means every weighted group is whole.
    for (std::size_t i = 0; i < groups; ++i)
      for (std::size_t j = 0; j < groups; ++j) {
        const bool free_j = b[j] > lo[j] && b[j] < sizes[j];
        if (pr[i].weight > 0.f && pr[j].weight > 0.f && pr[i].weight >= pr[j].weight && free_j && b[i] < sizes[i])
          CHECK(static_cast<double>(b[i] + 1) / static_cast<double>(sizes[i]) + 1e-12 >=
                static_cast<double>(b[j] - 1) / static_cast<double>(sizes[j]));
        if (pr[i].weight == 0.f && b[i] > lo[i] && pr[j].weight > 0.f) CHECK(b[j] == sizes[j]);
      }
  }
}

TEST_CASE("prioritized: invalid priorities and floors beyond the budget are refused") {
  budgets_t out;
  const std::vector<std::int32_t> two{0, 1};
  // One priority for two segments.
  CHECK(allocate_into(with({{1.f, 0.f}}), 4, 1, {5, 5}, {0, 0}, two, out).code() == status::invalid_argument);
  for (const segment_priority bad : {segment_priority{-1.f, 0.f}, segment_priority{std::nanf(""), 0.f},
                                     segment_priority{std::numeric_limits<float>::infinity(), 0.f},
                                     segment_priority{1.f, 1.5f}, segment_priority{1.f, -0.1f},
                                     segment_priority{1.f, std::nanf("")}}) {
    CHECK(allocate_into(with({bad, {1.f, 0.f}}), 4, 1, {5, 5}, {0, 0}, two, out).code() == status::invalid_argument);
    CHECK(allocate_into(with({}, bad), 4, 1, {5, 5}, {0, 0}, two, out).code() == status::invalid_argument);
  }
  // Floors of 4 + 3 tokens (0.8 x 5 is 4, not the 5 of 0.8f's float value) do not fit a budget of 6.
  const result r = allocate_into(with({{1.f, 0.8f}, {1.f, 0.6f}}), 6, 1, {5, 5}, {0, 0}, two, out);
  CHECK(r.code() == status::budget_exceeded);
  CHECK(std::string(r.message()).find("need 7 tokens") != std::string::npos);
}

TEST_CASE("prioritized through the planner, by name, and equal to fair_with_whitelist on random caches") {
  // K-Norm keeps the lowest norms; norms grow with position, so each segment keeps its first tokens.
  std::vector<float> k(20);
  for (int t = 0; t < 20; ++t) k[t] = 1.0f + static_cast<float>(t);
  const auto keys = keys_only(make_contiguous_view(k.data(), 1, 1, 20, 1));
  const std::vector<segment> segs{{10, 20}, {0, 10}};  // caller order differs from position order
  keep_plan plan;
  using P = policy<scorers::knorm, selectors::per_head, allocators::prioritized>;
  // [10, 20) weight 1, [0, 10) weight 3, keep 8: 6 of [0, 10) and 2 of [10, 20).
  const std::vector<segment_priority> w{{1.f, 0.f}, {3.f, 0.f}};
  REQUIRE(cpu::plan(P{{}, {}, {w, {}, {0, 0}}}, keys, segs, {}, keep_target::of_tokens(8), plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 4, 5, 10, 11});
  // [0, 10) unweighted with a floor of 0.5 keeps 5, [10, 20) the other 3; at 14, [10, 20) keeps 9 (its floor
  // holds [0, 10) at 5); at 17, [10, 20) is whole and [0, 10) shares the rest.
  const std::vector<segment_priority> f{{1.f, 0.f}, {0.f, 0.5f}};
  REQUIRE(cpu::plan(P{{}, {}, {f, {}, {0, 0}}}, keys, segs, {}, keep_target::of_tokens(8), plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 4, 10, 11, 12});
  REQUIRE(cpu::plan(P{{}, {}, {f, {}, {0, 0}}}, keys, segs, {}, keep_target::of_tokens(14), plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15, 16, 17, 18});
  REQUIRE(cpu::plan(P{{}, {}, {f, {}, {0, 0}}}, keys, segs, {}, keep_target::of_tokens(17), plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
  // By name through dispatch, with the default sinks (tokens 0..3, charged to [0, 10)).
  policy_spec spec;
  REQUIRE(parse("prioritized", spec.allocator).ok());
  spec.priorities = f;
  const result r = fairkv_test::plan_by_spec(spec, keys, std::span<const segment>(segs), {}, keep_target::of_tokens(8), plan);
  REQUIRE_MESSAGE(r.ok(), r.message());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 4, 10, 11, 12});
  // Floors beyond the budget: the planner's error (so nothing is compacted).
  const std::vector<segment_priority> big{{1.f, 0.5f}, {1.f, 0.5f}};
  CHECK(cpu::plan(P{{}, {}, {big, {}, {0, 0}}}, keys, segs, {}, keep_target::of_tokens(8), plan).code() ==
        status::budget_exceeded);

  // Random caches, every scorer and selector but head_adaptive: default priorities plan exactly as
  // fair_with_whitelist (same protection).
  std::mt19937 rng(3);
  const int H = 2, L = 48, D = 8, Hq = 4, W = 6;
  for (int trial = 0; trial < 40; ++trial) {
    const auto kv = fairkv_test::random_floats(std::size_t(H) * L * D, 100u + unsigned(trial));
    const auto q = fairkv_test::random_floats(std::size_t(Hq) * L * D, 200u + unsigned(trial));
    const auto in = with_queries(make_contiguous_view<const float>(kv.data(), 1, H, L, D),
                                 make_contiguous_view<const float>(q.data(), 1, Hq, L, D));
    std::vector<segment> sg;
    for (int b = int(rng() % 4); b + 2 < L && sg.size() < 5;) {
      const int e = std::min(L, b + 2 + int(rng() % 12));
      sg.push_back({b, e});
      b = e + int(rng() % 4);
    }
    std::shuffle(sg.begin(), sg.end(), rng);
    std::vector<std::int32_t> wl{std::int32_t(rng() % L), std::int32_t(rng() % L)};
    const double ratio = 0.3 + 0.1 * double(trial % 5);
    for (scorer_kind sk : {scorer_kind::knorm, scorer_kind::streaming_llm, scorer_kind::snapkv, scorer_kind::tova,
                           scorer_kind::h2o})
      for (selection_kind sel : {selection_kind::per_head, selection_kind::union_heads}) {
        policy_spec a, b;
        a.scorer = b.scorer = sk;
        a.selector = b.selector = sel;
        a.window = b.window = W;
        a.allocator = allocator_kind::fair_with_whitelist;
        b.allocator = allocator_kind::prioritized;
        keep_plan pa, pb;
        const auto run = [&](const policy_spec& s, keep_plan& out) {
          return fairkv_test::plan_by_spec(s, in, std::span<const segment>(sg), std::span<const std::int32_t>(wl), ratio,
                                           out);
        };
        REQUIRE(run(a, pa).ok());
        REQUIRE(run(b, pb).ok());
        for (int h = 0; h < H; ++h) CHECK(pa.kept(0, h) == pb.kept(0, h));
      }
  }
}
