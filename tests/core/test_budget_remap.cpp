// Token budgets (fairkv::keep_target) and remapping segments and whitelists through plans (fairkv/remap.hpp):
// hand-worked cases, the refusals with their messages, and properties over random shapes, segments, whitelists
// and every policy fairkv::dispatch names.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "plan_by_spec.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

// Keys whose K-Norm score ranks token t by `rank[t]` (higher = kept first): key = (-rank, 0, ...).
std::vector<float> ranked_keys(const std::vector<int>& rank, std::int64_t heads) {
  std::vector<float> k;
  for (std::int64_t h = 0; h < heads; ++h)
    for (const int r : rank) k.push_back(static_cast<float>(100 - r));
  return k;
}

std::vector<std::vector<std::int32_t>> rows_of(const keep_plan& p) {
  std::vector<std::vector<std::int32_t>> rows;
  for (std::int64_t b = 0; b < p.batch(); ++b)
    for (std::int64_t h = 0; h < p.heads(); ++h) rows.push_back(p.kept(b, h));
  return rows;
}

const policy<scorers::knorm, selectors::per_head, allocators::uniform> knorm_uniform{};

bool same_segments(const std::vector<segment>& a, const std::vector<segment>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](segment x, segment y) { return x.begin == y.begin && x.end == y.end; });
}

}  // namespace

TEST_CASE("keep_target: a ratio or a token budget, n_keep as documented") {
  static_assert(keep_target::of_ratio(0.5).n_keep(20) == 10);
  static_assert(keep_target::of_tokens(8).n_keep(20) == 8);
  static_assert(keep_target::of_tokens(30).n_keep(20) == 20);  // a shorter sequence is kept whole
  static_assert(keep_target::of_tokens(1).n_keep(20) == 1);
  static_assert(keep_target::of_tokens(8).n_keep(0) == 0);
  static_assert(!keep_target{}.by_tokens() && keep_target{}.n_keep(7) == 7);  // default: ratio 0, keep all
  const keep_target from_double = 0.9;                                       // a bare double is a ratio
  CHECK_FALSE(from_double.by_tokens());
  CHECK(from_double.n_keep(100) == keep_budget(100, 0.9));
  CHECK(keep_target::of_tokens(8).by_tokens());
  CHECK(std::string(detail::describe_target(keep_target::of_tokens(8)).text) == "a budget of 8 tokens");
  CHECK(std::string(detail::describe_target(0.6).text) == "ratio 0.6");
}

TEST_CASE("token budget: hand-worked plans equal the ratio's, and a shorter sequence is kept whole") {
  // 10 tokens, ranks chosen so the best five are 7, 2, 9, 0, 4 (in that order).
  const std::vector<int> rank = {6, 1, 9, 2, 5, 0, 3, 10, 4, 8};
  const std::vector<float> k = ranked_keys(rank, 2);
  const auto in = keys_only(make_contiguous_view(k.data(), 1, 2, 10, 1));
  keep_plan by_ratio, by_tokens;
  REQUIRE(cpu::plan(knorm_uniform, in, {}, {}, 0.5, by_ratio).ok());
  REQUIRE(cpu::plan(knorm_uniform, in, {}, {}, keep_target::of_tokens(5), by_tokens).ok());
  CHECK(by_tokens.kept(0, 0) == std::vector<std::int32_t>{0, 2, 4, 7, 9});
  CHECK(rows_of(by_tokens) == rows_of(by_ratio));
  REQUIRE(cpu::plan(knorm_uniform, in, {}, {}, keep_target::of_tokens(3), by_tokens).ok());
  CHECK(by_tokens.kept(0, 1) == std::vector<std::int32_t>{2, 7, 9});
  // A budget above the sequence keeps it whole: the plan of ratio 0.
  REQUIRE(cpu::plan(knorm_uniform, in, {}, {}, 0.0, by_ratio).ok());
  for (const std::int64_t n : {10, 11, 1000}) {
    REQUIRE(cpu::plan(knorm_uniform, in, {}, {}, keep_target::of_tokens(n), by_tokens).ok());
    CHECK(rows_of(by_tokens) == rows_of(by_ratio));
    CHECK(by_tokens.count(0, 0) == 10);
  }
  // fair + whitelist with a token budget: 8 of 20 tokens, segment [0, 10) and the remainder share it 4 / 4.
  std::vector<int> rank20(20);
  for (int t = 0; t < 20; ++t) rank20[static_cast<std::size_t>(t)] = t;  // later tokens score higher
  const std::vector<float> k20 = ranked_keys(rank20, 1);
  const auto in20 = keys_only(make_contiguous_view(k20.data(), 1, 1, 20, 1));
  const policy fair{scorers::knorm{}, selectors::per_head{}, allocators::fair_with_whitelist{{0, 0}}};
  const std::vector<segment> segs = {{0, 10}};
  const std::vector<std::int32_t> wl = {1};
  REQUIRE(cpu::plan(fair, in20, segs, wl, keep_target::of_tokens(8), by_tokens).ok());
  CHECK(by_tokens.kept(0, 0) == std::vector<std::int32_t>{1, 7, 8, 9, 16, 17, 18, 19});
  REQUIRE(keep_budget(20, 0.6) == 8);
  REQUIRE(cpu::plan(fair, in20, segs, wl, 0.6, by_ratio).ok());
  CHECK(rows_of(by_tokens) == rows_of(by_ratio));
}

