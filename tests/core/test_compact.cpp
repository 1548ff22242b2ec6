// Compaction: kept rows preserved bit-exactly in order, nothing written outside the view, for contiguous,
// strided (llama.cpp rows, transposed V) and paged (NHD / HND) views, float / half / bfloat16.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

template <class T>
std::vector<T> random_elements(std::size_t n, std::uint32_t seed) {
  std::vector<T> v(n);
  const auto f = fairkv_test::random_floats(n, seed);
  for (std::size_t i = 0; i < n; ++i) v[i] = from_float<T>(f[i]);
  return v;
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// A plan with random per-head kept sets (ragged), built directly to exercise compaction alone.
keep_plan random_plan(std::mt19937& rng, std::int64_t batch, std::int64_t heads, std::int64_t tokens) {
  std::vector<segment> none;
  std::vector<float> k(static_cast<std::size_t>(batch * heads * tokens));
  for (auto& x : k) x = static_cast<float>(rng() % 1000);
  keep_plan plan;
  const double ratio = std::uniform_real_distribution<double>(0.0, 0.9)(rng);
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::head_adaptive, allocators::uniform>{{}, {0.1f}, {}},
                    keys_only(make_contiguous_view(k.data(), batch, heads, tokens, 1)), none, {}, ratio, plan).ok());
  return plan;
}

template <class T>
void check_strided(std::mt19937& rng) {
  const std::int64_t B = 2, H = 3, L = 37, D = 8, cap = 45;
  // Keys: [B][H][cap][D] with slack tokens; values: transposed per head, [B][H][D][cap] (stride_dim = cap).
  auto kbuf = random_elements<T>(static_cast<std::size_t>(B * H * cap * D), rng());
  auto vbuf = random_elements<T>(static_cast<std::size_t>(B * H * D * cap), rng());
  const auto k0 = kbuf, v0 = vbuf;
  kv_view<T> kv{kbuf.data(), B, H, L, D, H * cap * D, cap * D, D, 1};
  kv_view<T> vv{vbuf.data(), B, H, L, D, H * D * cap, D * cap, 1, cap};
  const keep_plan plan = random_plan(rng, B, H, L);
  REQUIRE(cpu::compact(plan.view(), kv, vv).ok());
  std::vector<bool> k_written(kbuf.size(), false), v_written(vbuf.size(), false);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const auto kept = plan.kept(b, h);
      for (std::size_t j = 0; j < kept.size(); ++j)
        for (std::int64_t d = 0; d < D; ++d) {
          const auto kd = static_cast<std::size_t>(b * H * cap * D + h * cap * D + static_cast<std::int64_t>(j) * D + d);
          const auto ks = static_cast<std::size_t>(b * H * cap * D + h * cap * D + kept[j] * D + d);
          REQUIRE(same_bits(&kbuf[kd], &k0[ks], 1));
          k_written[kd] = true;
          const auto vd = static_cast<std::size_t>(b * H * D * cap + h * D * cap + d * cap + static_cast<std::int64_t>(j));
          const auto vs = static_cast<std::size_t>(b * H * D * cap + h * D * cap + d * cap + kept[j]);
          REQUIRE(same_bits(&vbuf[vd], &v0[vs], 1));
          v_written[vd] = true;
        }
    }
  // Everything that is not a destination slot is untouched: slack tokens, evicted tail, other heads' memory.
  for (std::size_t i = 0; i < kbuf.size(); ++i)
    if (!k_written[i]) REQUIRE(same_bits(&kbuf[i], &k0[i], 1));
  for (std::size_t i = 0; i < vbuf.size(); ++i)
    if (!v_written[i]) REQUIRE(same_bits(&vbuf[i], &v0[i], 1));
}

