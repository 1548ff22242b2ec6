// The llama.cpp adapter (include/fairkv/llamacpp) without llama.cpp: sequence states written here by hand in
// llama.cpp's layout (state_format.hpp's comment), compressed with a K-norm planner, and read back by plain
// offsets. The same adapter on states llama.cpp wrote itself is tests/llamacpp's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fairkv/allocators/uniform.hpp"
#include "fairkv/llamacpp/attention_statistics.hpp"
#include "fairkv/llamacpp/compress_state.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/remap.hpp"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/selectors/per_head.hpp"

namespace {

namespace lc = fairkv::llamacpp;

// A single-stream state of `n` cells at positions first..first+n-1, f16 K and V rows [cells][kvh * hd] (or V^T).
// Key (l, h, t) has every value equal to key_value(l, h, t) (distinct over t), so its norm orders the tokens; V
// holds distinct codes. Every value is exact in f16.
struct synthetic {
  int n = 9, layers = 2, kvh = 2, hd = 4, first = 5;
  bool v_trans = false;

  static float key_value(int l, int h, int t) { return float(((t * 7 + h * 3 + l * 5) % 11) + 1) * 0.125f; }
  static float value_code(int l, int h, int t, int d) { return float(l * 1000 + h * 100 + t * 4 + d); }
  std::size_t row() const { return std::size_t(kvh * hd) * 2; }

  lc::state_shape shape() const {
    lc::state_shape s;
    s.expect.n_layer = std::uint32_t(layers);
    s.expect.n_embd_k = s.expect.n_embd_v = std::uint32_t(kvh * hd);
    s.n_head_kv = kvh;
    s.head_dim = hd;
    return s;
  }

  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> b;
    auto put = [&](auto v) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
      b.insert(b.end(), p, p + sizeof v);
    };
    auto put_f16 = [&](float f) { put(fairkv::from_float<fairkv::half_t>(f)); };
    put(lc::state_magic);
    put(std::int32_t(0));   // seq id
    put(std::uint32_t(1));  // streams
    put(std::uint32_t(n));
    for (int t = 0; t < n; ++t) put(std::int32_t(first + t)), put(std::uint32_t(1)), put(std::int32_t(0));
    put(std::uint32_t(v_trans)), put(std::uint32_t(layers));
    for (int l = 0; l < layers; ++l) {
      put(lc::ggml_type_f16), put(std::uint64_t(row()));
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < kvh; ++h)
          for (int d = 0; d < hd; ++d) put_f16(key_value(l, h, t));
    }
    for (int l = 0; l < layers; ++l) {
      put(lc::ggml_type_f16);
      if (!v_trans) {
        put(std::uint64_t(row()));
        for (int t = 0; t < n; ++t)
          for (int h = 0; h < kvh; ++h)
            for (int d = 0; d < hd; ++d) put_f16(value_code(l, h, t, d));
      } else {
        put(std::uint32_t(2)), put(std::uint32_t(kvh * hd));
        for (int h = 0; h < kvh; ++h)
          for (int d = 0; d < hd; ++d)
            for (int t = 0; t < n; ++t) put_f16(value_code(l, h, t, d));
      }
    }
    return b;
  }
};

float f16_at(const std::vector<std::uint8_t>& b, std::size_t at) {
  fairkv::half_t h;
  std::memcpy(&h, b.data() + at, 2);
  return fairkv::to_float(h);
}

// K-norm, per head, with allocator A: the policies these cases need, so the core suite does not instantiate
// dispatch's 126. Records the inputs it was handed (the adapter widens f16 keys to f32 where queries are bound, and
// slices them per head for compress_state_per_head).
template <class A>
struct knorm_planner_with {
  struct call {
    bool f32 = false;
    const void* keys = nullptr;
    std::int64_t heads = 0;
    const float* queries = nullptr;
    std::int64_t q_heads = 0;
  };
  mutable int f16_calls = 0, f32_calls = 0;
  mutable std::vector<call> calls;
  template <class Keys>
  fairkv::result operator()(const fairkv::policy_spec&, const fairkv::layer_inputs<Keys>& in,
                            std::span<const fairkv::segment> segments, std::span<const std::int32_t> whitelist,
                            fairkv::keep_target target, fairkv::keep_plan& out) const {
    constexpr bool f16 = std::is_same_v<Keys, fairkv::kv_view<const fairkv::half_t>>;
    (f16 ? f16_calls : f32_calls) += 1;
    calls.push_back({!f16, in.keys.data, in.keys.heads, in.queries.data, in.queries.heads});
    const fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, A> pol{};
    return fairkv::cpu::plan(pol, in, segments, whitelist, target, out);
  }
};
using knorm_planner = knorm_planner_with<fairkv::allocators::uniform>;