TEST_CASE("token budget: ragged sequences of a paged cache, each keeps min(budget, its length)") {
  // Two sequences of 7 and 4 tokens in pages of 4 (NHD, 2 heads, head_dim 3).
  std::vector<float> k = fairkv_test::random_floats(8 * 4 * 2 * 3, 5), v(8 * 4 * 2 * 3, 0.25f);
  const std::vector<std::int32_t> indptr{0, 2, 3}, indices{5, 1, 6}, last{3, 4};
  const auto paged = make_paged_view(page_layout::nhd, std::as_const(k).data(), std::as_const(v).data(), 8, 4, 2, 3,
                                     2, indptr.data(), indices.data(), last.data());
  const layer_inputs<paged_side<const float>> in{paged.keys()};
  keep_plan plan;
  REQUIRE(cpu::plan(knorm_uniform, in, {}, {}, keep_target::of_tokens(5), plan).ok());
  for (std::int64_t h = 0; h < 2; ++h) {
    CHECK(plan.count(0, h) == 5);
    CHECK(plan.kept(1, h) == std::vector<std::int32_t>{0, 1, 2, 3});
  }
}

TEST_CASE("token budget: refusals name the target, before anything is written") {
  const std::vector<float> k = fairkv_test::random_floats(2 * 20 * 4, 3);
  const auto in = keys_only(make_contiguous_view(k.data(), 1, 2, 20, 4));
  keep_plan plan;
  plan.resize(1, 2, 20);
  const std::vector<std::int32_t> before = plan.kept(0, 0);
  auto refused = [&](const keep_target& t) {
    const result r = cpu::plan(knorm_uniform, in, {}, {}, t, plan);
    CHECK(plan.kept(0, 0) == before);
    return r;
  };
  const result zero = refused(keep_target::of_tokens(0));
  CHECK(zero.code() == status::invalid_argument);
  CHECK(std::string(zero.message()) ==
        "a token budget of 0 keeps nothing; the budget must be at least 1 token (to drop a sequence, free it in the "
        "engine)");
  const result negative = refused(keep_target::of_tokens(-3));
  CHECK(negative.code() == status::invalid_argument);
  CHECK(std::string(negative.message()) == "the token budget -3 is negative");
  CHECK(refused(keep_target::of_tokens(-1)).code() == status::invalid_argument);  // -1 is no "unset" sentinel
  // Nor is the most negative budget (it once was: INT64_MIN meant "no budget", and kept every token).
  const result lowest = refused(keep_target::of_tokens(std::numeric_limits<std::int64_t>::min()));
  CHECK(lowest.code() == status::invalid_argument);
  CHECK(std::string(lowest.message()) == "the token budget -9223372036854775808 is negative");
  keep_target both = keep_target::of_tokens(8);
  both.ratio = 0.5;
  const result b = refused(both);
  CHECK(b.code() == status::invalid_argument);
  CHECK(std::string(b.message()) ==
        "the keep target sets both ratio = 0.5 and a budget of 8 tokens; set one (keep_target::of_ratio or "
        "keep_target::of_tokens)");
  // Ratios keep their message, through either overload.
  CHECK(std::string(refused(keep_target::of_ratio(1.0)).message()) == "ratio = 1 is outside [0, 1)");
  CHECK(std::string(cpu::plan(knorm_uniform, in, {}, {}, -0.25, plan).message()) == "ratio = -0.25 is outside [0, 1)");
  CHECK(refused(keep_target::of_ratio(std::nan(""))).code() == status::invalid_argument);
  // The size query refuses too (the two-phase overload validates first).
  std::size_t bytes = 0;
  CHECK(cpu::plan(nullptr, bytes, knorm_uniform, in, {}, {}, keep_target::of_tokens(0), keep_plan_view{}).code() ==
        status::invalid_argument);
}