// v_own: V's pool has its own strides, the other layout with each head's row padded by 3 elements.
template <class T>
void check_paged(std::mt19937& rng, page_layout layout, bool v_own = false) {
  const std::int64_t H = 2, D = 4, P = 5, pages = 16, VD = v_own ? D + 3 : D;
  // Two sequences of 13 and 9 tokens over shuffled pages; two pages belong to no sequence.
  std::vector<std::int32_t> ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const std::vector<std::int32_t> indptr{0, 3, 5};
  const std::vector<std::int32_t> indices(ids.begin(), ids.begin() + 5);
  const std::vector<std::int32_t> last{3, 4};
  auto kpool = random_elements<T>(static_cast<std::size_t>(pages * P * H * D), rng());
  auto vpool = random_elements<T>(static_cast<std::size_t>(pages * P * H * VD), rng());
  const auto k0 = kpool, v0 = vpool;
  // V's own strides: page, slot, head, dim.
  const std::int64_t v_nhd[4] = {P * H * VD, H * VD, VD, 1}, v_hnd[4] = {P * H * VD, VD, P * VD, 1};
  const auto with_v = [&](paged_kv_view<T> v) {
    if (v_own) std::copy_n(layout == page_layout::nhd ? v_hnd : v_nhd, 4, v.v_strides);
    return v;
  };
  const auto view = with_v(make_paged_view(layout, kpool.data(), vpool.data(), pages, P, H, D, 2, indptr.data(),
                                           indices.data(), last.data()));
  REQUIRE(validate(view, "view").ok());
  REQUIRE(view.tokens_of(0) == 13);
  REQUIRE(view.tokens_of(1) == 9);
  // Plan from the paged keys directly (scoring reads through the page table).
  keep_plan plan;
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::uniform>{},
                    layer_inputs<paged_side<const T>>{paged_side<const T>{view.keys().data, view.num_pages, 2, H, D, P,
                                                                          view.stride_page, view.stride_slot,
                                                                          view.stride_head, 1, indptr.data(),
                                                                          indices.data(), last.data()}},
                    {}, {}, 0.5, plan).ok());
  REQUIRE(plan.count(0, 0) == 6);
  REQUIRE(plan.count(1, 0) == 4);
  // Reference: the kept rows, read through the page table of the original pools.
  const auto ref_side = with_v(make_paged_view(layout, const_cast<T*>(k0.data()), const_cast<T*>(v0.data()), pages,
                                               P, H, D, 2, indptr.data(), indices.data(), last.data()));
  REQUIRE(cpu::compact(plan.view(), view).ok());
  std::vector<bool> written(kpool.size(), false), v_written(vpool.size(), false);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const auto kept = plan.kept(b, h);
      for (std::size_t j = 0; j < kept.size(); ++j) {
        REQUIRE(same_bits(view.keys().row(b, h, static_cast<std::int64_t>(j)), ref_side.keys().row(b, h, kept[j]), D));
        REQUIRE(same_bits(view.values().row(b, h, static_cast<std::int64_t>(j)), ref_side.values().row(b, h, kept[j]), D));
        const auto off = static_cast<std::size_t>(view.keys().row(b, h, static_cast<std::int64_t>(j)) - kpool.data());
        const auto v_off =
            static_cast<std::size_t>(view.values().row(b, h, static_cast<std::int64_t>(j)) - vpool.data());
        for (std::int64_t d = 0; d < D; ++d) {
          written[off + static_cast<std::size_t>(d)] = true;
          v_written[v_off + static_cast<std::size_t>(d)] = true;
        }
      }
    }
  for (std::size_t i = 0; i < kpool.size(); ++i)
    if (!written[i]) REQUIRE(same_bits(&kpool[i], &k0[i], 1));
  for (std::size_t i = 0; i < vpool.size(); ++i)  // V's padding included
    if (!v_written[i]) REQUIRE(same_bits(&vpool[i], &v0[i], 1));
  cpu::page_usage usage;
  REQUIRE(cpu::compacted_pages(plan.view(), 0, P, usage).ok());
  CHECK(usage.pages == 2);
  CHECK(usage.last_page_len == 1);
}

}  // namespace

