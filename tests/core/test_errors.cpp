// Every invalid argument gives a status whose message names it, and the engine's memory is untouched.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {
struct cache {
  std::int64_t H = 2, L = 20, D = 4;
  std::vector<float> k = fairkv_test::random_floats(static_cast<std::size_t>(H * L * D), 1);
  std::vector<float> v = fairkv_test::random_floats(static_cast<std::size_t>(H * L * D), 2);
  std::vector<float> q = fairkv_test::random_floats(static_cast<std::size_t>(2 * H * L * D), 3);
  kv_view<float> kv() { return make_contiguous_view(k.data(), 1, H, L, D); }
  kv_view<float> vv() { return make_contiguous_view(v.data(), 1, H, L, D); }
};

// Plans with an invalid argument, then tries to compact with whatever plan results: the cache must be
// bit-identical afterwards, the status as expected, and the message must name `needle`.
template <class P, class In>
void expect_error(cache& c, const P& pol, const In& in, std::vector<segment> segs, std::vector<std::int32_t> wl,
                  double ratio, status code, const char* needle) {
  const auto k0 = c.k, v0 = c.v;
  keep_plan plan;
  const result r = cpu::plan(pol, in, segs, wl, ratio, plan);
  CHECK(r.code() == code);
  INFO("message: " << r.message());
  CHECK(std::string(r.message()).find(needle) != std::string::npos);
  CHECK(std::memcmp(c.k.data(), k0.data(), k0.size() * 4) == 0);
  CHECK(std::memcmp(c.v.data(), v0.data(), v0.size() * 4) == 0);
}

using knorm_fair = policy<scorers::knorm, selectors::per_head, allocators::fair_with_whitelist>;
}  // namespace

TEST_CASE("invalid ratio, segments, whitelist") {
  cache c;
  const auto in = keys_only(c.kv());
  expect_error(c, knorm_fair{}, in, {}, {}, 1.0, status::invalid_argument, "ratio");
  expect_error(c, knorm_fair{}, in, {}, {}, -0.1, status::invalid_argument, "ratio");
  expect_error(c, knorm_fair{}, in, {}, {}, std::nan(""), status::invalid_argument, "ratio");
  expect_error(c, knorm_fair{}, in, {{0, 5}, {4, 8}}, {}, 0.5, status::overlapping_segments, "overlaps");
  expect_error(c, knorm_fair{}, in, {{15, 25}}, {}, 0.5, status::out_of_range, "segments[0]");
  expect_error(c, knorm_fair{}, in, {{5, 5}}, {}, 0.5, status::out_of_range, "segments[0]");
  expect_error(c, knorm_fair{}, in, {}, {3, 20}, 0.5, status::out_of_range, "whitelist[1]");
  expect_error(c, knorm_fair{}, in, {}, {-1}, 0.5, status::out_of_range, "whitelist[0]");
  // 20 tokens at ratio 0.9 keep 1 (20 * (1 - 0.9) is 1.9999999999999996 in double): a whitelist of 3 distinct
  // positions cannot fit, and duplicates count once.
  expect_error(c, knorm_fair{}, in, {}, {1, 2, 3, 3}, 0.9, status::budget_exceeded, "whitelist holds 3");
  keep_plan ok_plan;
  CHECK(cpu::plan(knorm_fair{}, in, std::vector<segment>{}, std::vector<std::int32_t>{1, 1}, 0.9, ok_plan).ok());
  // Segments or a whitelist given to an allocator that would ignore them is an error, not a silent no-op.
  expect_error(c, policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, in, {{0, 5}}, {}, 0.5,
               status::invalid_argument, "does not use segments");
  expect_error(c, policy<scorers::knorm, selectors::per_head, allocators::fair>{}, in, {}, {1}, 0.5,
               status::invalid_argument, "ignores whitelists");
}

