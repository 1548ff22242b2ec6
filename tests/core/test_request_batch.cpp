// Per-request planning (request_batch: CSR segments, whitelists and targets, one call for the batch): each
// sequence's plan equals the single-list plan of that sequence alone, over ragged paged batches and dense ones;
// malformed CSR and one sequence's bad list are refused before anything is planned, naming the sequence.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

std::string list(const std::vector<std::int32_t>& v) {
  std::string s;
  for (const std::int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

// Random disjoint segments inside [0, L): cut points, every other piece a segment.
std::vector<segment> random_segments(std::mt19937& rng, std::int64_t L) {
  std::vector<segment> out;
  std::int32_t t = static_cast<std::int32_t>(rng() % 3);
  while (t < L) {
    const auto len = static_cast<std::int32_t>(1 + rng() % 9);
    const std::int32_t end = std::min<std::int32_t>(static_cast<std::int32_t>(L), t + len);
    out.push_back({t, end});
    t = end + static_cast<std::int32_t>(rng() % 4);
  }
  std::shuffle(out.begin(), out.end(), rng);  // any order is accepted
  return out;
}

std::vector<std::int32_t> random_whitelist(std::mt19937& rng, std::int64_t L) {
  std::vector<std::int32_t> w;
  for (std::int32_t t = 0; t < L; ++t)
    if (rng() % 10 == 0) w.push_back(t);
  return w;
}

// One ragged paged batch and its per-request lists.
struct ragged_case {
  std::int64_t B = 0, H = 0, D = 8, P = 0;
  std::vector<float> kpool;
  std::vector<std::int32_t> indptr{0}, indices, last;
  std::vector<std::int64_t> lengths;
  std::vector<std::vector<segment>> segs;
  std::vector<std::vector<std::int32_t>> wls;
  std::vector<keep_target> targets;

  std::vector<std::array<std::int32_t, 2>> one_indptr;  // sequence b's table alone: {0, its pages}

  [[nodiscard]] paged_side<const float> keys() const {
    return {kpool.data(), pool_pages(), B, H, D, P, P * H * D, H * D, D, 1, indptr.data(), indices.data(), last.data()};
  }
  [[nodiscard]] paged_side<const float> keys_of(std::int64_t b) const {
    const auto i = static_cast<std::size_t>(b);
    const std::int32_t* table = indices.data() + indptr[i];
    return {kpool.data(), pool_pages(),   1, H, D, P, P * H * D, H * D, D, 1, one_indptr[i].data(),
            table,        last.data() + b};
  }
  [[nodiscard]] std::int64_t pool_pages() const { return static_cast<std::int64_t>(kpool.size()) / (P * H * D); }
};

ragged_case random_case(std::mt19937& rng) {
  ragged_case c;
  c.B = 1 + static_cast<std::int64_t>(rng() % 4);
  c.H = 1 + static_cast<std::int64_t>(rng() % 3);
  c.P = 1 + static_cast<std::int64_t>(rng() % 8);
  std::int64_t pages = 0;
  for (std::int64_t b = 0; b < c.B; ++b) {
    const std::int64_t L = 20 + static_cast<std::int64_t>(rng() % 60), np = (L + c.P - 1) / c.P;
    pages += np;
    c.one_indptr.push_back({0, static_cast<std::int32_t>(np)});
    c.indptr.push_back(static_cast<std::int32_t>(pages));
    c.last.push_back(static_cast<std::int32_t>(L - (np - 1) * c.P));
    c.lengths.push_back(L);
    c.segs.push_back(random_segments(rng, L));
    c.wls.push_back(random_whitelist(rng, L));
    // Ratios (evicted fractions) and budgets that hold each sequence's forced tokens (4 sinks and the whitelist).
    const auto wl = static_cast<std::int64_t>(c.wls.back().size());
    if (rng() % 2)
      c.targets.push_back(keep_target::of_ratio(0.1 + 0.4 * static_cast<double>(rng() % 100) / 100.0));
    else
      c.targets.push_back(
          keep_target::of_tokens(std::min<std::int64_t>(L, 8 + wl + static_cast<std::int64_t>(rng() % L))));
  }
  c.indices.resize(static_cast<std::size_t>(pages));
  std::iota(c.indices.begin(), c.indices.end(), 0);
  std::shuffle(c.indices.begin(), c.indices.end(), rng);
  c.kpool = fairkv_test::random_floats(static_cast<std::size_t>(pages * c.P * c.H * c.D), rng());
  return c;
}

// CSR of the case's lists.
struct csr {
  std::vector<std::int32_t> seg_indptr{0}, wl_indptr{0}, whitelist;
  std::vector<segment> segments;
  explicit csr(const ragged_case& c) {
    for (std::int64_t b = 0; b < c.B; ++b) {
      const auto i = static_cast<std::size_t>(b);
      segments.insert(segments.end(), c.segs[i].begin(), c.segs[i].end());
      seg_indptr.push_back(static_cast<std::int32_t>(segments.size()));
      whitelist.insert(whitelist.end(), c.wls[i].begin(), c.wls[i].end());
      wl_indptr.push_back(static_cast<std::int32_t>(whitelist.size()));
    }
  }
};

// Each sequence of a per-request plan against the single-list plan of that sequence alone.
template <class Policy>
void check_against_single(const Policy& pol, const ragged_case& c, bool use_segments, bool use_whitelist) {
  const csr lists(c);
  request_batch req;
  if (use_segments) req.seg_indptr = lists.seg_indptr, req.segments = lists.segments;
  if (use_whitelist) req.wl_indptr = lists.wl_indptr, req.whitelist = lists.whitelist;
  req.targets = c.targets;
  keep_plan batch_plan;
  const result r =
      cpu::plan(cpu::serial_executor{}, pol, layer_inputs<paged_side<const float>>{c.keys()}, req, batch_plan);
  REQUIRE_MESSAGE(r.ok(), std::string(r.message()));
  for (std::int64_t b = 0; b < c.B; ++b) {
    const auto i = static_cast<std::size_t>(b);
    keep_plan single;
    const std::span<const segment> segs =
        use_segments ? std::span<const segment>(c.segs[i]) : std::span<const segment>{};
    const std::span<const std::int32_t> wl =
        use_whitelist ? std::span<const std::int32_t>(c.wls[i]) : std::span<const std::int32_t>{};
    const result rs =
        cpu::plan(pol, layer_inputs<paged_side<const float>>{c.keys_of(b)}, segs, wl, c.targets[i], single);
    REQUIRE_MESSAGE(rs.ok(), std::string(rs.message()));
    CHECK(batch_plan.view().lengths[b] == c.lengths[i]);
    for (std::int64_t h = 0; h < c.H; ++h) {
      CAPTURE(b);
      CAPTURE(h);
      const auto x = batch_plan.kept(b, h), y = single.kept(0, h);
      INFO(std::string(Policy::scorer_type::name)
           << " x " << std::string(Policy::allocator_type::name) << ": batch " << list(x) << ", alone " << list(y));
      CHECK(x == y);
    }
  }
}

}  // namespace

TEST_CASE("per-request plans: each sequence as if planned alone (ragged paged batches, fair, whitelist, selectors)") {
  std::mt19937 rng(2026);
  for (int round = 0; round < 60; ++round) {
    const ragged_case c = random_case(rng);
    CAPTURE(round);
    check_against_single(policy<scorers::knorm, selectors::per_head, allocators::fair>{}, c, true, false);
    check_against_single(policy<scorers::knorm, selectors::union_heads, allocators::fair_with_whitelist>{}, c, true,
                         true);
    check_against_single(policy<scorers::streaming_llm<>, selectors::per_head, allocators::whitelist>{}, c, false,
                         true);
    // (not the random scorer: its scores hash the sequence's index in the batch)
    check_against_single(policy<scorers::knorm, selectors::head_adaptive, allocators::debias>{}, c, true, true);
    check_against_single(policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, c, false, false);
  }
}

TEST_CASE("per-request plans: one target for all, sequences without segments, a dense batch") {
  const std::int64_t B = 3, H = 2, L = 24, D = 4;
  auto k = fairkv_test::random_floats(static_cast<std::size_t>(B * H * L * D), 7);
  const auto view = make_contiguous_view(k.data(), B, H, L, D).as_const();
  const std::vector<segment> segments{{0, 6}, {10, 20}, {3, 9}};  // sequence 0: two, sequence 1: none, 2: one
  const std::vector<std::int32_t> seg_indptr{0, 2, 2, 3};
  const keep_target half = 0.5;
  const request_batch req{seg_indptr, segments, {}, {}, {&half, 1}};
  const policy<scorers::knorm, selectors::per_head, allocators::fair> pol{};
  keep_plan p;
  REQUIRE(cpu::plan(cpu::serial_executor{}, pol, keys_only(view), req, p).ok());
  for (std::int64_t b = 0; b < B; ++b) {
    const kv_view<const float> one{view.data + b * view.stride_batch,
                                   1,
                                   H,
                                   L,
                                   D,
                                   view.stride_batch,
                                   view.stride_head,
                                   view.stride_token,
                                   view.stride_dim};
    keep_plan single;
    REQUIRE(cpu::plan(pol, keys_only(one), req.segments_of(b), {}, half, single).ok());
    for (std::int64_t h = 0; h < H; ++h) CHECK(p.kept(b, h) == single.kept(0, h));
  }
  // The per-request call with the same list for every sequence equals the single-list call.
  const std::vector<segment> shared{{2, 8}, {12, 22}};
  const std::vector<segment> repeated{{2, 8}, {12, 22}, {2, 8}, {12, 22}, {2, 8}, {12, 22}};
  const std::vector<std::int32_t> rep_indptr{0, 2, 4, 6};
  keep_plan a, b2;
  REQUIRE(cpu::plan(cpu::serial_executor{}, pol, keys_only(view),
                    request_batch{rep_indptr, repeated, {}, {}, {&half, 1}}, a)
              .ok());
  REQUIRE(cpu::plan(pol, keys_only(view), shared, {}, half, b2).ok());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) CHECK(a.kept(b, h) == b2.kept(b, h));
}

