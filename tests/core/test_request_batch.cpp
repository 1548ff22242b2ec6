// Per-request planning (request_batch: CSR segments, whitelists and targets, one call for the batch): each
// sequence's plan equals the single-list plan of that sequence alone, over ragged paged batches and dense ones;
// malformed CSR and one sequence's bad list are refused before anything is planned, naming the sequence.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
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

namespace {

// The paged case's keys copied into a padded [B, H, Lmax, D] buffer; the padding is NaN, so a backend that read it
// would score (and keep) differently.
struct padded_copy {
  std::int64_t Lmax = 0;
  std::vector<float> k;
  std::vector<std::int32_t> lengths;
  [[nodiscard]] kv_view<const float> view(const ragged_case& c) const {
    return make_padded_view(static_cast<const float*>(k.data()), c.B, c.H, Lmax, c.D, lengths.data());
  }
};

padded_copy pad(const ragged_case& c) {
  padded_copy p;
  p.Lmax = *std::max_element(c.lengths.begin(), c.lengths.end()) + 3;  // room past the longest sequence too
  p.k.assign(static_cast<std::size_t>(c.B * c.H * p.Lmax * c.D), std::numeric_limits<float>::quiet_NaN());
  const auto paged = c.keys();
  const auto dense = make_contiguous_view(p.k.data(), c.B, c.H, p.Lmax, c.D);
  for (std::int64_t b = 0; b < c.B; ++b) {
    p.lengths.push_back(static_cast<std::int32_t>(c.lengths[static_cast<std::size_t>(b)]));
    for (std::int64_t h = 0; h < c.H; ++h)
      for (std::int64_t t = 0; t < p.lengths.back(); ++t)
        std::copy_n(paged.row(b, h, t), c.D, dense.row(b, h, t));
  }
  return p;
}

template <class Policy, class Q>
void check_padded_as_paged(const Policy& pol, const ragged_case& c, const padded_copy& p,
                           const layer_inputs<kv_view<const float>, Q>& extra, bool use_segments, bool use_whitelist) {
  const csr lists(c);
  request_batch req;
  if (use_segments) req.seg_indptr = lists.seg_indptr, req.segments = lists.segments;
  if (use_whitelist) req.wl_indptr = lists.wl_indptr, req.whitelist = lists.whitelist;
  req.targets = c.targets;
  layer_inputs<kv_view<const float>, Q> padded = extra;
  padded.keys = p.view(c);
  layer_inputs<paged_side<const float>, Q> paged{c.keys()};
  paged.queries = extra.queries;
  paged.attention_column_sums = extra.attention_column_sums;
  paged.attention_q_heads = extra.attention_q_heads;
  paged.attention_ld = extra.attention_ld;
  keep_plan a, b;
  const result ra = cpu::plan(cpu::serial_executor{}, pol, padded, req, a);
  REQUIRE_MESSAGE(ra.ok(), std::string(ra.message()));
  REQUIRE(cpu::plan(cpu::serial_executor{}, pol, paged, req, b).ok());
  for (std::int64_t s = 0; s < c.B; ++s) {
    CHECK(a.length(s) == c.lengths[static_cast<std::size_t>(s)]);
    for (std::int64_t h = 0; h < c.H; ++h) {
      INFO(std::string(Policy::scorer_type::name) << " x " << std::string(Policy::allocator_type::name)
                                                  << ", sequence " << s << " head " << h << ": padded "
                                                  << list(a.kept(s, h)) << ", paged " << list(b.kept(s, h)));
      CHECK(a.kept(s, h) == b.kept(s, h));
    }
  }
}

}  // namespace