TEST_CASE("strided compaction preserves kept rows bit-exactly and writes nothing else") {
  std::mt19937 rng(5);
  for (int i = 0; i < 10; ++i) {
    check_strided<float>(rng);
    check_strided<half_t>(rng);
    check_strided<bfloat16_t>(rng);
  }
}

TEST_CASE("paged compaction (NHD and HND) moves tokens within each sequence's own pages only") {
  std::mt19937 rng(11);
  for (int i = 0; i < 10; ++i) {
    check_paged<float>(rng, page_layout::nhd);
    check_paged<float>(rng, page_layout::hnd);
    check_paged<bfloat16_t>(rng, page_layout::nhd);
    check_paged<half_t>(rng, page_layout::hnd);
  }
}

TEST_CASE("paged compaction with V's own strides (the other layout, padded rows) moves V by them") {
  std::mt19937 rng(12);
  for (int i = 0; i < 10; ++i) {
    check_paged<float>(rng, page_layout::nhd, true);
    check_paged<half_t>(rng, page_layout::hnd, true);
  }
}

TEST_CASE("paged view: V's own strides are all four positive or all zero, and V's pool is checked by them") {
  const std::int64_t H = 2, D = 4, P = 4, pages = 3;
  std::vector<float> k(static_cast<std::size_t>(pages * P * H * D)), v(k.size() + 8);
  const std::vector<std::int32_t> indptr{0, 2}, indices{0, 2}, last{3};
  auto view = make_paged_view(page_layout::nhd, k.data(), v.data(), pages, P, H, D, 1, indptr.data(), indices.data(),
                              last.data());
  REQUIRE(validate(view, "view").ok());
  CHECK_FALSE(view.v_has_own_strides());
  CHECK(view.values().stride_slot == view.keys().stride_slot);

  view.v_strides[1] = H * D;  // only one of four
  result r = validate(view, "view");
  REQUIRE_FALSE(r.ok());
  CHECK(r.code() == status::invalid_shape);
  CHECK(std::string(r.message()).find("v_strides") != std::string::npos);

  const std::int64_t hnd[4] = {P * H * D, D, P * D, 1};
  std::copy_n(hnd, 4, view.v_strides);
  REQUIRE(validate(view, "view").ok());
  CHECK(view.values().stride_head == P * D);
  CHECK(view.keys().stride_head == D);  // K keeps its own

  // V's rows aliasing under its own strides (two heads on one row) is refused, naming V.
  view.v_strides[2] = 1;
  r = validate(view, "view");
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.message()).find("V's own strides") != std::string::npos);
}

TEST_CASE("compacted_pages: pages per sequence, refusals for what an engine would free wrongly") {
  keep_plan plan;
  plan.resize(2, 2, 10);
  auto v = plan.view();
  v.lengths[0] = 10;
  v.lengths[1] = 7;
  v.counts[0] = 5, v.counts[1] = 9;  // sequence 0: ragged heads, the longest (9) decides
  v.counts[2] = 0, v.counts[3] = 0;  // sequence 1: nothing kept
  cpu::page_usage u{-1, -1};
  REQUIRE(cpu::compacted_pages(plan.view(), 0, 4, u).ok());
  CHECK(u.pages == 3);
  CHECK(u.last_page_len == 1);
  REQUIRE(cpu::compacted_pages(plan.view(), 0, 9, u).ok());
  CHECK(u.pages == 1);
  CHECK(u.last_page_len == 9);
  REQUIRE(cpu::compacted_pages(plan.view(), 1, 4, u).ok());
  CHECK(u.pages == 0);
  CHECK(u.last_page_len == 0);
  REQUIRE(cpu::compacted_pages(plan.view(), 0, std::numeric_limits<std::int64_t>::max(), u).ok());
  CHECK(u.pages == 1);
  // Refused, and the caller's usage left as it was.
  const cpu::page_usage sentinel{-7, -7};
  auto refused = [&](std::int64_t b, std::int64_t page_size) {
    cpu::page_usage w = sentinel;
    const result r = cpu::compacted_pages(plan.view(), b, page_size, w);
    CHECK(w.pages == sentinel.pages);
    CHECK(w.last_page_len == sentinel.last_page_len);
    return r;
  };
  CHECK(std::string(refused(0, 0).message()) == "page_size = 0 must be positive");
  CHECK(refused(0, -16).code() == status::invalid_argument);
  CHECK(std::string(refused(2, 16).message()) == "sequence 2 is outside the plan's batch of 2");
  CHECK(refused(-1, 16).code() == status::out_of_range);
  v.counts[1] = 11;  // more than the sequence's 10 tokens: a corrupt plan
  CHECK(refused(0, 16).code() == status::invalid_plan);
  CHECK(cpu::compacted_pages(plan.view(), 1, 16, u).ok());  // sequence 1 does not read sequence 0's rows
}