TEST_CASE("per-request plans refuse malformed CSR and a bad list, naming the sequence") {
  const std::int64_t B = 2, H = 1, L = 10, D = 2;
  auto k = fairkv_test::random_floats(static_cast<std::size_t>(B * H * L * D), 9);
  const auto in = keys_only(make_contiguous_view(k.data(), B, H, L, D).as_const());
  const policy<scorers::knorm, selectors::per_head, allocators::fair_with_whitelist> pol{};
  const std::vector<segment> segments{{0, 4}, {5, 9}};
  const std::vector<std::int32_t> wl{1, 2};
  const keep_target t = 0.5;
  const std::vector<keep_target> three{0.5, 0.5, 0.5};
  const auto refused = [&](const request_batch& req, status code, const char* needle) {
    keep_plan p;
    const result r = cpu::plan(cpu::serial_executor{}, pol, in, req, p);
    INFO(std::string(r.message()));
    CHECK(r.code() == code);
    CHECK(std::string(r.message()).find(needle) != std::string::npos);
  };
  const std::vector<std::int32_t> ok_indptr{0, 1, 2}, short_indptr{0, 2}, bad_start{1, 1, 2}, decreasing{0, 2, 1},
      bad_end{0, 1, 1};
  refused({short_indptr, segments, {}, {}, {&t, 1}}, status::invalid_shape, "seg_indptr has 2 entries");
  refused({bad_start, segments, {}, {}, {&t, 1}}, status::invalid_shape, "seg_indptr[0] = 1");
  refused({decreasing, segments, {}, {}, {&t, 1}}, status::invalid_shape, "seg_indptr decreases at 2");
  refused({bad_end, segments, {}, {}, {&t, 1}}, status::invalid_shape, "seg_indptr ends at 1 but 2 segments");
  refused({{}, segments, {}, {}, {&t, 1}}, status::invalid_argument, "2 segments were given without seg_indptr");
  refused({ok_indptr, segments, {}, wl, {&t, 1}}, status::invalid_argument, "without wl_indptr");
  refused({ok_indptr, segments, {}, {}, {}}, status::invalid_argument, "requests.targets is empty");
  refused({ok_indptr, segments, {}, {}, three}, status::invalid_shape, "3 keep targets for a batch of 2");
  // Sequence 1's segment ends past its tokens; sequence 1's whitelist position too.
  const std::vector<segment> too_long{{0, 4}, {5, 11}};
  refused({ok_indptr, too_long, {}, {}, {&t, 1}}, status::out_of_range, "sequence 1:");
  const std::vector<std::int32_t> wl_past{3, 10}, wl_indptr{0, 1, 2};
  refused({ok_indptr, segments, wl_indptr, wl_past, {&t, 1}}, status::out_of_range, "sequence 1:");
  const std::vector<keep_target> bad_target{0.5, keep_target::of_ratio(1.5)};
  refused({ok_indptr, segments, {}, {}, bad_target}, status::invalid_argument, "sequence 1:");
  // An allocator without segments refuses them, naming the first sequence that has any.
  keep_plan p;
  const result r = cpu::plan(cpu::serial_executor{}, policy<scorers::knorm, selectors::per_head, allocators::uniform>{},
                             in, request_batch{ok_indptr, segments, {}, {}, {&t, 1}}, p);
  CHECK(std::string(r.message()).find("sequence 0:") != std::string::npos);
  CHECK(std::string(r.message()).find("does not use segments") != std::string::npos);
}