// Keeps 4 of 9 tokens in the first layer it plans and 7 in every later one.
struct uneven_planner : knorm_planner {
  template <class Keys>
  fairkv::result operator()(const fairkv::policy_spec& spec, const fairkv::layer_inputs<Keys>& in,
                            std::span<const fairkv::segment> segments, std::span<const std::int32_t> whitelist,
                            fairkv::keep_target, fairkv::keep_plan& out) const {
    const fairkv::keep_target target(f16_calls == 0 ? 0.5 : 0.2);
    return knorm_planner::operator()(spec, in, segments, whitelist, target, out);
  }
};

auto no_stats = [](int, std::int64_t, lc::attention_statistics&) { return std::string(); };

lc::request knorm_request(double ratio) {
  lc::request r;
  r.policy.scorer = fairkv::scorer_kind::knorm;
  r.target = ratio;
  return r;
}

}  // namespace

TEST_CASE("llamacpp adapter: K-norm on a hand-written state keeps the largest keys, rows moved, positions at the end") {
  for (bool v_trans : {false, true}) {
    CAPTURE(v_trans);
    synthetic s;
    s.v_trans = v_trans;
    std::vector<std::uint8_t> bytes = s.bytes();
    knorm_planner planner;
    const lc::compression c = lc::compress_state(bytes, s.shape(), knorm_request(0.5), no_stats, planner);
    REQUIRE(c.error == "");
    CHECK(planner.f16_calls == s.layers);
    CHECK(planner.f32_calls == 0);
    const int m = int(fairkv::keep_budget(s.n, 0.5));
    REQUIRE(c.cells_after == std::uint32_t(m));
    CHECK(c.cells_before == std::uint32_t(s.n));
    CHECK(c.state_bytes_before == s.bytes().size());
    CHECK(c.v_trans == v_trans);
    CHECK(std::string(c.statistics) == "none");
    // Expected kept sets: the m smallest keys (K-norm keeps small norms), in ascending token order.
    REQUIRE(c.kept.size() == std::size_t(s.layers));
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.kvh; ++h) {
        std::vector<int> order(std::size_t(s.n));
        for (int t = 0; t < s.n; ++t) order[std::size_t(t)] = t;
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return synthetic::key_value(l, h, a) < synthetic::key_value(l, h, b); });
        std::vector<std::int32_t> want(order.begin(), order.begin() + m);
        std::sort(want.begin(), want.end());
        CHECK(c.kept[std::size_t(l)][std::size_t(h)] == want);
      }
    // The written state by plain offsets: header 16 bytes, 12 per cell, then v_trans and n_layer.
    const std::vector<std::uint8_t>& w = c.state;
    for (int i = 0; i < m; ++i) {
      std::int32_t pos;
      std::memcpy(&pos, w.data() + 16 + 12 * std::size_t(i), 4);
      CHECK(pos == s.first + s.n - m + i);  // the last m positions: the next token follows the original last
    }
    const std::size_t data = 16 + 12 * std::size_t(m) + 8, row = s.row(), k_block = 12 + std::size_t(m) * row;
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.kvh; ++h)
        for (int i = 0; i < m; ++i) {
          const int t = c.kept[std::size_t(l)][std::size_t(h)][std::size_t(i)];
          const std::size_t k_at =
              data + std::size_t(l) * k_block + 12 + std::size_t(i) * row + std::size_t(h * s.hd) * 2;
          CHECK(f16_at(w, k_at) == synthetic::key_value(l, h, t));
          for (int d = 0; d < s.hd; ++d) {
            const std::size_t v_base = data + std::size_t(s.layers) * k_block;
            const std::size_t v_at =
                v_trans ? v_base + std::size_t(l) * (12 + std::size_t(m) * row) + 12 +
                              (std::size_t(h * s.hd + d) * std::size_t(m) + std::size_t(i)) * 2
                        : v_base + std::size_t(l) * k_block + 12 + std::size_t(i) * row + std::size_t(h * s.hd + d) * 2;
            CHECK(f16_at(w, v_at) == synthetic::value_code(l, h, t, d));
          }
        }
    CHECK(w.size() == data + 2 * std::size_t(s.layers) * k_block);
    lc::seq_state back;
    CHECK(lc::parse_seq_state(w, s.shape().expect, back) == "");
    CHECK(back.cell_count == std::uint32_t(m));
  }
}

