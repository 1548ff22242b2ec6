// Segment-local H2O from the engine's per-region column sums (layer_inputs::attention_local_column_sums) and the
// regions they are accumulated over (fairkv::scoring_regions): hand-worked values, the same plans as from the
// queries on random caches, and the refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "fairkv/fairkv.hpp"

using namespace fairkv;

namespace {

template <class Pol>
std::vector<segment> regions_of(const Pol& pol, const std::vector<segment>& segs, std::int64_t L) {
  std::vector<segment> out(max_scoring_regions(segs.size()));
  std::size_t n = 0;
  const result r = scoring_regions(pol, segs, L, out, n);
  REQUIRE_MESSAGE(r.ok(), r.message());
  out.resize(n);
  return out;
}

bool same(const std::vector<segment>& a, const std::vector<segment>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const segment& x, const segment& y) { return x.begin == y.begin && x.end == y.end; });
}

// The regions written out by hand: the segments in order and the gaps between them.
std::vector<segment> tiled(std::vector<segment> segs, std::int32_t L) {
  std::sort(segs.begin(), segs.end(), [](const segment& a, const segment& b) { return a.begin < b.begin; });
  std::vector<segment> out;
  std::int32_t pos = 0;
  for (const segment& s : segs) {
    if (s.begin > pos) out.push_back({pos, s.begin});
    out.push_back(s);
    pos = s.end;
  }
  if (pos < L) out.push_back({pos, L});
  return out;
}

// What an engine accumulates during its prefill: each query's causal softmax (float, as an engine computes it),
// summed whole (column sums) and renormalised to its region (local column sums). [batch, q_heads, L] each.
struct prefill_sums {
  std::vector<float> whole, local;
};
prefill_sums accumulate(const std::vector<float>& k, const std::vector<float>& q, std::int64_t B, std::int64_t H,
                        std::int64_t Hq, std::int64_t L, std::int64_t D, const std::vector<segment>& regions) {
  prefill_sums s{std::vector<float>(static_cast<std::size_t>(B * Hq * L)),
                 std::vector<float>(static_cast<std::size_t>(B * Hq * L))};
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> row(static_cast<std::size_t>(L));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t qh = 0; qh < Hq; ++qh) {
      const std::int64_t h = qh / (Hq / H);
      float* whole = s.whole.data() + (b * Hq + qh) * L;
      float* local = s.local.data() + (b * Hq + qh) * L;
      for (std::int64_t p = 0; p < L; ++p) {
        const float* qp = q.data() + ((b * Hq + qh) * L + p) * D;
        float m = -INFINITY;
        for (std::int64_t t = 0; t <= p; ++t) {
          const float* kt = k.data() + ((b * H + h) * L + t) * D;
          float dot = 0.f;
          for (std::int64_t e = 0; e < D; ++e) dot += qp[e] * kt[e];
          row[static_cast<std::size_t>(t)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        float z = 0.f;
        for (std::int64_t t = 0; t <= p; ++t) z += (row[static_cast<std::size_t>(t)] = std::exp(row[static_cast<std::size_t>(t)] - m));
        for (std::int64_t t = 0; t <= p; ++t) whole[t] += row[static_cast<std::size_t>(t)] / z;
        std::int32_t rb = 0;
        for (const segment& r : regions)
          if (p >= r.begin && p < r.end) rb = r.begin;
        float zr = 0.f;
        for (std::int64_t t = rb; t <= p; ++t) zr += row[static_cast<std::size_t>(t)];
        for (std::int64_t t = rb; t <= p; ++t) local[t] += row[static_cast<std::size_t>(t)] / zr;
      }
    }
  return s;
}

}  // namespace

TEST_CASE("scoring_regions: the segments and the runs between them, in position order; one region otherwise") {
  using fair_h2o = policy<scorers::h2o, selectors::per_head, allocators::fair>;
  const std::vector<segment> segs = {{7, 9}, {2, 4}, {4, 6}};
  CHECK(same(regions_of(fair_h2o{}, segs, 12), {{0, 2}, {2, 4}, {4, 6}, {6, 7}, {7, 9}, {9, 12}}));
  CHECK(same(regions_of(fair_h2o{}, segs, 12), tiled(segs, 12)));
  CHECK(same(regions_of(fair_h2o{}, {{0, 12}}, 12), {{0, 12}}));
  CHECK(same(regions_of(fair_h2o{}, {}, 5), {{0, 5}}));
  // Policies that score the whole sequence: not segment-local, not attention, or fair_paper's H2O.
  CHECK(same(regions_of(policy<scorers::h2o, selectors::per_head, allocators::whitelist>{}, {}, 12), {{0, 12}}));
  CHECK(same(regions_of(policy<scorers::knorm, selectors::per_head, allocators::fair>{}, segs, 12), {{0, 12}}));
  CHECK(same(regions_of(policy<scorers::h2o, selectors::per_head, allocators::fair_paper>{}, {{5, 9}, {2, 5}}, 12),
             {{0, 12}}));
  // fair_paper's SnapKV and TOVA: its two spans widened to [0, split) and [split, L).
  CHECK(same(regions_of(policy<scorers::tova, selectors::per_head, allocators::fair_paper>{}, {{5, 9}, {2, 5}}, 12),
             {{0, 5}, {5, 12}}));
  // Random layouts against the hand tiling.
  std::mt19937 rng(7);
  for (int it = 0; it < 200; ++it) {
    const auto L = static_cast<std::int32_t>(1 + rng() % 60);
    std::vector<std::int32_t> cuts;
    for (int i = 0; i < 8; ++i) cuts.push_back(static_cast<std::int32_t>(rng() % (L + 1)));
    std::sort(cuts.begin(), cuts.end());
    std::vector<segment> s;
    for (std::size_t i = 0; i + 1 < cuts.size(); i += 2)
      if (cuts[i] < cuts[i + 1]) s.push_back({cuts[i], cuts[i + 1]});
    std::shuffle(s.begin(), s.end(), rng);
    CHECK(same(regions_of(fair_h2o{}, s, L), tiled(s, L)));
  }
}