TEST_CASE("plan + compact end to end: the compacted cache is the kept tokens in their original order") {
  const std::int64_t H = 2, L = 50, D = 16;
  auto k = fairkv_test::random_floats(H * L * D, 3), v = fairkv_test::random_floats(H * L * D, 4);
  const auto k0 = k, v0 = v;
  auto kv = make_contiguous_view(k.data(), 1, H, L, D);
  auto vv = make_contiguous_view(v.data(), 1, H, L, D);
  keep_plan plan;
  const std::vector<segment> segs{{0, 10}, {10, 30}};
  const std::vector<std::int32_t> wl{0, 49};
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::fair_with_whitelist>{}, keys_only(kv), segs, wl,
                    0.6, plan).ok());
  REQUIRE(cpu::compact(plan.view(), kv, vv).ok());
  for (std::int64_t h = 0; h < H; ++h) {
    const auto kept = plan.kept(0, h);
    REQUIRE(kept.size() == 20);
    for (std::size_t j = 0; j < kept.size(); ++j) {
      CHECK(std::memcmp(&k[(h * L + static_cast<std::int64_t>(j)) * D], &k0[(h * L + kept[j]) * D], D * 4) == 0);
      CHECK(std::memcmp(&v[(h * L + static_cast<std::int64_t>(j)) * D], &v0[(h * L + kept[j]) * D], D * 4) == 0);
    }
  }
}