TEST_CASE("llamacpp adapter: the state written over its own bytes is the one written into a new buffer") {
  // Sections move forward by different amounts (fewer cells, V rows or V^T): every kept count, both layouts.
  for (bool v_trans : {false, true})
    for (const int n : {9, 40}) {
      synthetic s;
      s.v_trans = v_trans;
      s.n = n;
      s.layers = 3;
      const std::vector<std::uint8_t> bytes = s.bytes();
      lc::seq_state st;
      REQUIRE(lc::parse_seq_state(bytes, s.shape().expect, st) == "");
      for (std::uint32_t m = 1; m <= std::uint32_t(n); ++m) {
        CAPTURE(v_trans);
        CAPTURE(n);
        CAPTURE(m);
        const std::vector<std::uint8_t> fresh = lc::write_seq_state(bytes, st, m);
        std::vector<std::uint8_t> over = bytes;
        lc::write_seq_state_in_place(over, st, m);
        CHECK(over == fresh);
        lc::seq_state back;
        REQUIRE(lc::parse_seq_state(over, s.shape().expect, back) == "");
        CHECK(back.cell_count == m);
        CHECK(back.pos.back() == st.pos.back());
      }
    }
}

TEST_CASE("llamacpp adapter: every refusal names its cause and leaves the state's bytes untouched") {
  synthetic s;
  const std::vector<std::uint8_t> original = s.bytes();
  knorm_planner planner;
  auto refuse = [&](const lc::state_shape& shape, const lc::request& req, auto&& stats) {
    std::vector<std::uint8_t> bytes = original;
    const lc::compression c = lc::compress_state(bytes, shape, req, stats, planner);
    CHECK(bytes == original);
    CHECK(c.state.empty());
    return c.error;
  };
  lc::state_shape wide = s.shape();
  wide.head_dim = 2;
  CHECK(refuse(wide, knorm_request(0.5), no_stats).find("K rows of 8 values are not 2 KV heads x 2") !=
        std::string::npos);
  lc::state_shape empty_shape = s.shape();
  empty_shape.n_head_kv = 0;
  CHECK(refuse(empty_shape, knorm_request(0.5), no_stats).find("shape: 0 KV heads") != std::string::npos);
  lc::state_shape other_layers = s.shape();
  other_layers.expect.n_layer = 3;
  CHECK(refuse(other_layers, knorm_request(0.5), no_stats).find("llama.cpp sequence state: the state has 2 layers") ==
        0);
  lc::request adaptive = knorm_request(0.5);
  adaptive.policy.selector = fairkv::selection_kind::head_adaptive;
  CHECK(refuse(s.shape(), adaptive, no_stats).find("head_adaptive") != std::string::npos);
  CHECK(refuse(s.shape(), knorm_request(1.5), no_stats).find("fairkv plan (layer 0): ratio = 1.5") == 0);
  const std::vector<std::int32_t> outside{s.n};
  lc::request wl = knorm_request(0.5);
  wl.whitelist = outside;
  CHECK(refuse(s.shape(), wl, no_stats).find("fairkv plan (layer 0)") == 0);
  // A statistics source that fails in the last layer: the first layers were planned, none compacted.
  auto fails_late = [&](int l, std::int64_t cells, lc::attention_statistics&) {
    CHECK(cells == s.n);
    return l == s.layers - 1 ? std::string("no statistics for the last layer") : std::string();
  };
  CHECK(refuse(s.shape(), knorm_request(0.5), fails_late) == "no statistics for the last layer");
  const std::vector<float> short_q(5);
  auto bad_q = [&](int, std::int64_t, lc::attention_statistics& out) {
    out = lc::query_rows{short_q, 2};
    return std::string();
  };
  CHECK(refuse(s.shape(), knorm_request(0.5), bad_q) ==
        "layer 0: queries holds 5 floats, not 72 ([n][n_head * head_dim])");
  // A plan whose layers disagree on the count cannot be held by llama.cpp's shared cells.
  std::vector<std::uint8_t> bytes = original;
  const lc::compression c = lc::compress_state(bytes, s.shape(), knorm_request(0.5), no_stats, uneven_planner{});
  CHECK(c.error.find("layer 1 head 0 keeps 7 tokens, layer 0 head 0 keeps 4") == 0);
  CHECK(bytes == original);
  // A cut state.
  std::vector<std::uint8_t> cut(original.begin(), original.end() - 3);
  const std::vector<std::uint8_t> cut_copy = cut;
  CHECK(lc::compress_state(cut, s.shape(), knorm_request(0.5), no_stats, planner)
            .error.find("llama.cpp sequence state") == 0);
  CHECK(cut == cut_copy);
}

