// Hand-worked budgets for every shipped allocator, then the same allocators through the planner.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {
std::vector<std::int64_t> allocate(auto alloc, std::int64_t n_keep, std::int64_t heads, std::vector<std::int64_t> sizes,
                                   std::vector<std::int64_t> forced, std::vector<std::int64_t> own = {}) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(heads) * sizes.size(), -7), scratch(2 * sizes.size());
  const allocation_context ctx{n_keep, heads, sizes, forced, own, scratch, {}};
  const result r = alloc.allocate(ctx, out);
  REQUIRE_MESSAGE(r.ok(), r.message());
  return out;
}
}  // namespace

TEST_CASE("fair: largest remainder, ties to the lower segment, sums exactly") {
  // sizes 3 and 7 of 10, keep 5: shares 1.5 / 3.5 -> floors 1, 3; one left, equal remainders -> segment 0.
  CHECK(allocate(allocators::fair{}, 5, 1, {3, 7}, {0, 0}) == std::vector<std::int64_t>{2, 3});
  // sizes 2, 3, 5, keep 4: shares 0.8 / 1.2 / 2.0 -> floors 0, 1, 2; the leftover goes to the largest remainder.
  CHECK(allocate(allocators::fair{}, 4, 1, {2, 3, 5}, {0, 0, 0}) == std::vector<std::int64_t>{1, 1, 2});
  // Every head gets the same budgets.
  CHECK(allocate(allocators::fair{}, 4, 2, {2, 3, 5}, {0, 0, 0}) == std::vector<std::int64_t>{1, 1, 2, 1, 1, 2});
  // Keep everything / keep one.
  CHECK(allocate(allocators::fair{}, 10, 1, {2, 3, 5}, {0, 0, 0}) == std::vector<std::int64_t>{2, 3, 5});
  CHECK(allocate(allocators::fair{}, 1, 1, {2, 3, 5}, {0, 0, 0}) == std::vector<std::int64_t>{0, 0, 1});
}

TEST_CASE("fair_with_whitelist: forced tokens are charged to their segment, the rest stays proportional") {
  // sizes 5 and 5, keep 4, three forced in segment 0: its share (2) is below 3, so it is pinned at 3 and the
  // other segment gets what is left.
  CHECK(allocate(allocators::fair_with_whitelist{}, 4, 1, {5, 5}, {3, 0}) == std::vector<std::int64_t>{3, 1});
  // Pinning one segment re-shares the rest proportionally: sizes 4, 4, 8 keep 8, forced 4 in segment 0:
  // shares 2 / 2 / 4 -> segment 0 pinned at 4, then 4 tokens over sizes 4 and 8 -> 1.33 / 2.67 -> 1, 3.
  CHECK(allocate(allocators::fair_with_whitelist{}, 8, 1, {4, 4, 8}, {4, 0, 0}) == std::vector<std::int64_t>{4, 1, 3});
  // A forced count at its share is not pinned.
  CHECK(allocate(allocators::fair_with_whitelist{}, 4, 1, {5, 5}, {2, 0}) == std::vector<std::int64_t>{2, 2});
}

namespace {
// The proportional rule by its definition, as the allocator was first written: re-share after every round of
// pins (groups whose share falls below their forced count), then hand the leftovers out one at a time to the
// largest remainder (lowest group on ties). Quadratic; the reference for the sorted implementation.
std::vector<std::int64_t> proportional_by_rounds(std::int64_t n_keep, const std::vector<std::int64_t>& sizes,
                                                 const std::vector<std::int64_t>& forced, std::vector<std::int64_t> out) {
  const std::size_t groups = sizes.size();
  for (;;) {
    std::int64_t budget = n_keep, active_size = 0;
    for (std::size_t g = 0; g < groups; ++g) (out[g] >= 0 ? budget -= out[g] : active_size += sizes[g]);
    if (active_size == 0) return out;
    bool pinned = false;
    for (std::size_t g = 0; g < groups; ++g)
      if (out[g] < 0 && budget * sizes[g] < forced[g] * active_size) out[g] = forced[g], pinned = true;
    if (pinned) continue;
    std::vector<std::int64_t> rem(groups, -1);
    std::int64_t left = budget;
    for (std::size_t g = 0; g < groups; ++g)
      if (out[g] < 0) {
        out[g] = budget * sizes[g] / active_size;
        rem[g] = budget * sizes[g] % active_size;
        left -= out[g];
      }
    for (; left > 0; --left) {
      std::size_t best = 0;
      for (std::size_t g = 1; g < groups; ++g)
        if (rem[g] > rem[best]) best = g;
      ++out[best];
      rem[best] = -1;
    }
    return out;
  }
}
}  // namespace

