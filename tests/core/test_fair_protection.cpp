// Issue 16: fair eviction keeps the attention sinks, SnapKV's window ties keep the most recent tokens, boundary
// protection, and the paper's two-span mode (its budget split, span widening and statistics; golden kept sets from
// the paper's own logic are in test_golden_paper.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

struct cache {
  std::int64_t heads, groups, tokens, dim;
  std::vector<float> keys, queries;
  [[nodiscard]] auto keys_view() const { return make_contiguous_view(keys.data(), 1, heads, tokens, dim); }
  [[nodiscard]] auto inputs() const {
    return with_queries(keys_view(), make_contiguous_view(queries.data(), 1, heads * groups, tokens, dim));
  }
};

cache random_cache(std::int64_t heads, std::int64_t groups, std::int64_t tokens, std::int64_t dim, std::uint32_t seed) {
  cache c{heads, groups, tokens, dim, fairkv_test::random_floats(static_cast<std::size_t>(heads * tokens * dim), seed),
          fairkv_test::random_floats(static_cast<std::size_t>(heads * groups * tokens * dim), seed + 1)};
  return c;
}

template <class S, class Sel, class A>
keep_plan plan_of(const cache& c, S s, Sel sel, A a, const std::vector<segment>& segs, double ratio,
                  const std::vector<std::int32_t>& wl = {}) {
  keep_plan plan;
  const result r = cpu::plan(policy<S, Sel, A>{s, sel, a}, c.inputs(), segs, wl, ratio, plan);
  REQUIRE_MESSAGE(r.ok(), r.message());
  fairkv_test::check_plan_invariants(plan);
  return plan;
}

bool keeps(const keep_plan& p, std::int64_t h, int t) {
  const auto k = p.kept(0, h);
  return std::find(k.begin(), k.end(), t) != k.end();
}

// A chat-templated system turn: 3 template tokens, the defense, the instructions, 2 template tokens.
const std::vector<segment> templated{{3, 40}, {40, 118}};

template <class S, class Sel, class A>
void check_sinks_kept(const cache& c, S s, Sel sel, A a, double ratio, int n_sink) {
  const keep_plan p = plan_of(c, s, sel, a, templated, ratio);
  const std::int64_t n_keep = keep_budget(c.tokens, ratio);
  for (std::int64_t h = 0; h < c.heads; ++h)
    for (int t = 0; t < std::min<std::int64_t>(n_sink, n_keep); ++t) {
      INFO("head " << h << " sink " << t << " ratio " << ratio);
      CHECK(keeps(p, h, t));
    }
}

template <class Sel, class A>
void check_every_scorer(const cache& c, Sel sel, A a, double ratio, int n_sink) {
  check_sinks_kept(c, scorers::knorm{}, sel, a, ratio, n_sink);
  check_sinks_kept(c, scorers::streaming_llm<>{}, sel, a, ratio, n_sink);
  check_sinks_kept(c, scorers::snapkv<16>{}, sel, a, ratio, n_sink);
  check_sinks_kept(c, scorers::tova{}, sel, a, ratio, n_sink);
  check_sinks_kept(c, scorers::h2o{}, sel, a, ratio, n_sink);
}

}  // namespace

TEST_CASE("sinks: tokens 0..n_sink-1 are kept under fair, fair_with_whitelist and debias, every scorer and selector") {
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    cache c = random_cache(3, 3, 120, 8, seed);
    // Give the sinks the largest key norms so K-Norm and the attention scorers rank them last.
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t t = 0; t < 4; ++t)
        for (std::int64_t d = 0; d < c.dim; ++d) c.keys[static_cast<std::size_t>((h * c.tokens + t) * c.dim + d)] *= 40.f;
    for (const double ratio : {0.3, 0.5, 0.7, 0.9, 0.97}) {
      CAPTURE(seed);
      check_every_scorer(c, selectors::per_head{}, allocators::fair{}, ratio, 4);
      check_every_scorer(c, selectors::union_heads{}, allocators::fair{}, ratio, 4);
      check_every_scorer(c, selectors::head_adaptive{}, allocators::fair_with_whitelist{}, ratio, 4);
      check_every_scorer(c, selectors::per_head{}, allocators::debias{0.5f}, ratio, 4);
      check_every_scorer(c, selectors::per_head{}, allocators::fair{{8, 0}}, ratio, 8);
    }
  }
}