TEST_CASE("token budget: a whitelist or boundary tokens beyond the budget is budget_exceeded, worded in tokens") {
  const std::vector<float> k = fairkv_test::random_floats(20 * 2, 9);
  const auto in = keys_only(make_contiguous_view(k.data(), 1, 1, 20, 2));
  std::vector<std::int32_t> wl;
  for (std::int32_t t = 0; t < 10; ++t) wl.push_back(2 * t);
  keep_plan plan;
  const policy white{scorers::knorm{}, selectors::per_head{}, allocators::whitelist{}};
  const result r = cpu::plan(white, in, {}, wl, keep_target::of_tokens(8), plan);
  CHECK(r.code() == status::budget_exceeded);
  CHECK(std::string(r.message()) ==
        "the whitelist holds 10 distinct positions but sequence 0 keeps only 8 of its 20 tokens at a budget of 8 "
        "tokens");
  // The same at the ratio that keeps 8: the ratio's wording, unchanged.
  CHECK(std::string(cpu::plan(white, in, {}, wl, 0.6, plan).message()) ==
        "the whitelist holds 10 distinct positions but sequence 0 keeps only 8 of its 20 tokens at ratio 0.6");
  CHECK(cpu::plan(white, in, {}, wl, keep_target::of_tokens(10), plan).ok());  // exactly the whitelist fits
  const policy fair{scorers::knorm{}, selectors::per_head{}, allocators::fair{{0, 3}}};
  const std::vector<segment> segs = {{0, 8}, {10, 18}};  // 3 + 3 boundary tokens each: 12
  const result bnd = cpu::plan(fair, in, segs, {}, keep_target::of_tokens(11), plan);
  CHECK(bnd.code() == status::budget_exceeded);
  CHECK(std::string(bnd.message()).find("keeps only 11 of its 20 tokens at a budget of 11 tokens") !=
        std::string::npos);
}

TEST_CASE("token budget: fair_paper splits the token budget as it splits the ratio's") {
  std::vector<int> rank(30);
  for (int t = 0; t < 30; ++t) rank[static_cast<std::size_t>(t)] = (t * 7) % 30;
  const std::vector<float> k = ranked_keys(rank, 2);
  const auto in = keys_only(make_contiguous_view(k.data(), 1, 2, 30, 1));
  const policy paper{scorers::knorm{}, selectors::per_head{}, allocators::fair_paper{}};
  const std::vector<segment> spans = {{12, 30}, {2, 12}};  // widened [0, 12) and [12, 30)
  keep_plan by_tokens, by_ratio;
  REQUIRE(cpu::plan(paper, in, spans, {}, keep_target::of_tokens(10), by_tokens).ok());
  for (std::int64_t h = 0; h < 2; ++h) {
    const auto kept = by_tokens.kept(0, h);
    REQUIRE(kept.size() == 10u);
    CHECK(std::count_if(kept.begin(), kept.end(), [](std::int32_t t) { return t < 12; }) == 10 * 12 / 30);
  }
  REQUIRE(keep_budget(30, 2.0 / 3.0) == 10);
  REQUIRE(cpu::plan(paper, in, spans, {}, 2.0 / 3.0, by_ratio).ok());
  CHECK(rows_of(by_tokens) == rows_of(by_ratio));
}