TEST_CASE("scoring_regions: refuses what the planners refuse, and a short output") {
  using fair_h2o = policy<scorers::h2o, selectors::per_head, allocators::fair>;
  std::vector<segment> out(7, segment{-1, -1});
  std::size_t n = 99;
  result r = scoring_regions(fair_h2o{}, std::vector<segment>{{0, 4}, {3, 6}}, 10, out, n);
  CHECK(r.code() == status::overlapping_segments);
  CHECK(n == 0);
  CHECK(out[0].begin == -1);
  r = scoring_regions(fair_h2o{}, std::vector<segment>{{0, 11}}, 10, out, n);
  CHECK(r.code() == status::out_of_range);
  r = scoring_regions(fair_h2o{}, std::vector<segment>{}, 0, out, n);
  CHECK(r.code() == status::invalid_argument);
  r = scoring_regions(fair_h2o{}, std::vector<segment>{{0, 2}, {4, 6}, {8, 9}, {9, 10}}, 10,
                      std::span<segment>(out.data(), 7), n);
  CHECK(r.code() == status::invalid_argument);
  CHECK(std::string(r.message()).find("9") != std::string::npos);
  r = scoring_regions(policy<scorers::tova, selectors::per_head, allocators::fair_paper>{},
                      std::vector<segment>{{0, 2}, {4, 6}}, 10, out, n);
  CHECK(r.code() == status::invalid_argument);
}

TEST_CASE("fair H2O from local column sums: hand-worked, each region renormalised on its own") {
  // 1 head, head_dim 1, keys [1, 0, 0, 0], every query ln 2; segment [0, 2), remainder [2, 4).
  //   region [0, 2): pos 0 -> [1]; pos 1 -> [2/3, 1/3]          sums [5/3, 1/3] / [2, 1] = [5/6, 1/3]
  //   region [2, 4): pos 2 -> [1]; pos 3 -> [1/2, 1/2]          sums [3/2, 1/2] / [2, 1] = [3/4, 1/2]
  // Fair at ratio 0.5 without sinks keeps one token of each region: 0 and 2.
  std::vector<float> k = {1, 0, 0, 0};
  std::vector<float> q(4, std::log(2.f));
  const std::vector<float> local = {5.f / 3, 1.f / 3, 1.5f, 0.5f};
  layer_inputs<kv_view<const float>> in{make_contiguous_view(k.data(), 1, 1, 4, 1).as_const()};
  in.attention_local_column_sums = local.data();
  in.attention_q_heads = 1;
  const policy<scorers::h2o, selectors::per_head, allocators::fair> fair_h2o{{}, {}, allocators::fair{{0, 0}}};
  keep_plan from_sums, from_queries;
  REQUIRE(cpu::plan(fair_h2o, in, std::vector<segment>{{0, 2}}, {}, 0.5, from_sums).ok());
  REQUIRE(cpu::plan(fair_h2o, with_queries(make_contiguous_view(k.data(), 1, 1, 4, 1),
                                             make_contiguous_view(q.data(), 1, 1, 4, 1)),
                    std::vector<segment>{{0, 2}}, {}, 0.5, from_queries)
              .ok());
  CHECK(from_sums.kept(0, 0) == std::vector<int>{0, 2});
  CHECK(from_queries.kept(0, 0) == std::vector<int>{0, 2});
  // Swapping the remainder's two sums flips its choice: the sums are what is read.
  const std::vector<float> swapped = {5.f / 3, 1.f / 3, 0.5f, 1.5f};
  in.attention_local_column_sums = swapped.data();
  keep_plan flipped;
  REQUIRE(cpu::plan(fair_h2o, in, std::vector<segment>{{0, 2}}, {}, 0.5, flipped).ok());
  // [0.5/2, 1.5/1] = [0.25, 1.5]: token 3 wins.
  CHECK(flipped.kept(0, 0) == std::vector<int>{0, 3});
}

