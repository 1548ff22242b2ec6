// scorers::external: the caller's own scores through fairkv's allocators, selectors and compaction.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "plan_by_spec.hpp"
#include "test_util.hpp"

namespace {

using fairkv::keep_plan;
using fairkv::result;
using fairkv::segment;
using fairkv::status;
using fairkv_test::random_floats;
using fairkv_test::reference_top;

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

std::vector<int> kept_of(const keep_plan& p, std::int64_t b, std::int64_t h) {
  const auto k = p.kept(b, h);
  return {k.begin(), k.end()};
}

template <class A, class Sel = fairkv::selectors::per_head>
result plan_external(const fairkv::layer_inputs<fairkv::kv_view<const float>>& in, keep_plan& out, double ratio,
                     std::span<const segment> segments = {}, std::span<const std::int32_t> whitelist = {},
                     A alloc = {}, Sel sel = {}) {
  const fairkv::policy pol{fairkv::scorers::external{}, sel, alloc};
  return fairkv::cpu::plan(pol, in, segments, whitelist, ratio, out);
}

// Scores with ties (a coarse grid) so the lower-index rule is exercised too.
std::vector<float> tied_scores(std::size_t n, std::uint32_t seed) {
  std::vector<float> s = random_floats(n, seed, -4.f, 4.f);
  for (float& x : s) x = std::round(x * 2.f) / 2.f;
  return s;
}

}  // namespace

TEST_CASE("external scores: hand-worked per_head and union_heads plans over a token-major view") {
  // Two heads, six tokens, stored token-major [L][H] (a strided view, as an engine's [B, L, H] tensor).
  const float head0[6] = {0.1f, 0.9f, 0.3f, 0.8f, 0.2f, 0.5f};
  const float head1[6] = {5.f, 4.f, 3.f, 2.f, 1.f, 0.f};
  std::vector<float> rows(12);
  for (int t = 0; t < 6; ++t) {
    rows[static_cast<std::size_t>(2 * t)] = head0[t];
    rows[static_cast<std::size_t>(2 * t + 1)] = head1[t];
  }
  const fairkv::score_view scores{rows.data(), 1, 2, 6, 12, 1, 2};
  const auto in = fairkv::scores_only(scores);
  keep_plan plan;
  REQUIRE(plan_external<fairkv::allocators::uniform>(in, plan, 0.5).ok());  // keep floor(6 * 0.5) = 3 per head
  CHECK(kept_of(plan, 0, 0) == std::vector<int>{1, 3, 5});
  CHECK(kept_of(plan, 0, 1) == std::vector<int>{0, 1, 2});
  CHECK(plan.length(0) == 6);
  // union_heads ranks the head mean: 2.55, 2.45, 1.65, 1.4, 0.6, 0.25.
  REQUIRE((plan_external<fairkv::allocators::uniform, fairkv::selectors::union_heads>(in, plan, 0.5)).ok());
  CHECK(kept_of(plan, 0, 0) == std::vector<int>{0, 1, 2});
  CHECK(kept_of(plan, 0, 1) == std::vector<int>{0, 1, 2});
}

TEST_CASE("external scores: NaN is evicted first, +inf kept first, -inf before every finite score") {
  std::vector<float> s = {nan_f, -inf_f, 1.f, inf_f, 0.f, nan_f};
  const auto in = fairkv::scores_only(fairkv::make_contiguous_scores(s.data(), 1, 1, 6));
  keep_plan plan;
  REQUIRE(plan_external<fairkv::allocators::uniform>(in, plan, 0.5).ok());  // 3 of 6
  CHECK(kept_of(plan, 0, 0) == std::vector<int>{2, 3, 4});
  REQUIRE(plan_external<fairkv::allocators::uniform>(in, plan, 0.25).ok());  // floor(4.5) = 4
  CHECK(kept_of(plan, 0, 0) == std::vector<int>{1, 2, 3, 4});
  // A whitelisted NaN is kept: forced tokens do not depend on their score.
  const std::int32_t wl[] = {0};
  REQUIRE(plan_external<fairkv::allocators::whitelist>(in, plan, 0.5, {}, wl).ok());
  CHECK(kept_of(plan, 0, 0) == std::vector<int>{0, 2, 3});
  // union_heads: a NaN in one head makes the token's mean NaN, so it goes first for every head.
  std::vector<float> two = {9.f, 1.f, 2.f, 3.f, /* head 1 */ nan_f, 1.f, 2.f, 3.f};
  const auto in2 = fairkv::scores_only(fairkv::make_contiguous_scores(two.data(), 1, 2, 4));
  REQUIRE((plan_external<fairkv::allocators::uniform, fairkv::selectors::union_heads>(in2, plan, 0.5)).ok());
  CHECK(kept_of(plan, 0, 0) == std::vector<int>{2, 3});
}

