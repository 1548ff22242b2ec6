// Property tests over random shapes, segments, whitelists and ratios, for every scorer x selector x allocator,
// checked against an independent naive reference (full sort with an explicit comparator, exact rational
// largest-remainder budgets computed a different way).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;
using fairkv_test::reference_top;

namespace {

struct random_case {
  std::int64_t heads, groups, tokens, dim;
  double ratio;
  std::vector<float> keys, queries;
  std::vector<segment> segments;
  std::vector<std::int32_t> whitelist;
};

random_case make_case(std::mt19937& rng) {
  random_case c;
  c.heads = std::uniform_int_distribution<std::int64_t>(1, 4)(rng);
  c.groups = std::uniform_int_distribution<std::int64_t>(1, 3)(rng);
  c.tokens = std::uniform_int_distribution<std::int64_t>(1, 160)(rng);
  c.dim = std::vector<std::int64_t>{1, 4, 8}[rng() % 3];
  c.ratio = std::uniform_real_distribution<double>(0.0, 0.95)(rng);
  if (rng() % 8 == 0) c.ratio = 0.0;
  c.keys = fairkv_test::random_floats(static_cast<std::size_t>(c.heads * c.tokens * c.dim), rng(), -2.f, 2.f);
  if (rng() % 10 == 0) c.keys[rng() % c.keys.size()] = std::numeric_limits<float>::quiet_NaN();
  if (rng() % 4 == 0)  // coarse values create many exact score ties
    for (auto& x : c.keys) x = std::round(x);
  c.queries = fairkv_test::random_floats(static_cast<std::size_t>(c.heads * c.groups * c.tokens * c.dim), rng());
  // Up to 4 disjoint segments, in random order, possibly leaving gaps (the remainder group).
  std::vector<std::int32_t> cuts;
  const int n_cuts = static_cast<int>(rng() % 9);
  for (int i = 0; i < n_cuts; ++i) cuts.push_back(static_cast<std::int32_t>(rng() % (c.tokens + 1)));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (std::size_t i = 0; i + 1 < cuts.size(); i += 2)
    if (rng() % 4 != 0) c.segments.push_back({cuts[i], cuts[i + 1]});
  std::shuffle(c.segments.begin(), c.segments.end(), rng);
  const std::int64_t n_keep = keep_budget(c.tokens, c.ratio);
  const auto n_white = static_cast<std::int64_t>(rng() % (n_keep + 1));
  for (std::int64_t i = 0; i < n_white; ++i) c.whitelist.push_back(static_cast<std::int32_t>(rng() % c.tokens));
  return c;
}

// Exact largest remainder with pinning, written independently: rational shares compared by cross-multiplication.
std::vector<std::int64_t> reference_budgets(std::int64_t n_keep, const std::vector<std::int64_t>& sizes,
                                            const std::vector<std::int64_t>& forced) {
  const std::size_t g = sizes.size();
  std::vector<bool> pinned(g, false);
  for (bool changed = true; changed;) {
    changed = false;
    std::int64_t budget = n_keep, total = 0;
    for (std::size_t i = 0; i < g; ++i) pinned[i] ? budget -= forced[i] : total += sizes[i];
    for (std::size_t i = 0; i < g; ++i)
      if (!pinned[i] && budget * sizes[i] < forced[i] * total) pinned[i] = changed = true;
  }
  std::int64_t budget = n_keep, total = 0;
  for (std::size_t i = 0; i < g; ++i) pinned[i] ? budget -= forced[i] : total += sizes[i];
  std::vector<std::int64_t> out(g);
  std::vector<std::size_t> order;
  std::int64_t given = 0;
  for (std::size_t i = 0; i < g; ++i) {
    if (pinned[i]) {
      out[i] = forced[i];
      continue;
    }
    out[i] = budget * sizes[i] / total;
    given += out[i];
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return budget * sizes[a] % total > budget * sizes[b] % total;
  });
  for (std::size_t i = 0; given < budget; ++i, ++given) ++out[order[i]];
  return out;
}