TEST_CASE("invalid views, shapes and inputs") {
  cache c;
  kv_view<float> null_view = c.kv();
  null_view.data = nullptr;
  expect_error(c, knorm_fair{}, keys_only(null_view), {}, {}, 0.5, status::null_pointer, "inputs.keys.data");
  kv_view<float> empty = c.kv();
  empty.tokens = 0;
  expect_error(c, knorm_fair{}, keys_only(empty), {}, {}, 0.5, status::empty_cache, "no tokens");
  kv_view<float> alias = c.kv();
  alias.stride_token = 2;  // rows of 4 elements every 2: overlap
  expect_error(c, knorm_fair{}, keys_only(alias), {}, {}, 0.5, status::invalid_shape, "overlapping strides");
  // Attention scorers need queries or attention; GQA groups must divide; head_dim must match.
  using snap = policy<scorers::snapkv<4>, selectors::per_head, allocators::uniform>;
  expect_error(c, snap{}, keys_only(c.kv()), {}, {}, 0.5, status::missing_input, "inputs.queries");
  expect_error(c, snap{}, with_queries(c.kv(), make_contiguous_view(c.q.data(), 1, 3, 4, c.D)), {}, {}, 0.5,
               status::invalid_shape, "not a multiple of the 2 KV heads");
  expect_error(c, snap{}, with_queries(c.kv(), make_contiguous_view(c.q.data(), 1, 2, 4, c.D - 1)), {}, {}, 0.5,
               status::invalid_shape, "head_dim");
  // The softmax scale: NaN would make every score NaN (the plan falls to the tie-break order), a negative one
  // inverts attention; 0 still means 1 / sqrt(head_dim).
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY, -0.125f}) {
    auto in = with_queries(c.kv(), make_contiguous_view(c.q.data(), 1, 2, 4, c.D));
    in.scale = bad;
    expect_error(c, snap{}, in, {}, {}, 0.5, status::invalid_argument, "inputs.scale");
  }
  {
    auto in = with_queries(c.kv(), make_contiguous_view(c.q.data(), 1, 2, 4, c.D));
    keep_plan by_default, explicit_scale;
    REQUIRE(cpu::plan(snap{}, in, std::vector<segment>{}, std::vector<std::int32_t>{}, 0.5, by_default).ok());
    in.scale = 0.5f;  // 1 / sqrt(4)
    REQUIRE(cpu::plan(snap{}, in, std::vector<segment>{}, std::vector<std::int32_t>{}, 0.5, explicit_scale).ok());
    CHECK(by_default.kept(0, 1) == explicit_scale.kept(0, 1));
  }
  // Queries that do not reach back to a segment's window (fair SnapKV scores each segment on its own window).
  using fair_snap = policy<scorers::snapkv<4>, selectors::per_head, allocators::fair>;
  expect_error(c, fair_snap{}, with_queries(c.kv(), make_contiguous_view(c.q.data(), 1, 2, 4, c.D)), {{0, 10}}, {}, 0.5,
               status::missing_input, "position");
  // Segment-local H2O from accumulated column sums would mix segments.
  std::vector<float> sums(static_cast<std::size_t>(2 * c.L), 0.1f);
  layer_inputs<kv_view<const float>> in{c.kv().as_const()};
  in.attention_column_sums = sums.data();
  in.attention_q_heads = 2;
  expect_error(c, policy<scorers::h2o, selectors::per_head, allocators::fair>{}, in, {{0, 10}}, {}, 0.5,
               status::missing_input, "segment-local H2O");
  // Scorer and selector parameters.
  scorers::snapkv<4> bad_window{};
  bad_window.window = 0;
  expect_error(c, snap{bad_window, {}, {}}, with_queries(c.kv(), make_contiguous_view(c.q.data(), 1, 2, 4, c.D)), {}, {},
               0.5, status::invalid_argument, "scorer.window");
  expect_error(c, policy<scorers::knorm, selectors::head_adaptive, allocators::uniform>{{}, {1.5f}, {}}, keys_only(c.kv()),
               {}, {}, 0.5, status::invalid_argument, "alpha_safeguard");
  expect_error(c, policy<scorers::knorm, selectors::per_head, allocators::debias>{{}, {}, {-1.f}}, keys_only(c.kv()), {},
               {}, 0.5, status::invalid_argument, "lambda");
}

TEST_CASE("compaction rejects a plan that does not fit the view, before writing anything") {
  cache c;
  keep_plan plan;
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, keys_only(c.kv()), {}, {}, 0.5, plan).ok());
  const auto k0 = c.k, v0 = c.v;
  // Wrong length.
  kv_view<float> shorter = c.kv();
  shorter.tokens = 19;
  CHECK(cpu::compact(plan.view(), shorter, c.vv()).code() == status::invalid_plan);
  // Corrupted plan: indices not ascending (head 1), so an in-place move could overwrite an unread source.
  keep_plan_view bad = plan.view();
  std::swap(bad.row(0, 1)[0], bad.row(0, 1)[1]);
  const result r = cpu::compact(bad, c.kv(), c.vv());
  CHECK(r.code() == status::invalid_plan);
  CHECK(std::string(r.message()).find("ascending") != std::string::npos);
  // V with other heads than the plan.
  kv_view<float> v1 = c.vv();
  v1.heads = 1;
  CHECK(cpu::compact(plan.view(), c.kv(), v1).code() == status::invalid_plan);
  CHECK(std::memcmp(c.k.data(), k0.data(), k0.size() * 4) == 0);
  CHECK(std::memcmp(c.v.data(), v0.data(), v0.size() * 4) == 0);
}

TEST_CASE("workspace: size query, then too small a buffer is refused") {
  cache c;
  using P = policy<scorers::knorm, selectors::per_head, allocators::fair>;
  std::size_t bytes = 0;
  REQUIRE(cpu::plan(nullptr, bytes, P{}, keys_only(c.kv()), {}, {}, 0.5, keep_plan_view{}).ok());
  CHECK(bytes > 0);
  std::vector<std::byte> ws(bytes - 1);
  keep_plan plan;
  plan.resize(1, c.H, c.L);
  std::size_t smaller = bytes - 1;
  CHECK(cpu::plan(ws.data(), smaller, P{}, keys_only(c.kv()), {}, {}, 0.5, plan.view()).code() ==
        status::insufficient_workspace);
  ws.resize(bytes);
  CHECK(cpu::plan(ws.data(), bytes, P{}, keys_only(c.kv()), {}, {}, 0.5, plan.view()).ok());
  CHECK(plan.count(0, 0) == 10);
}