TEST_CASE("padded batches: [B, H, Lmax, D] with each sequence's length plans as the same keys paged, padding unread") {
  std::mt19937 rng(4711);
  for (int round = 0; round < 40; ++round) {
    const ragged_case c = random_case(rng);
    const padded_copy p = pad(c);
    CAPTURE(round);
    const layer_inputs<kv_view<const float>> none{};
    check_padded_as_paged(policy<scorers::knorm, selectors::per_head, allocators::fair>{}, c, p, none, true, false);
    check_padded_as_paged(policy<scorers::knorm, selectors::union_heads, allocators::fair_with_whitelist>{}, c, p,
                          none, true, true);
    check_padded_as_paged(policy<scorers::streaming_llm<>, selectors::per_head, allocators::whitelist>{}, c, p, none,
                          false, true);
    check_padded_as_paged(policy<scorers::knorm, selectors::head_adaptive, allocators::debias>{}, c, p, none, true,
                          true);
    // Attention: SnapKV from the last window's queries of each sequence, H2O from column sums [B, H, ld].
    const std::int64_t shortest = *std::min_element(c.lengths.begin(), c.lengths.end());
    const std::int64_t window = std::min<std::int64_t>(shortest, 1 + static_cast<std::int64_t>(rng() % 8));
    const auto queries = fairkv_test::random_floats(static_cast<std::size_t>(c.B * c.H * window * c.D), rng());
    layer_inputs<kv_view<const float>> snap{};
    snap.queries = make_contiguous_view(queries.data(), c.B, c.H, window, c.D);
    scorers::snapkv<> sk{};
    sk.window = static_cast<std::int32_t>(window);
    check_padded_as_paged(policy<scorers::snapkv<>, selectors::per_head, allocators::uniform>{sk}, c, p, snap, false,
                          false);
    const auto sums = fairkv_test::random_floats(static_cast<std::size_t>(c.B * c.H * p.Lmax), rng());
    layer_inputs<kv_view<const float>> h2o{};
    h2o.attention_column_sums = sums.data();
    h2o.attention_q_heads = c.H;
    h2o.attention_ld = p.Lmax;
    check_padded_as_paged(policy<scorers::h2o, selectors::per_head, allocators::whitelist>{}, c, p, h2o, false, true);
  }
}

TEST_CASE("padded batches: compaction moves each sequence's kept rows and nothing else; bad lengths are refused") {
  std::mt19937 rng(99);
  ragged_case c = random_case(rng);
  while (c.B < 2) c = random_case(rng);
  padded_copy p = pad(c);
  for (float& x : p.k)
    if (std::isnan(x)) x = -7.f;  // padding a compaction must leave as it is
  std::vector<float> v = fairkv_test::random_floats(p.k.size(), 5);
  const policy<scorers::knorm, selectors::per_head, allocators::uniform> pol{};
  keep_plan plan;
  REQUIRE(cpu::plan(pol, keys_only(p.view(c)), {}, {}, 0.5, plan).ok());
  const std::vector<float> k0 = p.k, v0 = v;
  auto kv = make_padded_view(p.k.data(), c.B, c.H, p.Lmax, c.D, p.lengths.data());
  auto vv = make_padded_view(v.data(), c.B, c.H, p.Lmax, c.D, p.lengths.data());
  // Refused before any write: a plan made for other lengths; lengths past the view.
  std::vector<std::int32_t> other = p.lengths;
  other[1] -= 1;
  auto wrong = kv;
  wrong.lengths = other.data();
  keep_plan copy = plan;
  result r = cpu::compact(copy.view(), wrong, vv);
  CHECK(r.code() == status::invalid_plan);
  CHECK(std::string(r.message()).find("keys sequence 1 has") != std::string::npos);
  std::vector<std::int32_t> past = p.lengths;
  past[0] = static_cast<std::int32_t>(p.Lmax + 1);
  auto wrong_v = vv;
  wrong_v.lengths = past.data();
  r = cpu::compact(copy.view(), kv, wrong_v);
  CHECK(r.code() == status::invalid_shape);
  CHECK(std::string(r.message()).find("values.lengths[0] = " + std::to_string(p.Lmax + 1) + " is outside [0, tokens " +
                                      std::to_string(p.Lmax) + "]") != std::string::npos);
  CHECK(p.k == k0);
  CHECK(v == v0);
  REQUIRE(cpu::compact(plan.view(), kv, vv).ok());
  const auto before_k = make_contiguous_view(k0.data(), c.B, c.H, p.Lmax, c.D);
  const auto before_v = make_contiguous_view(v0.data(), c.B, c.H, p.Lmax, c.D);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) {
      const auto kept = plan.kept(b, h);
      for (std::int64_t t = 0; t < p.Lmax; ++t) {
        const bool moved = t < static_cast<std::int64_t>(kept.size());
        const std::int64_t from = moved ? kept[static_cast<std::size_t>(t)] : t;
        CAPTURE(t);
        CHECK(std::equal(kv.row(b, h, t), kv.row(b, h, t) + c.D, before_k.row(b, h, from)));
        CHECK(std::equal(vv.row(b, h, t), vv.row(b, h, t) + c.D, before_v.row(b, h, from)));
      }
    }
}