TEST_CASE("external scores: uniform keeps exactly the top-k of the supplied scores per head") {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const std::int64_t B = 1 + rng() % 3, H = 1 + rng() % 4, L = 1 + rng() % 200;
    const double ratio = static_cast<double>(rng() % 100) / 100.0;
    const std::vector<float> s = tied_scores(static_cast<std::size_t>(B * H * L), seed);
    const auto in = fairkv::scores_only(fairkv::make_contiguous_scores(s.data(), B, H, L));
    keep_plan plan;
    REQUIRE(plan_external<fairkv::allocators::uniform>(in, plan, ratio).ok());
    fairkv_test::check_plan_invariants(plan);
    std::vector<int> all(static_cast<std::size_t>(L));
    for (int t = 0; t < L; ++t) all[static_cast<std::size_t>(t)] = t;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::vector<float> row(s.begin() + (b * H + h) * L, s.begin() + (b * H + h + 1) * L);
        CHECK(kept_of(plan, b, h) == reference_top(all, row, static_cast<int>(fairkv::keep_budget(L, ratio))));
      }
  }
}

TEST_CASE("external scores: the plan of a built-in scorer's own scores, for every allocator and selector") {
  // K-Norm and StreamingLLM scores computed by fairkv::cpu::score, passed back as external scores, must give the
  // built-in scorer's plan exactly: same per-segment counts (the allocator's largest-remainder split, sinks,
  // boundaries, whitelist charging), same kept tokens.
  using namespace fairkv;
  for (std::uint32_t seed = 1; seed <= 12; ++seed) {
    std::mt19937 rng(seed);
    const std::int64_t B = 1 + rng() % 2, H = 1 + rng() % 4, L = 20 + rng() % 150, D = 4;
    const std::vector<float> k = random_floats(static_cast<std::size_t>(B * H * L * D), seed + 100);
    const auto keys = make_contiguous_view(k.data(), B, H, L, D);
    const std::vector<segment> segs = {{3, static_cast<std::int32_t>(L / 3)},
                                       {static_cast<std::int32_t>(L / 2), static_cast<std::int32_t>(L - 2)}};
    const std::vector<std::int32_t> wl = {1, static_cast<std::int32_t>(L / 2), static_cast<std::int32_t>(L - 1)};
    const double ratio = 0.6;
    const allocators::protection protect{4, 1};
    auto compare = [&](auto builtin, auto selector) {
      std::vector<float> s(static_cast<std::size_t>(B * H * L));
      REQUIRE(cpu::score(builtin, keys_only(keys), s.data(), L).ok());
      const auto ext_in = with_scores(keys, make_contiguous_scores(s.data(), B, H, L));
      auto one = [&](auto alloc, std::span<const segment> sg, std::span<const std::int32_t> w) {
        keep_plan want, got;
        REQUIRE(cpu::plan(policy{builtin, selector, alloc}, keys_only(keys), sg, w, ratio, want).ok());
        REQUIRE(cpu::plan(policy{scorers::external{}, selector, alloc}, ext_in, sg, w, ratio, got).ok());
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t h = 0; h < H; ++h) {
            CAPTURE(alloc.name);
            CHECK(want.count(b, h) == got.count(b, h));
            CHECK(kept_of(want, b, h) == kept_of(got, b, h));
            // Per-segment counts, spelled out (what the fairness guarantee is about).
            for (const segment& sgm : sg) {
              auto in_seg = [&](const keep_plan& p) {
                int n = 0;
                for (const int t : kept_of(p, b, h)) n += (t >= sgm.begin && t < sgm.end) ? 1 : 0;
                return n;
              };
              CHECK(in_seg(want) == in_seg(got));
            }
          }
      };
      one(allocators::uniform{}, {}, {});
      one(allocators::whitelist{}, {}, wl);
      one(allocators::fair{protect}, segs, {});
      one(allocators::fair_with_whitelist{protect}, segs, wl);
      one(allocators::debias{0.5f, protect}, segs, wl);
    };
    compare(scorers::knorm{}, selectors::per_head{});
    compare(scorers::knorm{}, selectors::union_heads{});
    compare(scorers::knorm{}, selectors::head_adaptive{0.2f});
    compare(scorers::streaming_llm<>{}, selectors::per_head{});
  }
}