TEST_CASE("a ragged batch's attention needs its leading dimension: 0 cannot mean every sequence's own length") {
  std::mt19937 rng(77);
  ragged_case c = random_case(rng);
  while (c.B < 2 || *std::min_element(c.lengths.begin(), c.lengths.end()) ==
                        *std::max_element(c.lengths.begin(), c.lengths.end()))
    c = random_case(rng);
  const std::int64_t Lmax = *std::max_element(c.lengths.begin(), c.lengths.end());
  const std::int64_t Lmin = *std::min_element(c.lengths.begin(), c.lengths.end());
  // H2O from column sums [B, H, ld] and TOVA from the last rows [B, H, 1, ld]: one layout for the whole batch.
  std::vector<float> sums(static_cast<std::size_t>(c.B * c.H * Lmax), 1.f), rows(sums);
  layer_inputs<paged_side<const float>> in{c.keys()};
  in.attention_column_sums = sums.data();
  in.attention_q_heads = c.H;
  keep_plan p;
  const policy<scorers::h2o, selectors::per_head, allocators::uniform> h2o{};
  result r = cpu::plan(h2o, in, {}, {}, 0.5, p);
  CHECK(r.code() == status::invalid_shape);
  CHECK(std::string(r.message()).find("inputs.attention_ld is 0 but the sequences have " + std::to_string(Lmin) +
                                      " to " + std::to_string(Lmax) + " tokens") != std::string::npos);
  in.attention_ld = Lmax;
  r = cpu::plan(h2o, in, {}, {}, 0.5, p);
  CHECK_MESSAGE(r.ok(), r.message());
  in.attention_column_sums = nullptr;
  in.attention = rows.data();
  in.attention_rows = 1;
  in.attention_ld = 0;
  const policy<scorers::tova, selectors::per_head, allocators::uniform> tova{};
  CHECK(cpu::plan(tova, in, {}, {}, 0.5, p).code() == status::invalid_shape);
  in.attention_ld = Lmax;
  r = cpu::plan(tova, in, {}, {}, 0.5, p);
  CHECK_MESSAGE(r.ok(), r.message());
}