namespace {
// The pairwise definition, as a reference: the first (in i order) segment overlapping an earlier one.
bool any_overlap(const std::vector<segment>& s) {
  for (std::size_t i = 0; i < s.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (s[i].begin < s[j].end && s[j].begin < s[i].end) return true;
  return false;
}
}  // namespace

TEST_CASE("segments: overlap found in sorted and shuffled order, as the pairwise definition; the pair named") {
  std::mt19937 rng(29);
  int overlapping = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 12);
    std::vector<segment> s;
    for (int i = 0; i < n; ++i) {
      const auto b = static_cast<std::int32_t>(rng() % 60);
      s.push_back({b, b + 1 + static_cast<std::int32_t>(rng() % (trial % 2 ? 3 : 12))});
    }
    if (trial % 3 == 0) std::sort(s.begin(), s.end(), [](segment a, segment b) { return a.begin < b.begin; });
    const result r = validate_segments(s, 80);
    const bool want = any_overlap(s);
    overlapping += want;
    REQUIRE((r.code() == status::overlapping_segments) == want);
    if (want) {  // the two named segments do overlap
      std::size_t j = 0, i = 0;
      REQUIRE(std::sscanf(r.message(), "segments[%zu] = [%*d, %*d) overlaps segments[%zu]", &j, &i) == 2);
      CHECK(j < i);
      CHECK((s[i].begin < s[j].end && s[j].begin < s[i].end));
    }
  }
  CHECK(overlapping > 500);
  CHECK(overlapping < 2500);
  // Engine scale: 100k disjoint segments, shuffled, then one overlap at the far ends (the pairwise check took
  // seconds here).
  std::vector<segment> big;
  for (std::int32_t i = 0; i < 100000; ++i) big.push_back({2 * i, 2 * i + 2});
  std::shuffle(big.begin(), big.end(), rng);
  CHECK(validate_segments(big, 200000).ok());
  auto it = std::find_if(big.begin(), big.end(), [](segment x) { return x.begin == 199998; });
  it->begin = 1;  // now overlaps [0, 2)
  const result r = validate_segments(big, 200000);
  CHECK(r.code() == status::overlapping_segments);
  // Out of range is still reported, before any overlap.
  big[5] = {199999, 200001};
  CHECK(validate_segments(big, 200000).code() == status::out_of_range);
}

TEST_CASE("paged view: a page listed twice is found at engine scale, positions of the first repeat named") {
  const std::int64_t pages = 1 << 20, batch = 4;
  std::vector<float> pool(static_cast<std::size_t>(pages));  // page_size 1, 1 head, head_dim 1
  std::vector<std::int32_t> indices(static_cast<std::size_t>(pages));
  std::iota(indices.begin(), indices.end(), 0);
  std::mt19937 rng(31);
  std::shuffle(indices.begin(), indices.end(), rng);
  std::vector<std::int32_t> indptr = {0, 1 << 18, 1 << 19, 3 << 18, 1 << 20}, last(batch, 1);
  std::vector<float> vpool(pool.size());
  auto view = make_paged_view(page_layout::nhd, pool.data(), vpool.data(), pages, 1, 1, 1, batch, indptr.data(),
                              indices.data(), last.data());
  CHECK(validate(view, "view").ok());
  indices[900000] = indices[17];  // sequence 3 shares a page of sequence 0
  indices[950000] = indices[18];
  const result r = validate(view, "view");
  CHECK(r.code() == status::invalid_shape);
  CHECK(std::string(r.message()) ==
        "view.indices lists page " + std::to_string(indices[17]) + " twice (positions 17 and 900000)");
  // A view claiming a pool far larger than its table (2^36 pages here) is checked through the table, not one bit
  // per claimed page (8 GiB): the same answers. Nothing reads the pool itself.
  std::vector<std::int32_t> few = {5, 1 << 30, 77, 3, 1 << 30, 5}, few_ptr = {0, 3, 6}, few_last = {1, 1};
  auto sparse = make_paged_view(page_layout::nhd, pool.data(), pool.data() + 1, std::int64_t{1} << 36, 1, 1, 1, 2,
                                few_ptr.data(), few.data(), few_last.data());
  sparse.stride_page = 2;  // K and V interleaved page by page (FlashInfer's [pages][2][...]): disjoint pools
  const result s = validate(sparse, "sparse");
  CHECK(std::string(s.message()) == "sparse.indices lists page 1073741824 twice (positions 1 and 4)");
  few[4] = 9;
  CHECK(std::string(validate(sparse, "sparse").message()) == "sparse.indices lists page 5 twice (positions 0 and 5)");
  few[5] = 11;
  CHECK(validate(sparse, "sparse").ok());
}