TEST_CASE("sinks: n_sink = 0 disables them, and a budget smaller than n_sink keeps the first tokens it can") {
  cache c = random_cache(2, 1, 60, 4, 11);
  for (std::int64_t h = 0; h < c.heads; ++h)
    for (std::int64_t d = 0; d < c.dim; ++d) c.keys[static_cast<std::size_t>((h * c.tokens) * c.dim + d)] = 50.f;
  const std::vector<segment> segs{{2, 30}, {30, 60}};
  // Token 0 has the largest norm: without sinks K-Norm evicts it.
  const keep_plan off = plan_of(c, scorers::knorm{}, selectors::per_head{}, allocators::fair{{0, 0}}, segs, 0.5);
  for (std::int64_t h = 0; h < c.heads; ++h) CHECK_FALSE(keeps(off, h, 0));
  // Keep 2 of 60 tokens: the two first sinks, nothing else forced, no error.
  const keep_plan tiny = plan_of(c, scorers::knorm{}, selectors::per_head{}, allocators::fair{}, segs, 0.96);
  for (std::int64_t h = 0; h < c.heads; ++h) CHECK(tiny.kept(0, h) == std::vector<std::int32_t>{0, 1});
  // The whitelist comes first: with one whitelisted token only one sink fits.
  const keep_plan wl = plan_of(c, scorers::knorm{}, selectors::per_head{}, allocators::fair_with_whitelist{}, segs,
                               0.96, {50});
  for (std::int64_t h = 0; h < c.heads; ++h) CHECK(wl.kept(0, h) == std::vector<std::int32_t>{0, 50});
  // Negative parameters are refused.
  keep_plan p;
  const result r = cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::fair>{{}, {}, {{-1, 0}}},
                             c.inputs(), segs, {}, 0.5, p);
  CHECK(r.code() == status::invalid_argument);
  CHECK(std::string(r.message()).find("n_sink") != std::string::npos);
}

TEST_CASE("SnapKV window ties: a budget smaller than the window keeps the most recent window tokens") {
  const cache c = random_cache(2, 2, 40, 4, 5);
  // Plain SnapKV, window 16, keep 5 of 40: the window [24, 40) ties at max + 1; the last 5 are kept.
  const keep_plan plain = plan_of(c, scorers::snapkv<16>{}, selectors::per_head{}, allocators::uniform{}, {}, 0.875);
  for (std::int64_t h = 0; h < c.heads; ++h) CHECK(plain.kept(0, h) == std::vector<std::int32_t>{35, 36, 37, 38, 39});
  // Segment-local: each segment's window is its own last tokens (no sinks, so only the windows compete); budgets
  // 3 and 2 (equal remainders go to the earlier segment).
  const keep_plan fair =
      plan_of(c, scorers::snapkv<16>{}, selectors::per_head{}, allocators::fair{{0, 0}}, {{0, 20}, {20, 40}}, 0.875);
  for (std::int64_t h = 0; h < c.heads; ++h) CHECK(fair.kept(0, h) == std::vector<std::int32_t>{17, 18, 19, 38, 39});
  // Every window token still outranks every scored token.
  std::vector<float> scores(static_cast<std::size_t>(c.heads * c.tokens));
  REQUIRE(cpu::score(scorers::snapkv<16>{}, c.inputs(), scores.data(), c.tokens).ok());
  for (std::int64_t h = 0; h < c.heads; ++h) {
    const float* row = scores.data() + h * c.tokens;
    CHECK(*std::max_element(row, row + 24) < row[24]);
    for (int t = 25; t < 40; ++t) CHECK(row[t] > row[t - 1]);
    CHECK(row[39] / row[24] - 1.f < 1e-5f);  // still kvpress's max + 1 to within a few ulps
  }
}

TEST_CASE("boundary protection: the first and last k tokens of every segment are kept and charged to it") {
  std::mt19937 rng(31);
  for (int i = 0; i < 60; ++i) {
    const std::int64_t L = 40 + static_cast<std::int64_t>(rng() % 120);
    const cache c = random_cache(2, 2, L, 4, 100 + static_cast<std::uint32_t>(i));
    const std::int32_t a = static_cast<std::int32_t>(1 + rng() % (L / 3)), b = static_cast<std::int32_t>(a + 1 + rng() % (L / 3));
    const std::vector<segment> segs{{a, b}, {b, static_cast<std::int32_t>(L - 1)}};
    const std::int32_t k = static_cast<std::int32_t>(1 + rng() % 3);
    const double ratio = 0.3 + 0.6 * static_cast<double>(rng() % 100) / 100.0;
    const std::int64_t n_keep = keep_budget(L, ratio);
    std::int64_t protected_n = 0;
    for (const segment s : segs) protected_n += std::min<std::int64_t>(s.size(), 2 * k);
    keep_plan p;
    const result r = cpu::plan(policy<scorers::snapkv<8>, selectors::per_head, allocators::fair>{{}, {}, {{0, k}}},
                               c.inputs(), segs, {}, ratio, p);
    CAPTURE(L);
    CAPTURE(ratio);
    CAPTURE(k);
    if (protected_n > n_keep) {
      CHECK(r.code() == status::budget_exceeded);
      CHECK(std::string(r.message()).find("boundary") != std::string::npos);
      continue;
    }
    REQUIRE_MESSAGE(r.ok(), r.message());
    for (std::int64_t h = 0; h < c.heads; ++h) {
      CHECK(static_cast<std::int64_t>(p.count(0, h)) == n_keep);
      for (const segment s : segs)
        for (int t = s.begin; t < s.end; ++t)
          if (t - s.begin < k || s.end - t <= k) CHECK(keeps(p, h, t));
    }
  }
  // A segment shorter than 2k is kept whole; union and head_adaptive keep the boundaries too.
  const cache c = random_cache(2, 1, 50, 4, 9);
  const std::vector<segment> segs{{0, 3}, {3, 50}};
  const keep_plan u = plan_of(c, scorers::knorm{}, selectors::union_heads{}, allocators::fair{{0, 2}}, segs, 0.7);
  const keep_plan ha = plan_of(c, scorers::knorm{}, selectors::head_adaptive{}, allocators::fair{{0, 2}}, segs, 0.7);
  for (std::int64_t h = 0; h < c.heads; ++h)
    for (int t : {0, 1, 2, 3, 4, 48, 49}) {
      CHECK(keeps(u, h, t));
      CHECK(keeps(ha, h, t));
    }
}