TEST_CASE("segment-local H2O plans the same from the engine's local column sums as from the queries") {
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.f, 1.f);
  int compared = 0;
  for (int it = 0; it < 60; ++it) {
    const std::int64_t B = 1 + rng() % 2, H = 1 + rng() % 3, Hq = H * (1 + rng() % 3), D = 1 + rng() % 40;
    const auto L = static_cast<std::int32_t>(2 + rng() % 90);
    std::vector<float> k(static_cast<std::size_t>(B * H * L * D)), q(static_cast<std::size_t>(B * Hq * L * D));
    for (float& x : k) x = normal(rng);
    for (float& x : q) x = 2.f * normal(rng);  // peaked rows, as trained heads have
    std::vector<segment> segs;
    std::vector<std::int32_t> cuts;
    for (int i = 0; i < 6; ++i) cuts.push_back(static_cast<std::int32_t>(rng() % (L + 1)));
    std::sort(cuts.begin(), cuts.end());
    for (std::size_t i = 0; i + 1 < cuts.size(); i += 2)
      if (cuts[i] < cuts[i + 1]) segs.push_back({cuts[i], cuts[i + 1]});
    std::shuffle(segs.begin(), segs.end(), rng);
    std::vector<std::int32_t> wl;
    for (int i = 0; i < 2; ++i) wl.push_back(static_cast<std::int32_t>(rng() % L));
    const double ratio = 0.2 + 0.1 * static_cast<double>(rng() % 6);

    const auto keys = make_contiguous_view(k.data(), B, H, L, D);
    const auto from_q = with_queries(keys, make_contiguous_view(q.data(), B, Hq, L, D));
    auto check_policy = [&](const auto& pol, std::span<const std::int32_t> whitelist) {
      const prefill_sums sums = accumulate(k, q, B, H, Hq, L, D, regions_of(pol, segs, L));
      layer_inputs<kv_view<const float>> from_sums{keys.as_const()};
      from_sums.attention_local_column_sums = sums.local.data();
      from_sums.attention_column_sums = sums.whole.data();  // debias's own allocation reads these
      from_sums.attention_q_heads = Hq;
      keep_plan a, b;
      const result ra = cpu::plan(pol, from_q, segs, whitelist, ratio, a);
      const result rb = cpu::plan(pol, from_sums, segs, whitelist, ratio, b);
      REQUIRE_MESSAGE(ra.ok(), ra.message());
      REQUIRE_MESSAGE(rb.ok(), rb.message());
      for (std::int64_t s = 0; s < B; ++s)
        for (std::int64_t h = 0; h < H; ++h) CHECK(a.kept(s, h) == b.kept(s, h));
      ++compared;
    };
    check_policy(policy<scorers::h2o, selectors::per_head, allocators::fair>{}, {});
    check_policy(policy<scorers::h2o, selectors::union_heads, allocators::fair_with_whitelist>{}, wl);
    check_policy(policy<scorers::h2o, selectors::per_head, allocators::debias>{}, wl);
    allocators::prioritized pr{};
    check_policy(policy<scorers::h2o, selectors::per_head, allocators::prioritized>{{}, {}, pr}, wl);
  }
  CHECK(compared == 240);
}

TEST_CASE("local column sums: which H2O inputs each allocator accepts") {
  std::vector<float> k(2 * 10 * 4, 0.5f), sums(2 * 10, 0.1f);
  const auto keys = make_contiguous_view(k.data(), 1, 2, 10, 4);
  layer_inputs<kv_view<const float>> local_only{keys.as_const()}, whole_only{keys.as_const()};
  local_only.attention_local_column_sums = sums.data();
  local_only.attention_q_heads = 2;
  whole_only.attention_column_sums = sums.data();
  whole_only.attention_q_heads = 2;
  keep_plan plan;
  const std::vector<segment> segs = {{0, 4}};
  auto expect = [&](const auto& pol, const layer_inputs<kv_view<const float>>& in, std::span<const segment> s,
                    const char* needle) {
    const result r = cpu::plan(pol, in, s, {}, 0.5, plan);
    CHECK(r.code() == status::missing_input);
    CHECK_MESSAGE(std::string(r.message()).find(needle) != std::string::npos, r.message());
  };
  expect(policy<scorers::h2o, selectors::per_head, allocators::fair>{}, whole_only, segs, "attention_local_column_sums");
  expect(policy<scorers::h2o, selectors::per_head, allocators::uniform>{}, local_only, {}, "whole sequence");
  expect(policy<scorers::h2o, selectors::per_head, allocators::debias>{}, local_only, segs, "attention_column_sums too");
  expect(policy<scorers::h2o, selectors::per_head, allocators::fair_paper>{}, local_only,
         std::vector<segment>{{0, 4}, {4, 10}}, "fair_paper");
  CHECK(cpu::plan(policy<scorers::h2o, selectors::per_head, allocators::fair>{}, local_only, segs, {}, 0.5, plan).ok());
}