struct groups_of_case {
  std::vector<int> group;  // [tokens]
  std::vector<std::int64_t> sizes, forced;
  std::vector<bool> white;
};

// Forced tokens as the allocators document them (allocators/protection.hpp), written independently: the
// whitelist, then every segment's first and last `boundary` tokens, then the sinks while the budget has room.
void add_protection(groups_of_case& g, const random_case& c, allocators::protection p) {
  auto force = [&](int t) {
    if (g.white[t]) return;
    g.white[t] = true;
    ++g.forced[g.group[t]];
  };
  for (const segment s : c.segments)
    for (int t = s.begin; t < s.end; ++t)
      if (t - s.begin < p.boundary || s.end - t <= p.boundary) force(t);
  const std::int64_t n_keep = keep_budget(c.tokens, c.ratio);
  for (int t = 0; t < std::min<int>(p.n_sink, static_cast<int>(c.tokens)); ++t)
    if (std::count(g.white.begin(), g.white.end(), true) < n_keep) force(t);
}

groups_of_case group_case(const random_case& c, bool use_segments, bool use_whitelist) {
  groups_of_case g;
  std::vector<segment> segs = use_segments ? c.segments : std::vector<segment>{};
  std::sort(segs.begin(), segs.end(), [](segment a, segment b) { return a.begin < b.begin; });
  g.group.assign(static_cast<std::size_t>(c.tokens), static_cast<int>(segs.size()));
  for (std::size_t i = 0; i < segs.size(); ++i)
    for (int t = segs[i].begin; t < segs[i].end; ++t) g.group[t] = static_cast<int>(i);
  const int n_groups = static_cast<int>(segs.size()) +
                       (std::count(g.group.begin(), g.group.end(), static_cast<int>(segs.size())) > 0 ? 1 : 0);
  g.sizes.assign(static_cast<std::size_t>(n_groups), 0);
  g.forced.assign(static_cast<std::size_t>(n_groups), 0);
  g.white.assign(static_cast<std::size_t>(c.tokens), false);
  for (int t = 0; t < c.tokens; ++t) ++g.sizes[g.group[t]];
  if (use_whitelist)
    for (auto t : c.whitelist)
      if (!g.white[t]) {
        g.white[t] = true;
        ++g.forced[g.group[t]];
      }
  return g;
}