TEST_CASE("fair: the sorted water-filling equals re-sharing round by round (random groups, forced and pinned)") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20000; ++trial) {
    const std::size_t groups = 1 + rng() % (trial % 10 == 0 ? 200 : 9);
    std::vector<std::int64_t> sizes(groups), forced(groups), pinned(groups, allocators::detail::proportional_active);
    std::int64_t total = 0, forced_total = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      // Sizes from 1 to 2^20 and forced counts from none to all, so pins cascade over several rounds.
      sizes[g] = 1 + static_cast<std::int64_t>(rng() % (rng() % 2 ? 8u : (1u << 20)));
      forced[g] = rng() % 3 == 0 ? 0 : static_cast<std::int64_t>(rng() % (static_cast<std::uint64_t>(sizes[g]) + 1));
      total += sizes[g];
      forced_total += forced[g];
    }
    const std::int64_t n_keep = forced_total + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(total - forced_total + 1));
    INFO("trial " << trial);
    CHECK(allocate(allocators::fair_with_whitelist{}, n_keep, 1, sizes, forced) ==
          proportional_by_rounds(n_keep, sizes, forced, pinned));
    // With groups pinned by the caller beforehand at their forced counts (prioritized's tiers).
    std::int64_t pinned_sum = 0;
    for (std::size_t g = 0; g < groups; ++g)
      if (rng() % 4 == 0) pinned[g] = forced[g], pinned_sum += forced[g];
    std::vector<std::int64_t> out = pinned, order(groups);
    allocators::detail::proportional_budgets_from(n_keep, sizes, forced, out, order);
    CHECK(out == proportional_by_rounds(n_keep, sizes, forced, pinned));
  }
}

TEST_CASE("debias: the leftover selection equals handing out one token at a time (random groups and heads)") {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 5000; ++trial) {
    const std::size_t groups = 1 + rng() % (trial % 10 == 0 ? 300 : 9);
    const std::int64_t heads = 1 + static_cast<std::int64_t>(rng() % 3);
    std::vector<std::int64_t> sizes(groups), forced(groups, 0), own(static_cast<std::size_t>(heads) * groups);
    std::int64_t total = 0;
    for (std::size_t g = 0; g < groups; ++g) total += sizes[g] = 1 + static_cast<std::int64_t>(rng() % 50);
    const std::int64_t n_keep = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(total));
    for (std::int64_t h = 0; h < heads; ++h) {  // the plain policy's own counts: n_keep spread at random
      std::vector<std::int64_t> row(groups, 0);
      for (std::int64_t t = 0; t < n_keep; ++t) {
        std::size_t g = rng() % groups;
        while (row[g] == sizes[g]) g = (g + 1) % groups;
        ++row[g];
      }
      std::copy(row.begin(), row.end(), own.begin() + h * static_cast<std::int64_t>(groups));
    }
    const float lambda = static_cast<float>(rng() % 1001) / 1000.0f;
    // The reference: fair's row, floors of the interpolation, then one token at a time to the largest fraction.
    const std::vector<std::int64_t> fair = allocate(allocators::fair{}, n_keep, 1, sizes, forced);
    std::vector<std::int64_t> want(own.size());
    for (std::int64_t h = 0; h < heads; ++h) {
      auto target = [&](std::size_t i) {
        return (1.0 - lambda) * static_cast<double>(own[static_cast<std::size_t>(h) * groups + i]) +
               static_cast<double>(lambda) * static_cast<double>(fair[i]);
      };
      std::int64_t given = 0;
      for (std::size_t i = 0; i < groups; ++i)
        given += want[static_cast<std::size_t>(h) * groups + i] = static_cast<std::int64_t>(std::floor(target(i)));
      for (std::int64_t left = n_keep - given; left > 0; --left) {
        std::size_t best = groups;
        double best_frac = -1.0;
        for (std::size_t i = 0; i < groups; ++i) {
          const double f = target(i) - static_cast<double>(want[static_cast<std::size_t>(h) * groups + i]);
          if (f > 0.0 && f > best_frac && want[static_cast<std::size_t>(h) * groups + i] < sizes[i]) best_frac = f, best = i;
        }
        REQUIRE(best < groups);
        ++want[static_cast<std::size_t>(h) * groups + best];
      }
    }
    INFO("trial " << trial);
    CHECK(allocate(allocators::debias{lambda}, n_keep, heads, sizes, forced, own) == want);
  }
}