TEST_CASE("paper mode: two adjacent spans widened to the sequence, floor split, checked arguments") {
  const cache c = random_cache(2, 1, 20, 4, 3);
  // Spans [3, 9) and [9, 18) widen to [0, 9) and [9, 20); keep 10: floor(10 * 9 / 20) = 4 and 6.
  for (const auto& spans : {std::vector<segment>{{3, 9}, {9, 18}}, std::vector<segment>{{9, 18}, {3, 9}}}) {
    const keep_plan p = plan_of(c, scorers::knorm{}, selectors::per_head{}, allocators::fair_paper{}, spans, 0.5);
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const auto kept = p.kept(0, h);
      CHECK(std::count_if(kept.begin(), kept.end(), [](int t) { return t < 9; }) == 4);
      CHECK(kept.size() == 10);
    }
  }
  // K-Norm's kept set is the top-k of -||k|| inside each widened span.
  std::vector<float> scores(static_cast<std::size_t>(c.heads * c.tokens));
  REQUIRE(cpu::score(scorers::knorm{}, c.inputs(), scores.data(), c.tokens).ok());
  const keep_plan p = plan_of(c, scorers::knorm{}, selectors::per_head{}, allocators::fair_paper{},
                              {{3, 9}, {9, 18}}, 0.5);
  for (std::int64_t h = 0; h < c.heads; ++h) {
    const std::vector<float> row(scores.begin() + h * 20, scores.begin() + (h + 1) * 20);
    std::vector<int> early, late;
    for (int t = 0; t < 20; ++t) (t < 9 ? early : late).push_back(t);
    auto expect = fairkv_test::reference_top(early, row, 4);
    const auto top_late = fairkv_test::reference_top(late, row, 6);
    expect.insert(expect.end(), top_late.begin(), top_late.end());
    CHECK(p.kept(0, h) == expect);
  }
  // Exactly two adjacent segments.
  keep_plan out;
  using paper_knorm = policy<scorers::knorm, selectors::per_head, allocators::fair_paper>;
  for (const auto& bad : {std::vector<segment>{{0, 5}}, std::vector<segment>{{0, 5}, {6, 10}},
                          std::vector<segment>{{0, 5}, {5, 10}, {10, 12}}}) {
    const result r = cpu::plan(paper_knorm{}, c.inputs(), bad, {}, 0.5, out);
    CHECK(r.code() == status::invalid_argument);
    CHECK(std::string(r.message()).find("two adjacent segments") != std::string::npos);
  }
  // fair_paper is a dispatch name.
  allocator_kind kind{};
  REQUIRE(parse("fair_paper", kind).ok());
  CHECK(kind == allocator_kind::fair_paper);
}

TEST_CASE("paper mode StreamingLLM: per-span ramps, sinks at 1, one global top-k") {
  const cache c = random_cache(1, 1, 30, 4, 8);
  // Spans [2, 10) and [10, 28): ramps over [4, 10) (6 steps) and [10, 30) (20 steps); keep 12 of 30 globally.
  const keep_plan p = plan_of(c, scorers::streaming_llm<>{}, selectors::per_head{}, allocators::fair_paper{},
                              {{2, 10}, {10, 28}}, 0.6);
  // Ramp values: earlier 0.1 + 0.16 i (i < 6), later 0.1 + 0.8 i / 19. The 12 best: the 4 sinks (1.0), then the
  // highest ramp values: earlier 0.9 (t = 9), 0.74 (t = 8); later 0.9, 0.858, 0.816, 0.774, 0.732 (t = 29..25),
  // and 0.69 (t = 24) beats 0.58 (t = 7).
  CHECK(p.kept(0, 0) == std::vector<std::int32_t>{0, 1, 2, 3, 8, 9, 24, 25, 26, 27, 28, 29});
}