TEST_CASE("llamacpp adapter: each statistic binds its own fields and checks its own shape") {
  const std::int64_t n = 6, hd = 4;
  const std::vector<float> q(std::size_t(n * 3 * hd), 1.f), sums(std::size_t(3 * n), 1.f),
      rows(std::size_t(3 * 2 * n), 1.f);
  using in_t = fairkv::layer_inputs<fairkv::kv_view<const fairkv::half_t>>;
  auto bound = [&](const lc::attention_statistics& s, std::string& err) {
    in_t in{};
    err = lc::bind_statistics(s, n, hd, in);
    return in;
  };
  std::string err;
  in_t in = bound(lc::no_statistics{}, err);
  CHECK(err == "");
  CHECK(in.queries.data == nullptr);
  CHECK(in.attention == nullptr);
  CHECK(in.attention_column_sums == nullptr);
  CHECK(in.attention_local_column_sums == nullptr);

  in = bound(lc::query_rows{q, 3}, err);
  CHECK(err == "");
  CHECK(in.queries.data == q.data());
  CHECK(in.queries.heads == 3);
  CHECK(in.queries.tokens == n);
  CHECK(in.queries.head_dim == hd);
  CHECK(in.queries.stride_token == 3 * hd);  // llama.cpp's Q row holds every head
  CHECK(in.queries.stride_head == hd);
  CHECK(in.q_heads() == 3);

  in = bound(lc::column_sums{sums, 3}, err);
  CHECK(err == "");
  CHECK(in.attention_column_sums == sums.data());
  CHECK(in.attention_local_column_sums == nullptr);
  CHECK(in.attention_q_heads == 3);

  in = bound(lc::local_column_sums{sums, 3}, err);
  CHECK(err == "");
  CHECK(in.attention_local_column_sums == sums.data());
  CHECK(in.attention_column_sums == nullptr);

  in = bound(lc::last_rows{rows, 3, 2}, err);
  CHECK(err == "");
  CHECK(in.attention == rows.data());
  CHECK(in.attention_rows == 2);
  CHECK(in.attention_ld == n);
  CHECK(in.attention_q_heads == 3);

  // Wrong shapes: refused with the layout, nothing bound.
  in = bound(lc::query_rows{q, 2}, err);
  CHECK(err == "queries holds 72 floats, not 48 ([n][n_head * head_dim])");
  CHECK(in.queries.data == nullptr);
  in = bound(lc::column_sums{sums, 0}, err);
  CHECK(err == "column_sums: n_head 0 < 1");
  in = bound(lc::local_column_sums{std::span(sums).first(5), 3}, err);
  CHECK(err == "local_column_sums holds 5 floats, not 18 ([n_head][n])");
  CHECK(in.attention_local_column_sums == nullptr);
  in = bound(lc::last_rows{rows, 3, 0}, err);
  CHECK(err == "last_rows: rows 0 < 1");
  in = bound(lc::last_rows{rows, 3, 3}, err);
  CHECK(err == "last_rows holds 36 floats, not 54 ([n_head][rows][n])");
  CHECK(in.attention == nullptr);
  CHECK(std::string(lc::name_of(lc::last_rows{})) == "last_rows");
}

TEST_CASE("llamacpp adapter: a bound query statistic hands the planner the keys widened to f32") {
  synthetic s;
  std::vector<std::uint8_t> bytes = s.bytes();
  const std::vector<float> q(std::size_t(s.n * 2 * s.hd), 0.5f);
  auto queries = [&](int, std::int64_t, lc::attention_statistics& out) {
    out = lc::query_rows{q, 2};
    return std::string();
  };
  knorm_planner planner;
  std::vector<std::uint8_t> plain = bytes;
  const lc::compression a = lc::compress_state(bytes, s.shape(), knorm_request(0.5), queries, planner);
  REQUIRE(a.error == "");
  CHECK(planner.f32_calls == s.layers);
  CHECK(planner.f16_calls == 0);
  CHECK(std::string(a.statistics) == "queries");
  // K-norm ignores the queries: the widened keys plan exactly as the f16 ones.
  const lc::compression b = lc::compress_state(plain, s.shape(), knorm_request(0.5), no_stats, knorm_planner{});
  CHECK(a.kept == b.kept);
  CHECK(a.state == b.state);
}