namespace {

// A ratio r in [0, 1) with keep_budget(L, r) == n, if double arithmetic has one near 1 - n / L.
std::optional<double> ratio_for(std::int64_t L, std::int64_t n) {
  double r = static_cast<double>(L - n) / static_cast<double>(L);
  for (int step = 0; step < 8; ++step, r = std::nextafter(r, -1.0))
    if (r >= 0.0 && r < 1.0 && keep_budget(L, r) == n) return r;
  return std::nullopt;
}

struct budget_case {
  std::int64_t heads, groups, tokens, dim;
  std::vector<float> keys, queries, scores;
  std::vector<segment> segments, paper_spans;
  std::vector<std::int32_t> whitelist;
};

budget_case make_budget_case(std::mt19937& rng) {
  budget_case c;
  c.heads = std::uniform_int_distribution<std::int64_t>(1, 4)(rng);
  c.groups = std::uniform_int_distribution<std::int64_t>(1, 2)(rng);
  c.tokens = std::uniform_int_distribution<std::int64_t>(2, 90)(rng);
  c.dim = std::vector<std::int64_t>{1, 4, 8}[rng() % 3];
  c.keys = fairkv_test::random_floats(static_cast<std::size_t>(c.heads * c.tokens * c.dim), rng(), -2.f, 2.f);
  if (rng() % 4 == 0)  // coarse values: many exact ties
    for (auto& x : c.keys) x = std::round(x);
  c.queries = fairkv_test::random_floats(static_cast<std::size_t>(c.heads * c.groups * c.tokens * c.dim), rng());
  c.scores = fairkv_test::random_floats(static_cast<std::size_t>(c.heads * c.tokens), rng());
  std::vector<std::int32_t> cuts;
  for (int i = 0, n = static_cast<int>(rng() % 7); i < n; ++i)
    cuts.push_back(static_cast<std::int32_t>(rng() % (c.tokens + 1)));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (std::size_t i = 0; i + 1 < cuts.size(); i += 2) c.segments.push_back({cuts[i], cuts[i + 1]});
  std::shuffle(c.segments.begin(), c.segments.end(), rng);
  const auto split = static_cast<std::int32_t>(1 + rng() % (c.tokens - 1));
  c.paper_spans = {{split, static_cast<std::int32_t>(c.tokens)}, {0, split}};
  for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i)
    c.whitelist.push_back(static_cast<std::int32_t>(rng() % c.tokens));
  return c;
}

// Plans the case with `target` under the policy `spec` names, giving each scorer the inputs it reads.
result plan_case(const policy_spec& spec, const budget_case& c, const keep_target& target, keep_plan& out) {
  const registry::allocator_info& a = *registry::info(spec.allocator);
  const score_source source = registry::info(spec.scorer)->source;
  const auto keys = make_contiguous_view(c.keys.data(), 1, c.heads, c.tokens, c.dim);
  const std::vector<segment> segs = spec.allocator == allocator_kind::fair_paper ? c.paper_spans
                                    : a.uses_segments                            ? c.segments
                                                                                 : std::vector<segment>{};
  const std::vector<std::int32_t> wl = a.uses_whitelist ? c.whitelist : std::vector<std::int32_t>{};
  if (is_attention_source(source))
    return fairkv_test::plan_by_spec(
        spec, with_queries(keys, make_contiguous_view(c.queries.data(), 1, c.heads * c.groups, c.tokens, c.dim)), segs,
        wl, target, out);
  if (source == score_source::external)
    return fairkv_test::plan_by_spec(
        spec, with_scores(keys, make_contiguous_scores(c.scores.data(), 1, c.heads, c.tokens)), segs, wl, target, out);
  return fairkv_test::plan_by_spec(spec, keys_only(keys), segs, wl, target, out);
}

}  // namespace