TEST_CASE("a plan is applied once: a second compaction is refused before it writes, contiguous and paged") {
  const std::int64_t H = 2, L = 30, D = 4;
  auto k = fairkv_test::random_floats(H * L * D, 5), v = fairkv_test::random_floats(H * L * D, 6);
  const auto k_orig = k, v_orig = v;
  const auto kv = make_contiguous_view(k.data(), 1, H, L, D), vv = make_contiguous_view(v.data(), 1, H, L, D);
  keep_plan plan;
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, keys_only(kv), {}, {}, 0.5, plan)
              .ok());
  const keep_plan spare = plan;  // copied before compaction: a fresh plan of the same selection
  CHECK_FALSE(plan.applied());
  REQUIRE(cpu::compact(plan.view(), kv, vv).ok());
  CHECK(plan.applied());
  const auto k1 = k, v1 = v;
  // Again on the compacted cache: slot j would receive slot indices[j] of the already-compacted row.
  const result again = cpu::compact(plan.view(), kv, vv);
  CHECK(again.code() == status::invalid_plan);
  CHECK(std::string(again.message()).find("already applied") != std::string::npos);
  CHECK(k == k1);
  CHECK(v == v1);
  // The copy made before compaction applies the same selection to another copy of the cache, once.
  auto k2 = k_orig, v2 = v_orig;
  REQUIRE(cpu::compact(spare.view(), make_contiguous_view(k2.data(), 1, H, L, D), make_contiguous_view(v2.data(), 1, H, L, D))
              .ok());
  CHECK(k2 == k1);
  CHECK(v2 == v1);
  // Planning into the plan again makes it fresh: through the convenience overload (which resizes it), and through
  // the workspace overload into its view, as an engine reusing one plan buffer per layer does.
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, keys_only(kv), {}, {}, 0.5, plan)
              .ok());
  CHECK_FALSE(plan.applied());
  REQUIRE(cpu::compact(plan.view(), kv, vv).ok());
  REQUIRE(plan.applied());
  std::size_t bytes = 0;
  const policy<scorers::knorm, selectors::per_head, allocators::uniform> pol{};
  REQUIRE(cpu::plan(nullptr, bytes, pol, keys_only(kv), {}, {}, keep_target::of_tokens(L / 4), plan.view()).ok());
  std::vector<std::byte> ws(bytes);
  REQUIRE(cpu::plan(ws.data(), bytes, pol, keys_only(kv), {}, {}, keep_target::of_tokens(L / 4), plan.view()).ok());
  CHECK_FALSE(plan.applied());
  CHECK(cpu::compact(plan.view(), kv, vv).ok());
  // A view an engine builds over its own plan memory carries no state and is not tracked (documented).
  const_keep_plan_view untracked = plan.view();
  untracked.state = nullptr;
  CHECK(untracked.state == nullptr);

  // Paged: the same rule.
  const std::int64_t P = 8, pages = 4;
  auto kpool = fairkv_test::random_floats(pages * P * H * D, 7), vpool = fairkv_test::random_floats(pages * P * H * D, 8);
  const std::vector<std::int32_t> indptr{0, 4}, indices{2, 0, 3, 1}, last{P};
  const auto view = make_paged_view(page_layout::nhd, kpool.data(), vpool.data(), pages, P, H, D, 1, indptr.data(),
                                    indices.data(), last.data());
  keep_plan paged;
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::uniform>{},
                    layer_inputs<paged_side<const float>>{paged_side<const float>{
                        view.k_data, pages, 1, H, D, P, view.stride_page, view.stride_slot, view.stride_head, 1,
                        indptr.data(), indices.data(), last.data()}},
                    {}, {}, 0.5, paged)
              .ok());
  REQUIRE(cpu::compact(paged.view(), view).ok());
  const auto kp = kpool;
  CHECK(cpu::compact(paged.view(), view).code() == status::invalid_plan);
  CHECK(kpool == kp);
}

namespace {

// Two sequences sharing their first two pages (a prefix cache), in one pool of 12 pages of 4 slots; the
// compressed copy goes to pages of its own.
struct shared_prefix {
  static constexpr std::int64_t H = 2, D = 3, P = 4, pages = 12;
  std::vector<float> kpool = fairkv_test::random_floats(static_cast<std::size_t>(pages * P * H * D), 41);
  std::vector<float> vpool = fairkv_test::random_floats(static_cast<std::size_t>(pages * P * H * D), 42);
  std::vector<std::int32_t> indptr{0, 3, 6}, indices{5, 1, 7, 5, 1, 2}, last{2, 4};  // 10 and 12 tokens
  [[nodiscard]] paged_kv_view<float> view(const std::vector<std::int32_t>& ip, const std::vector<std::int32_t>& ix,
                                          const std::vector<std::int32_t>& lp) {
    return make_paged_view(page_layout::nhd, kpool.data(), vpool.data(), pages, P, H, D, 2, ip.data(), ix.data(),
                           lp.data());
  }
};

keep_plan plan_of(const paged_kv_view<float>& v, double ratio) {
  keep_plan plan;
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::head_adaptive, allocators::uniform>{{}, {0.1f}, {}},
                    layer_inputs<paged_side<const float>>{v.as_const().keys()}, {}, {}, ratio, plan)
              .ok());
  return plan;
}

}  // namespace