TEST_CASE(
    "llamacpp adapter: per-head planning equals whole layers when the heads' lists agree, and keeps each head's own") {
  for (bool v_trans : {false, true}) {
    CAPTURE(v_trans);
    synthetic s;
    s.v_trans = v_trans;
    const std::vector<std::uint8_t> original = s.bytes();
    const std::vector<std::int32_t> shared{2};
    lc::request req = knorm_request(0.5);
    req.policy.allocator = fairkv::allocator_kind::whitelist;
    req.whitelist = shared;
    using wl_planner = knorm_planner_with<fairkv::allocators::whitelist>;
    std::vector<std::uint8_t> a = original, b = original;
    const lc::compression whole = lc::compress_state(a, s.shape(), req, no_stats, wl_planner{});
    wl_planner per;
    const lc::compression heads = lc::compress_state_per_head(
        b, s.shape(), req,
        [&](int, int) {
          return lc::head_request{{}, shared};
        },
        no_stats, per);
    REQUIRE(whole.error == "");
    REQUIRE(heads.error == "");
    CHECK(per.calls.size() == std::size_t(s.layers * s.kvh));
    for (const auto& c : per.calls) CHECK(c.heads == 1);
    CHECK(heads.kept == whole.kept);
    CHECK(heads.state == whole.state);

    // Each head whitelists its own largest key (K-norm would evict it): every head keeps it, and otherwise the
    // m - 1 smallest of the others.
    std::vector<std::vector<std::int32_t>> own(std::size_t(s.layers * s.kvh));
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.kvh; ++h) {
        int largest = 0;
        for (int t = 1; t < s.n; ++t)
          if (synthetic::key_value(l, h, t) > synthetic::key_value(l, h, largest)) largest = t;
        own[std::size_t(l * s.kvh + h)] = {largest};
      }
    std::vector<std::uint8_t> c = original;
    const lc::compression mine = lc::compress_state_per_head(
        c, s.shape(), req,
        [&](int l, int h) {
          return lc::head_request{{}, own[std::size_t(l * s.kvh + h)]};
        },
        no_stats, wl_planner{});
    REQUIRE(mine.error == "");
    const int m = int(fairkv::keep_budget(s.n, 0.5));
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.kvh; ++h) {
        const std::int32_t w = own[std::size_t(l * s.kvh + h)][0];
        std::vector<int> others;
        for (int t = 0; t < s.n; ++t)
          if (t != w) others.push_back(t);
        std::stable_sort(others.begin(), others.end(),
                         [&](int x, int y) { return synthetic::key_value(l, h, x) < synthetic::key_value(l, h, y); });
        std::vector<std::int32_t> want(others.begin(), others.begin() + (m - 1));
        want.push_back(w);
        std::sort(want.begin(), want.end());
        CHECK(mine.kept[std::size_t(l)][std::size_t(h)] == want);
        // head_plan carries the head's lists to the compressed cells: the whitelisted token's new index is its rank
        // among the kept, and segment [0, 5) becomes the kept tokens below 5.
        std::vector<std::int32_t> wl_after;
        std::vector<fairkv::segment> seg_after;
        fairkv::remap_counts counts;
        const std::vector<fairkv::segment> first_five{{0, 5}};
        REQUIRE(fairkv::remap_whitelist(mine.head_plan(l, h), 0, own[std::size_t(l * s.kvh + h)], wl_after, counts, 0));
        REQUIRE(fairkv::remap_segments(mine.head_plan(l, h), 0, first_five, seg_after, counts, 0));
        CHECK(wl_after ==
              std::vector<std::int32_t>{std::int32_t(std::lower_bound(want.begin(), want.end(), w) - want.begin())});
        const auto below_five = std::count_if(want.begin(), want.end(), [](std::int32_t t) { return t < 5; });
        REQUIRE(seg_after.size() == 1);
        CHECK(seg_after[0].begin == 0);
        CHECK(seg_after[0].end == below_five);
        // Row i of head h in the written state is that head's i-th kept key (K rows: every head's slice moved alone).
        const std::size_t data = 16 + 12 * std::size_t(m) + 8, row = s.row(), k_block = 12 + std::size_t(m) * row;
        for (int i = 0; i < m; ++i)
          CHECK(f16_at(mine.state, data + std::size_t(l) * k_block + 12 + std::size_t(i) * row +
                                       std::size_t(h * s.hd) * 2) == synthetic::key_value(l, h, want[std::size_t(i)]));
      }
  }
}