template <class S, class Sel, class A>
void check_policy(const random_case& c, S scorer, Sel sel, A alloc) {
  const bool attention = is_attention_source(S::source);
  const auto keys = make_contiguous_view(c.keys.data(), 1, c.heads, c.tokens, c.dim);
  const auto in = attention ? with_queries(keys, make_contiguous_view(c.queries.data(), 1, c.heads * c.groups, c.tokens, c.dim))
                            : keys_only(keys);
  const std::vector<segment> segs = A::uses_segments ? c.segments : std::vector<segment>{};
  const std::vector<std::int32_t> wl = A::uses_whitelist ? c.whitelist : std::vector<std::int32_t>{};
  keep_plan plan;
  const result r = cpu::plan(policy<S, Sel, A>{scorer, sel, alloc}, in, segs, wl, c.ratio, plan);
  REQUIRE_MESSAGE(r.ok(), r.message());
  fairkv_test::check_plan_invariants(plan);

  const std::int64_t n_keep = keep_budget(c.tokens, c.ratio);
  auto g = group_case(c, A::uses_segments, A::uses_whitelist);
  if constexpr (fairkv::detail::has_protection_v<A>) add_protection(g, c, alloc.protect);
  // Budgets sum exactly.
  std::int64_t total = 0;
  for (std::int64_t h = 0; h < c.heads; ++h) {
    total += plan.count(0, h);
    if constexpr (Sel::kind != selection_kind::head_adaptive) REQUIRE(plan.count(0, h) == n_keep);
  }
  REQUIRE(total == n_keep * c.heads);
  // Whitelisted, boundary and sink tokens are always kept, in every head.
  for (std::int64_t h = 0; h < c.heads; ++h) {
    const auto kept = plan.kept(0, h);
    const std::set<int> s(kept.begin(), kept.end());
    for (int t = 0; t < c.tokens; ++t)
      if (g.white[t]) REQUIRE(s.count(t) == 1);
  }
  // Per-(head, segment) counts equal the reference budgets (fair), and are within one token of the exact
  // proportional share when nothing is forced.
  if constexpr (A::uses_segments && !A::needs_own_allocation && Sel::kind != selection_kind::head_adaptive) {
    const auto budgets = reference_budgets(n_keep, g.sizes, g.forced);
    for (std::int64_t h = 0; h < c.heads; ++h) {
      std::vector<std::int64_t> counts(g.sizes.size(), 0);
      for (int t : plan.kept(0, h)) ++counts[g.group[t]];
      REQUIRE(counts == budgets);
      if (std::all_of(g.forced.begin(), g.forced.end(), [](auto f) { return f == 0; }))
        for (std::size_t i = 0; i < counts.size(); ++i) {
          const double share = static_cast<double>(n_keep) * static_cast<double>(g.sizes[i]) / static_cast<double>(c.tokens);
          REQUIRE(std::abs(static_cast<double>(counts[i]) - share) < 1.0);
        }
    }
  }
  // Independent selection reference: per-head top-b inside each group on the scorer's scores.
  if constexpr (Sel::kind == selection_kind::per_head && !A::segment_local) {
    std::vector<float> scores(static_cast<std::size_t>(c.heads * c.tokens));
    REQUIRE(cpu::score(scorer, in, scores.data(), c.tokens).ok());
    for (std::int64_t h = 0; h < c.heads; ++h) {
      std::vector<float> row(scores.begin() + h * c.tokens, scores.begin() + (h + 1) * c.tokens);
      std::vector<int> candidates, expect;
      for (int t = 0; t < c.tokens; ++t) (g.white[t] ? expect : candidates).push_back(t);
      const auto top = reference_top(candidates, row, static_cast<int>(n_keep - static_cast<std::int64_t>(expect.size())));
      expect.insert(expect.end(), top.begin(), top.end());
      std::sort(expect.begin(), expect.end());
      REQUIRE(plan.kept(0, h) == expect);
    }
  }
}

template <class S>
void check_scorer(const random_case& c, S s, std::mt19937& rng) {
  // Protection: the default sinks, none, or many sinks with boundary tokens when the budget can hold them.
  allocators::protection many{static_cast<std::int32_t>(rng() % 12), static_cast<std::int32_t>(rng() % 4)};
  std::int64_t boundary_tokens = static_cast<std::int64_t>(std::set<std::int32_t>(c.whitelist.begin(), c.whitelist.end()).size());
  for (const segment seg : c.segments) boundary_tokens += std::min<std::int64_t>(seg.size(), 2 * many.boundary);
  if (boundary_tokens > keep_budget(c.tokens, c.ratio)) many.boundary = 0;
  check_policy(c, s, selectors::per_head{}, allocators::uniform{});
  check_policy(c, s, selectors::per_head{}, allocators::whitelist{});
  check_policy(c, s, selectors::per_head{}, allocators::fair{});
  check_policy(c, s, selectors::per_head{}, allocators::fair{{0, 0}});
  check_policy(c, s, selectors::per_head{}, allocators::fair_with_whitelist{});
  check_policy(c, s, selectors::per_head{}, allocators::fair_with_whitelist{many});
  check_policy(c, s, selectors::per_head{}, allocators::debias{0.5f});
  check_policy(c, s, selectors::per_head{}, allocators::debias{0.5f, many});
  check_policy(c, s, selectors::union_heads{}, allocators::fair_with_whitelist{});
  check_policy(c, s, selectors::union_heads{}, allocators::fair_with_whitelist{many});
  check_policy(c, s, selectors::union_heads{}, allocators::whitelist{});
  check_policy(c, s, selectors::head_adaptive{}, allocators::fair_with_whitelist{});
  check_policy(c, s, selectors::head_adaptive{}, allocators::fair_with_whitelist{many});
  check_policy(c, s, selectors::head_adaptive{0.f}, allocators::uniform{});
}

}  // namespace