TEST_CASE("token budget property: the plan of budget n is the plan of the ratio r with keep_budget(L, r) == n") {
  std::mt19937 rng(1401);
  const scorer_kind scorers_[] = {scorer_kind::knorm, scorer_kind::streaming_llm, scorer_kind::snapkv,
                                  scorer_kind::tova,  scorer_kind::h2o,           scorer_kind::external};
  const selection_kind selectors_[] = {selection_kind::per_head, selection_kind::union_heads,
                                       selection_kind::head_adaptive};
  const allocator_kind allocators_[] = {allocator_kind::uniform, allocator_kind::whitelist, allocator_kind::fair,
                                        allocator_kind::fair_with_whitelist, allocator_kind::debias,
                                        allocator_kind::fair_paper};
  int compared = 0, no_ratio = 0, refused = 0;
  for (int rep = 0; rep < 3; ++rep)
    for (const scorer_kind s : scorers_)
      for (const selection_kind sel : selectors_)
        for (const allocator_kind a : allocators_) {
          if (s == scorer_kind::external && a == allocator_kind::fair_paper) continue;  // refused by design
          const budget_case c = make_budget_case(rng);
          policy_spec spec;
          spec.scorer = s;
          spec.selector = sel;
          spec.allocator = a;
          spec.window = 1 + static_cast<std::int32_t>(rng() % 8);
          spec.lambda = 0.5f;
          spec.sinks = static_cast<std::int32_t>(rng() % 3);
          const std::int64_t L = c.tokens;
          const std::int64_t n = rng() % 5 == 0 ? L + static_cast<std::int64_t>(rng() % 5)
                                                : 1 + static_cast<std::int64_t>(rng() % L);
          const std::int64_t kept = std::min(n, L);
          const std::optional<double> r = ratio_for(L, kept);
          CAPTURE(static_cast<int>(s));
          CAPTURE(static_cast<int>(sel));
          CAPTURE(static_cast<int>(a));
          CAPTURE(L);
          CAPTURE(n);
          keep_plan by_tokens, by_ratio;
          const result rt = plan_case(spec, c, keep_target::of_tokens(n), by_tokens);
          if (!r) {
            ++no_ratio;
            continue;
          }
          const result rr = plan_case(spec, c, *r, by_ratio);  // a double: a ratio
          // Same request, same answer: both succeed, or both refuse with one status (a whitelist larger than n).
          REQUIRE(rt.code() == rr.code());
          if (!rt.ok()) {
            CHECK(rt.code() == status::budget_exceeded);
            ++refused;
            continue;
          }
          CHECK(rows_of(by_tokens) == rows_of(by_ratio));
          fairkv_test::check_plan_invariants(by_tokens);
          std::int64_t total = 0;
          for (std::int64_t h = 0; h < c.heads; ++h) {
            total += by_tokens.count(0, h);
            if (sel != selection_kind::head_adaptive) CHECK(by_tokens.count(0, h) == kept);
          }
          CHECK(total == c.heads * kept);
          ++compared;
        }
  MESSAGE(compared << " token-budget plans equal to their ratio's, " << refused << " refused alike, " << no_ratio
                   << " budgets with no exact ratio");
  CHECK(compared > 200);
}