TEST_CASE("debias: interpolates the plain policy's own counts (lambda 0) and fair (lambda 1)") {
  const std::vector<std::int64_t> sizes{5, 5}, forced{0, 0}, own{4, 0};
  CHECK(allocate(allocators::debias{0.0f}, 4, 1, sizes, forced, own) == own);
  CHECK(allocate(allocators::debias{1.0f}, 4, 1, sizes, forced, own) == std::vector<std::int64_t>{2, 2});
  CHECK(allocate(allocators::debias{0.5f}, 4, 1, sizes, forced, own) == std::vector<std::int64_t>{3, 1});
  // 0.25: targets 3.5 / 0.5, equal fractions: the lower segment gets the leftover.
  CHECK(allocate(allocators::debias{0.25f}, 4, 1, sizes, forced, own) == std::vector<std::int64_t>{4, 0});
  // Per head: each head interpolates from its own counts.
  CHECK(allocate(allocators::debias{0.5f}, 4, 2, sizes, forced, {4, 0, 0, 4}) ==
        std::vector<std::int64_t>{3, 1, 1, 3});
  std::vector<std::int64_t> out(2), scratch(4);
  const allocation_context ctx{4, 1, sizes, forced, own, scratch, {}};
  CHECK(allocators::debias{1.5f}.allocate(ctx, out).code() == status::invalid_argument);
}

TEST_CASE("through the planner: per-segment kept counts follow the allocator") {
  // 20 tokens, segments [0, 5) and [5, 20), keep 10 -> fair budgets 2.5 / 7.5 -> 3 / 7 (tie to segment 0).
  // K-Norm keys whose norms grow with position: the plain policy keeps the 10 first tokens (5 of segment 0).
  std::vector<float> k(20);
  for (int t = 0; t < 20; ++t) k[t] = 1.0f + static_cast<float>(t);
  const auto keys = keys_only(make_contiguous_view(k.data(), 1, 1, 20, 1));
  const std::vector<segment> segs{{0, 5}, {5, 20}};
  auto count_in = [](const std::vector<int>& kept, int b, int e) {
    return std::count_if(kept.begin(), kept.end(), [&](int t) { return t >= b && t < e; });
  };
  keep_plan plan;
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, keys, {}, {}, 0.5, plan).ok());
  CHECK(count_in(plan.kept(0, 0), 0, 5) == 5);
  // Without sinks (protect {0, 0}) the budgets are the proportional ones.
  constexpr allocators::protection none{0, 0};
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::fair>{{}, {}, {none}}, keys, segs, {}, 0.5,
                    plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 5, 6, 7, 8, 9, 10, 11});
  // With the default 4 sinks, tokens 0..3 are forced and charged to segment 0: its share (2.5) is below 4, so it
  // is pinned at 4 and segment 1 keeps the other 6.
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::fair>{}, keys, segs, {}, 0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 5, 6, 7, 8, 9, 10});
  // Whitelist: token 19 (the worst score) is forced; the budget shrinks for the others.
  const std::vector<std::int32_t> wl{19};
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::whitelist>{}, keys, {}, wl, 0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 19});
  // Fair + whitelist: 19 is charged to segment 1 (budget 7 -> 6 chosen by score + 19).
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::fair_with_whitelist>{{}, {}, {none}}, keys,
                    segs, wl, 0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 5, 6, 7, 8, 9, 10, 19});
  // debias 0 is the plain policy; debias 1 is fair.
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::debias>{{}, {}, {0.f, none}}, keys, segs, {},
                    0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::debias>{{}, {}, {1.f, none}}, keys, segs, {},
                    0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("uniform budget: floor(L * (1 - ratio)) in double like kvpress, at least one token") {
  CHECK(keep_budget(100, 0.9) == 9);  // 100 * (1 - 0.9) = 9.999999999999998 in double
  CHECK(keep_budget(10, 0.0) == 10);
  CHECK(keep_budget(10, 0.99) == 1);
  CHECK(keep_budget(1, 0.5) == 1);
  CHECK(keep_budget(37, 0.7) == 11);
}