TEST_CASE("llamacpp adapter: per-head planning slices each head's query statistics; its refusals leave the bytes") {
  synthetic s;
  const std::vector<std::uint8_t> original = s.bytes();
  const int n_head = 4, group = n_head / s.kvh;  // GQA: two query heads per KV head
  const std::vector<float> q(std::size_t(s.n * n_head * s.hd), 0.25f);
  auto queries = [&](int, std::int64_t, lc::attention_statistics& out) {
    out = lc::query_rows{q, n_head};
    return std::string();
  };
  auto same = [](int, int) { return lc::head_request{}; };
  std::vector<std::uint8_t> bytes = original;
  knorm_planner planner;
  const lc::compression c = lc::compress_state_per_head(bytes, s.shape(), knorm_request(0.5), same, queries, planner);
  REQUIRE(c.error == "");
  REQUIRE(planner.calls.size() == std::size_t(s.layers * s.kvh));
  for (std::size_t i = 0; i < planner.calls.size(); ++i) {
    const auto& call = planner.calls[i];
    const int h = int(i) % s.kvh;
    CHECK(call.f32);
    CHECK(call.heads == 1);
    CHECK(call.q_heads == group);
    CHECK(call.queries == q.data() + std::size_t(h * group * s.hd));  // llama.cpp's Q row: head-major within a row
    if (h > 0)
      CHECK(static_cast<const float*>(call.keys) - static_cast<const float*>(planner.calls[i - 1].keys) == s.hd);
  }
  std::vector<std::uint8_t> plain = original;
  CHECK(lc::compress_state(plain, s.shape(), knorm_request(0.5), no_stats, knorm_planner{}).kept == c.kept);

  // union_heads: a layer's heads keep the same tokens, so each layer is planned whole with its head 0's lists (a
  // later head's, here out of range, is never read).
  lc::request u = knorm_request(0.5);
  u.policy.selector = fairkv::selection_kind::union_heads;
  u.policy.allocator = fairkv::allocator_kind::whitelist;
  const std::vector<std::int32_t> outside{s.n};
  std::vector<std::vector<std::int32_t>> forced(std::size_t(s.layers));
  for (int l = 0; l < s.layers; ++l) forced[std::size_t(l)] = {l % s.n};
  auto head0 = [&](int l, int h) { return lc::head_request{{}, h == 0 ? forced[std::size_t(l)] : outside}; };
  knorm_planner_with<fairkv::allocators::whitelist> union_planner;
  bytes = original;
  const lc::compression cu = lc::compress_state_per_head(bytes, s.shape(), u, head0, no_stats, union_planner);
  REQUIRE(cu.error == "");
  REQUIRE(union_planner.calls.size() == std::size_t(s.layers));
  for (int l = 0; l < s.layers; ++l) {
    CHECK(union_planner.calls[std::size_t(l)].heads == s.kvh);
    for (int h = 0; h < s.kvh; ++h) {
      const std::vector<std::int32_t>& k = cu.kept[std::size_t(l)][std::size_t(h)];
      CHECK(std::binary_search(k.begin(), k.end(), forced[std::size_t(l)][0]));
    }
  }
  bytes = original;
  auto bad_last = [&](int l, int h) {
    return l == s.layers - 1 && h == s.kvh - 1 ? lc::head_request{{}, outside} : lc::head_request{};
  };
  lc::request wl = knorm_request(0.5);
  wl.policy.allocator = fairkv::allocator_kind::whitelist;
  const std::string e = lc::compress_state_per_head(bytes, s.shape(), wl, bad_last, no_stats,
                                                    knorm_planner_with<fairkv::allocators::whitelist>{})
                            .error;
  CHECK(e.find("fairkv plan (layer 1 head 1): whitelist[0] = 9 is outside the cache of 9 tokens") == 0);
  CHECK(bytes == original);
}