// ---------------------------------------------------------------------------------------------------------------
TEST_CASE("remap: hand-worked segments and whitelist through one row") {
  // Sequence of 8 tokens, every head keeps {1, 2, 5, 7}: new 0 <- 1, 1 <- 2, 2 <- 5, 3 <- 7.
  std::vector<std::int32_t> indices = {1, 2, 5, 7, 0, 0, 0, 0, 1, 2, 5, 7, 0, 0, 0, 0};
  std::vector<std::int32_t> counts = {4, 4}, lengths = {8};
  const const_keep_plan_view plan{indices.data(), counts.data(), lengths.data(), 1, 2, 8};
  const std::vector<segment> segs = {{5, 8}, {3, 5}, {0, 3}};
  std::vector<segment> out_segs;
  remap_counts n;
  REQUIRE(remap_segments(plan, 0, segs, out_segs, n).ok());
  CHECK(n.written == 2);
  CHECK(n.dropped == 1);  // [3, 5) kept nothing
  REQUIRE(out_segs.size() == 2);
  CHECK((out_segs[0].begin == 2 && out_segs[0].end == 4));
  CHECK((out_segs[1].begin == 0 && out_segs[1].end == 2));
  const std::vector<std::int32_t> wl = {5, 3, 7, 1, 5};
  std::vector<std::int32_t> out_wl;
  REQUIRE(remap_whitelist(plan, 0, wl, out_wl, n).ok());
  CHECK(out_wl == std::vector<std::int32_t>{2, 3, 0, 2});
  CHECK(n.dropped == 1);
  // In place, through the span overloads.
  std::vector<segment> inplace = segs;
  REQUIRE(remap_segments(plan, 0, inplace, std::span<segment>(inplace), n).ok());
  CHECK((n.written == 2 && inplace[0].begin == 2 && inplace[1].end == 2));
  // Heads that differ: no per-sequence map, but each head has its own.
  indices[8 + 3] = 6;
  const result differ = remap_segments(plan, 0, segs, out_segs, n);
  CHECK(differ.code() == status::invalid_argument);
  CHECK(std::string(differ.message()) ==
        "heads 0 and 1 of sequence 0 keep different tokens, so the sequence has no single map: plan with "
        "union_heads, or remap per head");
  REQUIRE(remap_whitelist(plan, 0, wl, out_wl, n, 1).ok());
  CHECK(out_wl == std::vector<std::int32_t>{2, 0, 2});
  CHECK(n.dropped == 2);
}

TEST_CASE("remap: refusals, and nothing written on error") {
  std::vector<std::int32_t> indices = {0, 2, 3, 9}, counts = {3}, lengths = {4};
  const const_keep_plan_view plan{indices.data(), counts.data(), lengths.data(), 1, 1, 4};
  const std::vector<segment> segs = {{0, 2}};
  const std::vector<segment> sentinel(3, segment{7, 9});
  std::vector<segment> out = sentinel;
  remap_counts n{5, 6};
  auto code = [&](const result& r) {
    CHECK(same_segments(out, sentinel));
    CHECK((n.written == 5 && n.dropped == 6));
    return r.code();
  };
  CHECK(code(remap_segments(plan, 1, segs, std::span<segment>(out), n)) == status::out_of_range);
  CHECK(code(remap_segments(plan, -1, segs, std::span<segment>(out), n)) == status::out_of_range);
  CHECK(code(remap_segments(plan, 0, segs, std::span<segment>(out), n, 1)) == status::out_of_range);
  CHECK(code(remap_segments(plan, 0, std::vector<segment>{{2, 2}}, std::span<segment>(out), n)) ==
        status::out_of_range);  // empty input segment
  CHECK(code(remap_segments(plan, 0, std::vector<segment>{{0, 5}}, std::span<segment>(out), n)) ==
        status::out_of_range);  // beyond the plan's length
  CHECK(code(remap_segments(plan, 0, std::vector<segment>{{0, 3}, {2, 4}}, std::span<segment>(out), n)) ==
        status::overlapping_segments);
  CHECK(code(remap_segments(plan, 0, std::vector<segment>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}, std::span<segment>(out), n)) ==
        status::invalid_shape);  // room for 3
  std::vector<std::int32_t> wl_out(3, 42);
  CHECK(remap_whitelist(plan, 0, std::vector<std::int32_t>{4}, std::span<std::int32_t>(wl_out), n).code() ==
        status::out_of_range);
  CHECK(wl_out == std::vector<std::int32_t>(3, 42));
  counts[0] = 4;  // index 9 is outside the length 4
  CHECK(code(remap_segments(plan, 0, segs, std::span<segment>(out), n)) == status::invalid_plan);
  const const_keep_plan_view null_plan{nullptr, counts.data(), lengths.data(), 1, 1, 4};
  CHECK(code(remap_segments(null_plan, 0, segs, std::span<segment>(out), n)) == status::null_pointer);
}