TEST_CASE("padded batches: lengths outside the view and queries with lengths are refused; an empty sequence plans to "
          "nothing") {
  const std::int64_t B = 3, H = 2, L = 16, D = 4;
  auto k = fairkv_test::random_floats(static_cast<std::size_t>(B * H * L * D), 3);
  const policy<scorers::knorm, selectors::per_head, allocators::uniform> pol{};
  const auto refused = [&](std::vector<std::int32_t> lengths, status code, const std::string& needle) {
    keep_plan p;
    const result r = cpu::plan(pol, keys_only(make_padded_view(k.data(), B, H, L, D, lengths.data())), {}, {}, 0.5, p);
    INFO(std::string(r.message()));
    CHECK(r.code() == code);
    CHECK(std::string(r.message()).find(needle) != std::string::npos);
  };
  refused({16, 17, 3}, status::invalid_shape, "inputs.keys.lengths[1] = 17 is outside [0, tokens 16]");
  refused({16, 5, -1}, status::invalid_shape, "inputs.keys.lengths[2] = -1 is outside [0, tokens 16]");
  refused({0, 0, 0}, status::empty_cache, "all 3 sequences of inputs.keys are empty");
  const std::vector<std::int32_t> lengths{16, 9, 3};
  keep_plan p;
  REQUIRE(cpu::plan(pol, keys_only(make_padded_view(k.data(), B, H, L, D, lengths.data())), {}, {}, 0.5, p).ok());
  CHECK(p.length(1) == 9);
  CHECK(p.count(2, 0) == static_cast<std::int32_t>(keep_budget(3, 0.5)));
  // An idle slot (no tokens) plans to nothing; the others as planned alone. One list applies to the sequences with
  // tokens; a sequence's own list for an empty sequence is refused, naming it.
  const std::vector<std::int32_t> idle{16, 0, 3};
  const std::vector<segment> segs{{0, 2}};
  const policy<scorers::knorm, selectors::per_head, allocators::fair> fair{};
  REQUIRE(cpu::plan(fair, keys_only(make_padded_view(k.data(), B, H, L, D, idle.data())), segs, {}, 0.5, p).ok());
  for (std::int64_t b = 0; b < B; ++b) {
    CHECK(p.length(b) == idle[static_cast<std::size_t>(b)]);
    if (idle[static_cast<std::size_t>(b)] == 0) {
      for (std::int64_t h = 0; h < H; ++h) CHECK(p.count(b, h) == 0);
      continue;
    }
    keep_plan alone;
    const kv_view<const float> one{k.data() + b * H * L * D, 1, H, idle[static_cast<std::size_t>(b)], D,
                                   H * L * D,                L * D, D,                                1};
    REQUIRE(cpu::plan(fair, keys_only(one), segs, {}, 0.5, alone).ok());
    for (std::int64_t h = 0; h < H; ++h) CHECK(p.kept(b, h) == alone.kept(0, h));
  }
  const std::vector<std::int32_t> seg_indptr{0, 1, 2, 2};
  const std::vector<segment> two{{0, 2}, {0, 1}};
  const keep_target half = 0.5;
  const result own = cpu::plan(cpu::serial_executor{}, fair,
                               keys_only(make_padded_view(k.data(), B, H, L, D, idle.data())),
                               request_batch{seg_indptr, two, {}, {}, {&half, 1}}, p);
  CHECK(own.code() == status::invalid_argument);
  CHECK(std::string(own.message()) ==
        "sequence 1: the sequence has no tokens but 1 segments and 0 whitelist positions were given for it");
  // The padded views compact the same way: nothing moves in the empty sequence.
  std::vector<float> kc = k, vc = fairkv_test::random_floats(k.size(), 8);
  const std::vector<float> k0 = kc, v0 = vc;
  REQUIRE(cpu::plan(pol, keys_only(make_padded_view(kc.data(), B, H, L, D, idle.data())), {}, {}, 0.5, p).ok());
  REQUIRE(cpu::compact(p.view(), make_padded_view(kc.data(), B, H, L, D, idle.data()),
                       make_padded_view(vc.data(), B, H, L, D, idle.data()))
              .ok());
  CHECK(std::equal(kc.begin() + H * L * D, kc.begin() + 2 * H * L * D, k0.begin() + H * L * D));
  CHECK(std::equal(vc.begin() + H * L * D, vc.begin() + 2 * H * L * D, v0.begin() + H * L * D));
  // The window's queries are the last of each sequence: lengths on them describe nothing.
  const auto q = fairkv_test::random_floats(static_cast<std::size_t>(B * H * 2 * D), 4);
  auto qv = make_padded_view(q.data(), B, H, 2, D, lengths.data());
  const auto in = with_queries(make_padded_view(k.data(), B, H, L, D, lengths.data()), qv);
  const result r = cpu::plan(policy<scorers::snapkv<>, selectors::per_head, allocators::uniform>{}, in, {}, {}, 0.5, p);
  CHECK(r.code() == status::invalid_argument);
  CHECK(std::string(r.message()).find("inputs.queries.lengths is set") != std::string::npos);
}