TEST_CASE("external scores: scores alone plan like scores over the cache, and the plan compacts the cache") {
  const std::int64_t B = 2, H = 3, L = 40, D = 8;
  std::vector<float> k = random_floats(static_cast<std::size_t>(B * H * L * D), 7);
  std::vector<float> v = random_floats(static_cast<std::size_t>(B * H * L * D), 8);
  const std::vector<float> s = tied_scores(static_cast<std::size_t>(B * H * L), 9);
  const auto keys = fairkv::make_contiguous_view(k.data(), B, H, L, D);
  const auto values = fairkv::make_contiguous_view(v.data(), B, H, L, D);
  const auto sv = fairkv::make_contiguous_scores(s.data(), B, H, L);
  const std::vector<segment> segs = {{0, 10}, {10, 25}};
  keep_plan alone, over_cache;
  REQUIRE(plan_external<fairkv::allocators::fair>(fairkv::scores_only(sv), alone, 0.5, segs).ok());
  REQUIRE(plan_external<fairkv::allocators::fair>(fairkv::with_scores(keys, sv), over_cache, 0.5, segs).ok());
  const std::vector<float> k0 = k, v0 = v;
  REQUIRE(fairkv::cpu::compact(alone.view(), keys, values).ok());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      REQUIRE(kept_of(alone, b, h) == kept_of(over_cache, b, h));
      const auto kept = kept_of(alone, b, h);
      for (std::size_t i = 0; i < kept.size(); ++i)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::size_t src = static_cast<std::size_t>(((b * H + h) * L + kept[i]) * D + d);
          const std::size_t dst = static_cast<std::size_t>(((b * H + h) * L + static_cast<std::int64_t>(i)) * D + d);
          CHECK(k[dst] == k0[src]);
          CHECK(v[dst] == v0[src]);
        }
    }
  // cpu::score hands the external scores back as they are.
  std::vector<float> echoed(static_cast<std::size_t>(B * H * L));
  REQUIRE(fairkv::cpu::score(fairkv::scorers::external{}, fairkv::scores_only(sv), echoed.data(), L).ok());
  CHECK(std::memcmp(echoed.data(), s.data(), s.size() * sizeof(float)) == 0);
}

TEST_CASE("external scores: errors name the argument and leave every input untouched") {
  const std::int64_t B = 1, H = 2, L = 8, D = 4;
  std::vector<float> k = random_floats(static_cast<std::size_t>(B * H * L * D), 3);
  std::vector<float> s = random_floats(static_cast<std::size_t>(B * H * L), 4);
  const std::vector<float> k0 = k, s0 = s;
  const auto keys = fairkv::make_contiguous_view(k.data(), B, H, L, D);
  auto expect = [&](const fairkv::layer_inputs<fairkv::kv_view<const float>>& in, status code, const char* text) {
    keep_plan plan;
    const result r = plan_external<fairkv::allocators::uniform>(in, plan, 0.5);
    CHECK(r.code() == code);
    CHECK_MESSAGE(std::string(r.message()).find(text) != std::string::npos, r.message());
    CHECK(k == k0);
    CHECK(s == s0);
  };
  const fairkv::score_view good = fairkv::make_contiguous_scores(s.data(), B, H, L);
  expect(fairkv::keys_only(keys), status::missing_input, "scorer 'external' needs the caller's scores (inputs.scores)");
  fairkv::score_view bad = good;
  bad.heads = 1;
  bad.stride_batch = L;
  expect(fairkv::with_scores(keys, bad), status::invalid_shape,
         "inputs.scores is [batch 1, heads 1, tokens 8] but the keys are [batch 1, heads 2, tokens 8]");
  bad = fairkv::make_contiguous_scores(s.data(), B, H, L - 1);
  expect(fairkv::with_scores(keys, bad), status::invalid_shape, "tokens 7] but the keys are");
  bad = fairkv::make_contiguous_scores(s.data(), B + 1, H, L / 2);
  expect(fairkv::with_scores(keys, bad), status::invalid_shape, "inputs.scores is [batch 2");
  bad = good;
  bad.stride_head = -L;
  expect(fairkv::with_scores(keys, bad), status::invalid_shape, "inputs.scores has a negative stride");
  bad = good;
  bad.stride_head = 0;  // both heads would read one row
  expect(fairkv::with_scores(keys, bad), status::invalid_shape, "inputs.scores has overlapping strides");
  bad = good;
  bad.tokens = 0;
  expect(fairkv::with_scores(keys, bad), status::invalid_shape, "inputs.scores has extents");
  bad = good;
  bad.data = nullptr;
  expect(fairkv::with_scores(keys, bad), status::missing_input, "needs the caller's scores");
  bad = good;
  bad.stride_token = INT64_MAX / 2;
  expect(fairkv::with_scores(keys, bad), status::invalid_shape, "inputs.scores");

  // fair_paper computes its own statistics: refused, whatever else is right.
  keep_plan plan;
  const std::vector<segment> spans = {{0, 4}, {4, 8}};
  const result paper = plan_external<fairkv::allocators::fair_paper>(fairkv::with_scores(keys, good), plan, 0.5, spans);
  CHECK(paper.code() == status::invalid_argument);
  CHECK(std::string(paper.message()).find("allocator 'fair_paper' computes the paper's own per-span statistics") !=
        std::string::npos);
  CHECK(std::string(paper.message()).find("cannot take external scores") != std::string::npos);
  CHECK(k == k0);
  CHECK(s == s0);
}