namespace {

// Old index of every slot after compaction, read back from a compacted K (and V) whose values encoded the index.
template <class Sel, class A>
void check_remap_through_compaction(std::mt19937& rng, Sel sel, A alloc, bool per_head) {
  const std::int64_t H = 1 + static_cast<std::int64_t>(rng() % 3), L = 2 + static_cast<std::int64_t>(rng() % 120);
  const std::int64_t D = 4;
  const std::vector<float> keys = fairkv_test::random_floats(static_cast<std::size_t>(H * L * D), rng());
  std::vector<segment> segs;
  std::set<std::int32_t> cuts;
  for (int i = 0, n = static_cast<int>(rng() % 10); i < n; ++i) cuts.insert(static_cast<std::int32_t>(rng() % (L + 1)));
  const std::vector<std::int32_t> cv(cuts.begin(), cuts.end());
  for (std::size_t i = 0; i + 1 < cv.size(); i += 2) segs.push_back({cv[i], cv[i + 1]});
  std::shuffle(segs.begin(), segs.end(), rng);
  // At least the boundary tokens (at most two per segment), and room for them beside the whitelist.
  const auto n_segs = static_cast<std::int64_t>(segs.size());
  const std::int64_t budget = std::max(1 + static_cast<std::int64_t>(rng() % L), std::min(L, 2 * n_segs));
  const std::int64_t room = std::max<std::int64_t>(0, budget - 2 * n_segs);
  std::vector<std::int32_t> wl;
  for (int i = 0, n = static_cast<int>(rng() % (room + 1)); i < n; ++i)
    wl.push_back(static_cast<std::int32_t>(rng() % L));
  const policy pol{scorers::knorm{}, sel, alloc};
  keep_plan plan;
  const result pr = cpu::plan(pol, keys_only(make_contiguous_view(keys.data(), 1, H, L, D)),
                              A::uses_segments ? segs : std::vector<segment>{},
                              A::uses_whitelist ? wl : std::vector<std::int32_t>{}, keep_target::of_tokens(budget),
                              plan);
  REQUIRE_MESSAGE(pr.ok(), std::string(pr.message()));
  // K and V where token t of head h holds t (and V: t + 0.5) in every element.
  std::vector<float> k(static_cast<std::size_t>(H * L * D)), v(k.size());
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t t = 0; t < L; ++t)
      for (std::int64_t d = 0; d < D; ++d) {
        k[static_cast<std::size_t>((h * L + t) * D + d)] = static_cast<float>(t);
        v[static_cast<std::size_t>((h * L + t) * D + d)] = static_cast<float>(t) + 0.5f;
      }
  REQUIRE(cpu::compact(plan.view(), make_contiguous_view(k.data(), 1, H, L, D), make_contiguous_view(v.data(), 1, H, L, D))
              .ok());
  for (std::int64_t h = 0; h < (per_head ? H : 1); ++h) {
    const std::int64_t head = per_head ? h : every_head;
    const std::int64_t n = plan.count(0, h);
    auto old_of = [&](std::int64_t j) {
      const float x = k[static_cast<std::size_t>((h * L + j) * D)];
      CHECK(v[static_cast<std::size_t>((h * L + j) * D + D - 1)] == x + 0.5f);
      return static_cast<std::int32_t>(x);
    };
    std::vector<segment> mapped;
    remap_counts sc;
    REQUIRE(remap_segments(plan.view(), 0, segs, mapped, sc, head).ok());
    // Each old segment's kept tokens, in order, are exactly the slots of its remapped segment.
    std::size_t next = 0;
    for (const segment s : segs) {
      std::vector<std::int32_t> kept_old;
      for (std::int64_t j = 0; j < n; ++j)
        if (old_of(j) >= s.begin && old_of(j) < s.end) kept_old.push_back(old_of(j));
      if (kept_old.empty()) continue;
      REQUIRE(next < mapped.size());
      const segment m = mapped[next++];
      std::vector<std::int32_t> slots;
      for (std::int32_t j = m.begin; j < m.end; ++j) slots.push_back(old_of(j));
      CHECK(slots == kept_old);
    }
    CHECK(next == mapped.size());
    CHECK(sc.written + sc.dropped == segs.size());
    CHECK(validate_segments(mapped, n).ok());  // valid segments of the compacted cache
    // The whitelist: each kept position maps to the slot that now holds it.
    std::vector<std::int32_t> wl_new;
    remap_counts wc;
    REQUIRE(remap_whitelist(plan.view(), 0, wl, wl_new, wc, head).ok());
    if (A::uses_whitelist) CHECK(wc.dropped == 0);
    std::vector<std::int32_t> expect;
    for (const std::int32_t t : wl)
      for (std::int64_t j = 0; j < n; ++j)
        if (old_of(j) == t) expect.push_back(static_cast<std::int32_t>(j));
    CHECK(wl_new == expect);
    CHECK(wc.written + wc.dropped == wl.size());
  }
}

}  // namespace