TEST_CASE("compact_into: shared prefix pages are read, never written; the copy holds the kept tokens in order") {
  shared_prefix c;
  const auto from = c.view(c.indptr, c.indices, c.last);
  REQUIRE_FALSE(validate(from, "from").ok());  // pages 5 and 1 are listed twice: in-place compaction refuses it
  const keep_plan plan = plan_of(from, 0.5);
  const auto k0 = c.kpool, v0 = c.vpool;
  // Room for each sequence's longest head: pages of its own (ragged heads: 6 and 6 tokens at most here).
  const std::vector<std::int32_t> to_indptr{0, 2, 4}, to_indices{9, 0, 11, 3}, to_last{4, 4};
  const auto to = c.view(to_indptr, to_indices, to_last);
  REQUIRE(cpu::compact_into(plan.view(), from.as_const(), to).ok());
  std::vector<bool> written(c.kpool.size(), false);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < shared_prefix::H; ++h) {
      const auto kept = plan.kept(b, h);
      for (std::size_t j = 0; j < kept.size(); ++j) {
        const auto jj = static_cast<std::int64_t>(j);
        const auto off = static_cast<std::size_t>(to.keys().row(b, h, jj) - c.kpool.data());
        for (std::int64_t d = 0; d < shared_prefix::D; ++d) {
          const auto src = static_cast<std::size_t>(from.keys().row(b, h, kept[j]) - c.kpool.data()) +
                           static_cast<std::size_t>(d);
          const auto vsrc = static_cast<std::size_t>(from.values().row(b, h, kept[j]) - c.vpool.data()) +
                            static_cast<std::size_t>(d);
          REQUIRE(c.kpool[off + static_cast<std::size_t>(d)] == k0[src]);
          REQUIRE(c.vpool[off + static_cast<std::size_t>(d)] == v0[vsrc]);
          written[off + static_cast<std::size_t>(d)] = true;
        }
      }
    }
  for (std::size_t i = 0; i < c.kpool.size(); ++i)
    if (!written[i]) {
      REQUIRE(c.kpool[i] == k0[i]);  // from's pages (the shared prefix included) and the rest of the pool
      REQUIRE(c.vpool[i] == v0[i]);
    }
  // The plan is unspent: applying it again gives the same copy.
  REQUIRE(cpu::compact_into(plan.view(), from.as_const(), to).ok());
}

TEST_CASE("compact_into refuses, writing nothing: a page of from, a page twice, too little room, a spent plan") {
  shared_prefix c;
  const auto from = c.view(c.indptr, c.indices, c.last);
  keep_plan plan = plan_of(from, 0.5);
  const auto k0 = c.kpool, v0 = c.vpool;
  const auto refused = [&](const paged_kv_view<float>& to, const char* needle) {
    const result r = cpu::compact_into(plan.view(), from.as_const(), to);
    INFO(std::string(r.message()));
    CHECK_FALSE(r.ok());
    CHECK(std::string(r.message()).find(needle) != std::string::npos);
    CHECK(c.kpool == k0);
    CHECK(c.vpool == v0);
  };
  const std::vector<std::int32_t> ip{0, 2, 4}, lp{4, 4};
  const std::vector<std::int32_t> into_prefix{9, 1, 11, 3}, twice{9, 0, 9, 3}, ok{9, 0, 11, 3};
  refused(c.view(ip, into_prefix, lp), "page 1 is also in from's table");
  refused(c.view(ip, twice, lp), "lists page 9 twice");
  const std::vector<std::int32_t> short_ip{0, 1, 2}, short_ix{9, 11}, short_lp{1, 1};
  refused(c.view(short_ip, short_ix, short_lp), "has room for 1 tokens");
  // Another pool overlapping this one (shifted by one element) cannot be told apart by page ids.
  const std::vector<std::int32_t> in_range{9, 0, 10, 3};
  auto shifted = c.view(ip, in_range, lp);
  shifted.k_data += 1;
  shifted.num_pages -= 1;
  refused(shifted, "overlap");
  // A plan applied in place no longer describes `from`.
  plan.view().state->applied = true;
  refused(c.view(ip, ok, lp), "already applied");
}