TEST_CASE("external scores: fairkv::dispatch names them 'external'") {
  fairkv::policy_spec spec;
  REQUIRE(fairkv::parse("external", spec.scorer).ok());
  CHECK(spec.scorer == fairkv::scorer_kind::external);
  REQUIRE(fairkv::parse("fair", spec.allocator).ok());
  std::vector<float> s = tied_scores(2 * 30, 11);
  const auto in = fairkv::scores_only(fairkv::make_contiguous_scores(s.data(), 1, 2, 30));
  const std::vector<segment> segs = {{0, 12}};
  keep_plan via_dispatch, direct;
  CHECK(fairkv::registry::info(spec.scorer)->name == "external");
  const result r = fairkv_test::plan_by_spec(spec, in, segs, {}, 0.5, via_dispatch);
  REQUIRE_MESSAGE(r.ok(), r.message());
  REQUIRE(plan_external<fairkv::allocators::fair>(in, direct, 0.5, segs, {}, {{spec.sinks, spec.boundary}}).ok());
  for (std::int64_t h = 0; h < 2; ++h) CHECK(kept_of(via_dispatch, 0, h) == kept_of(direct, 0, h));
  fairkv::scorer_kind kind{};
  const result bad = fairkv::parse("externall", kind);
  CHECK(std::string(bad.message()).find("tova, h2o, external") != std::string::npos);
}

TEST_CASE("external scores over a paged cache: ragged sequences read [0, tokens_of(b)) of the score rows") {
  using namespace fairkv;
  // Two sequences of 7 and 4 tokens in pages of 4 (NHD, 2 heads, head_dim 3); scores [2, 2, 7].
  std::vector<float> k(8 * 4 * 2 * 3, 0.5f), v(8 * 4 * 2 * 3, 0.25f);
  const std::vector<std::int32_t> indptr{0, 2, 3}, indices{5, 1, 6}, last{3, 4};
  const auto paged = make_paged_view(page_layout::nhd, std::as_const(k).data(), std::as_const(v).data(), 8, 4, 2, 3,
                                     2, indptr.data(), indices.data(), last.data());
  const std::vector<float> s = tied_scores(2 * 2 * 7, 21);
  layer_inputs<paged_side<const float>> in{paged.keys()};
  in.scores = make_contiguous_scores(s.data(), 2, 2, 7);
  keep_plan plan;
  REQUIRE(cpu::plan(policy{scorers::external{}, selectors::per_head{}, allocators::uniform{}}, in, {}, {}, 0.5, plan)
              .ok());
  for (std::int64_t b = 0; b < 2; ++b) {
    const std::int64_t L = paged.tokens_of(b);
    CHECK(plan.length(b) == L);
    std::vector<int> all(static_cast<std::size_t>(L));
    for (int t = 0; t < L; ++t) all[static_cast<std::size_t>(t)] = t;
    for (std::int64_t h = 0; h < 2; ++h) {
      const std::vector<float> row(s.begin() + (b * 2 + h) * 7, s.begin() + (b * 2 + h) * 7 + L);
      CHECK(kept_of(plan, b, h) == reference_top(all, row, static_cast<int>(keep_budget(L, 0.5))));
    }
  }
  // The score rows span the longest sequence, not more.
  in.scores = make_contiguous_scores(s.data(), 2, 2, 6);
  CHECK(cpu::plan(policy{scorers::external{}, selectors::per_head{}, allocators::uniform{}}, in, {}, {}, 0.5, plan)
            .code() == status::invalid_shape);
  // A paged pool without data is never a bare shape (only a dense kv_view is, through scores_only).
  in.scores = make_contiguous_scores(s.data(), 2, 2, 7);
  in.keys.data = nullptr;
  CHECK(cpu::plan(policy{scorers::external{}, selectors::per_head{}, allocators::uniform{}}, in, {}, {}, 0.5, plan)
            .code() == status::null_pointer);
}