TEST_CASE("remap property: remapped segments and whitelist match a compacted cache whose values encode the index") {
  std::mt19937 rng(1402);
  for (int i = 0; i < 60; ++i) {
    CAPTURE(i);
    // One map per sequence: union_heads; per head: per_head and head_adaptive.
    check_remap_through_compaction(rng, selectors::union_heads{}, allocators::fair_with_whitelist{{2, 0}}, false);
    check_remap_through_compaction(rng, selectors::union_heads{}, allocators::whitelist{}, false);
    check_remap_through_compaction(rng, selectors::per_head{}, allocators::fair_with_whitelist{{0, 1}}, true);
    check_remap_through_compaction(rng, selectors::head_adaptive{0.5f}, allocators::whitelist{}, true);
    check_remap_through_compaction(rng, selectors::union_heads{}, allocators::uniform{}, false);
  }
}

TEST_CASE("remap: a conversation compressed three times under a token budget keeps its whitelist") {
  // One head, a cache of 48 slots; each round appends 16 tokens and compresses back to 24.
  const std::int64_t cap = 48, D = 2;
  std::vector<float> k(static_cast<std::size_t>(cap * D)), v(k.size());
  std::int64_t L = 0;
  std::int32_t next_id = 0;
  auto append = [&](std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i, ++L, ++next_id)
      for (std::int64_t d = 0; d < D; ++d) {
        k[static_cast<std::size_t>(L * D + d)] = d == 0 ? static_cast<float>(next_id) : std::sin(next_id * 1.7f);
        v[static_cast<std::size_t>(L * D + d)] = static_cast<float>(next_id);
      }
  };
  append(24);
  std::vector<segment> segs = {{0, 6}};       // the "system prompt"
  std::vector<std::int32_t> wl = {1, 3, 5};   // its defense
  const std::vector<float> ids_wl = {1.f, 3.f, 5.f};
  const policy pol{scorers::knorm{}, selectors::union_heads{}, allocators::fair_with_whitelist{{4, 0}}};
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    append(16);
    keep_plan plan;
    const auto keys = make_capacity_view(std::as_const(k).data(), 1, 1, L, cap, D);
    REQUIRE(cpu::plan(pol, keys_only(keys), segs, wl, keep_target::of_tokens(24), plan).ok());
    REQUIRE(plan.count(0, 0) == 24);
    REQUIRE(cpu::compact(plan.view(), make_capacity_view(k.data(), 1, 1, L, cap, D),
                         make_capacity_view(v.data(), 1, 1, L, cap, D))
                .ok());
    remap_counts n;
    REQUIRE(remap_segments(plan.view(), 0, segs, segs, n).ok());
    REQUIRE(remap_whitelist(plan.view(), 0, wl, wl, n).ok());
    CHECK(n.dropped == 0);
    L = plan.count(0, 0);
    for (std::size_t i = 0; i < wl.size(); ++i) CHECK(v[static_cast<std::size_t>(wl[i] * D)] == ids_wl[i]);
    REQUIRE(segs.size() == 1);
    for (std::int32_t j = segs[0].begin; j < segs[0].end; ++j) CHECK(v[static_cast<std::size_t>(j * D)] < 6.f);
  }
}