TEST_CASE("properties over random shapes: every scorer x selector x allocator") {
  std::mt19937 rng(20251202);
  for (int i = 0; i < 150; ++i) {
    const random_case c = make_case(rng);
    CAPTURE(i);
    CAPTURE(c.tokens);
    CAPTURE(c.ratio);
    check_scorer(c, scorers::knorm{}, rng);
    check_scorer(c, scorers::streaming_llm<>{}, rng);
    scorers::snapkv<> snap{};
    snap.window = static_cast<std::int32_t>(1 + rng() % 20);
    check_scorer(c, snap, rng);
    check_scorer(c, scorers::tova{}, rng);
    check_scorer(c, scorers::h2o{}, rng);
  }
}

TEST_CASE("debias at lambda 0 equals the plain policy for key scorers, at lambda 1 equals fair") {
  std::mt19937 rng(7);
  for (int i = 0; i < 100; ++i) {
    const random_case c = make_case(rng);
    const auto in = keys_only(make_contiguous_view(c.keys.data(), 1, c.heads, c.tokens, c.dim));
    keep_plan plain, d0, fair, d1;
    REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::whitelist>{}, in, {}, c.whitelist, c.ratio, plain).ok());
    // Without sinks: the plain policy protects nothing.
    REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::debias>{{}, {}, {0.f, {0, 0}}}, in, c.segments,
                      c.whitelist, c.ratio, d0).ok());
    REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::fair_with_whitelist>{}, in, c.segments,
                      c.whitelist, c.ratio, fair).ok());
    REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::debias>{{}, {}, {1.f}}, in, c.segments,
                      c.whitelist, c.ratio, d1).ok());
    for (std::int64_t h = 0; h < c.heads; ++h) {
      REQUIRE(d0.kept(0, h) == plain.kept(0, h));
      REQUIRE(d1.kept(0, h) == fair.kept(0, h));
    }
  }
}

TEST_CASE("segment-local scoring: each segment is scored as if it were its own sequence") {
  // A fair SnapKV plan over segments equals, segment by segment, a plain SnapKV plan of that segment alone with
  // the segment's budget (here segments tile the sequence and every budget is a ratio of its own length).
  std::mt19937 rng(99);
  const std::int64_t H = 2, G = 2, D = 4;
  const std::vector<segment> segs{{0, 40}, {40, 100}};
  auto keys = fairkv_test::random_floats(H * 100 * D, 1);
  auto queries = fairkv_test::random_floats(H * G * 100 * D, 2);
  const auto in = with_queries(make_contiguous_view(keys.data(), 1, H, 100, D),
                               make_contiguous_view(queries.data(), 1, H * G, 100, D));
  scorers::snapkv<8> s{};
  keep_plan fair;
  // Without sinks: the segment alone has none.
  REQUIRE(cpu::plan(policy<scorers::snapkv<8>, selectors::per_head, allocators::fair>{s, {}, {{0, 0}}}, in, segs, {}, 0.5, fair).ok());
  for (const segment seg : segs) {
    // The segment alone: its keys and queries as a contiguous cache of seg.size() tokens.
    kv_view<const float> k{keys.data() + seg.begin * D, 1, H, seg.size(), D, H * 100 * D, 100 * D, D, 1};
    kv_view<const float> q{queries.data() + seg.begin * D, 1, H * G, seg.size(), D, H * G * 100 * D, 100 * D, D, 1};
    layer_inputs<kv_view<const float>> alone{k};
    alone.queries = q;
    keep_plan plan;
    REQUIRE(cpu::plan(policy<scorers::snapkv<8>, selectors::per_head, allocators::uniform>{s, {}, {}}, alone, {}, {}, 0.5, plan).ok());
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<int> expect;
      for (int t : plan.kept(0, h)) expect.push_back(t + seg.begin);
      std::vector<int> got;
      for (int t : fair.kept(0, h))
        if (t >= seg.begin && t < seg.end) got.push_back(t);
      CHECK(got == expect);
    }
  }
}
