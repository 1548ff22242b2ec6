// Hostile views (issue 10). Views come from engines, and through them from files and users: extents x strides
// that overflow, strides that alias (inside a view or between pages), pages so large their token count wraps,
// and K and V sharing memory must all be rejected before any write, with the status and a message naming the
// view and the field. Then a bounded fuzz over shapes, strides and page tables: every generated view is either
// rejected (memory untouched) or planned and compacted exactly as a naive reference does, in buffers sized to
// exactly what the view spans, so the sanitizer build (scripts/test.sh) catches any access outside them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

using knorm_uniform = policy<scorers::knorm, selectors::per_head, allocators::uniform>;

bool names(const result& r, const char* needle) { return std::string(r.message()).find(needle) != std::string::npos; }

template <class T>
paged_side<const T> as_const(const paged_side<T>& s) {
  return {s.data,       s.num_pages,   s.batch,       s.heads,      s.head_dim, s.page_size, s.stride_page,
          s.stride_slot, s.stride_head, s.stride_dim, s.indptr, s.indices,  s.last_page_len};
}

// A plan for [batch, heads] rows of `lengths[b]` tokens keeping every other token (so almost every row moves).
keep_plan every_other(std::int64_t heads, const std::vector<std::int64_t>& lengths) {
  const auto batch = static_cast<std::int64_t>(lengths.size());
  const std::int64_t cap = std::max<std::int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  keep_plan p;
  p.resize(batch, heads, cap);
  const keep_plan_view v = p.view();
  for (std::int64_t b = 0; b < batch; ++b) {
    v.lengths[b] = static_cast<std::int32_t>(lengths[static_cast<std::size_t>(b)]);
    for (std::int64_t h = 0; h < heads; ++h) {
      std::int32_t n = 0;
      for (std::int32_t t = 1; t < v.lengths[b]; t += 2) v.row(b, h)[n++] = t;
      v.counts[b * heads + h] = n;
    }
  }
  return p;
}

// A float buffer and a snapshot of it: a rejected call must leave it byte-identical.
struct guarded {
  std::vector<float> data, before;
  explicit guarded(std::size_t n, std::uint32_t seed) : data(fairkv_test::random_floats(n, seed)), before(data) {}
  [[nodiscard]] bool untouched() const { return std::memcmp(data.data(), before.data(), data.size() * 4) == 0; }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
TEST_CASE("misuse: kv_view extents x strides that overflow are rejected, naming the view and the field") {
  const std::int64_t H = 3, L = 5, D = 4;
  guarded k(H * L * D, 1), v(H * L * D, 2);
  const auto good_v = make_contiguous_view(v.data.data(), 1, H, L, D);
  const keep_plan plan = every_other(H, {L});
  struct bad_view {
    const char* field;
    kv_view<float> view;
  };
  const bad_view cases[] = {
      // stride_head * (heads - 1) wraps to a small value: the old check passed it and plan read past the buffer.
      {"stride_head", {k.data.data(), 1, H, L, D, H * L * D, INT64_MAX / 2, D, 1}},
      // No element offset overflows, but the byte offsets do: beyond any address space.
      {"stride_head", {k.data.data(), 1, 2, L, D, H * L * D, INT64_MAX / 2, D, 1}},
      {"stride_batch", {k.data.data(), 3, H, L, D, INT64_MAX / 2, L * D, D, 1}},
      {"stride_token", {k.data.data(), 1, H, L, D, 0, INT64_MAX / 3, INT64_MAX / 4, 1}},
      {"stride_dim", {k.data.data(), 1, 1, 1, D, 0, 0, 0, INT64_MAX / 3}},
  };
  for (const bad_view& c : cases) {
    INFO("field: " << std::string(c.field));
    // The validation alone first: on a broken check the calls below would read and write far outside k.
    const result direct = validate(c.view, "keys");
    INFO("validate: " << std::string(direct.message()));
    REQUIRE(direct.code() == status::invalid_shape);
    CHECK(names(direct, c.field));

    keep_plan out;
    const result planned = cpu::plan(knorm_uniform{}, keys_only(c.view), {}, {}, 0.5, out);
    INFO("plan: " << std::string(planned.message()));
    CHECK(planned.code() == status::invalid_shape);
    CHECK(names(planned, "inputs.keys"));
    CHECK(names(planned, c.field));

    const result as_keys = cpu::compact(plan.view(), c.view, good_v);
    INFO("compact keys: " << std::string(as_keys.message()));
    CHECK(as_keys.code() == status::invalid_shape);
    CHECK(names(as_keys, "keys"));
    CHECK(names(as_keys, c.field));
    auto as_values_view = c.view;
    as_values_view.data = v.data.data();
    const result as_values = cpu::compact(plan.view(), make_contiguous_view(k.data.data(), 1, H, L, D), as_values_view);
    INFO("compact values: " << std::string(as_values.message()));
    CHECK(as_values.code() == status::invalid_shape);
    CHECK(names(as_values, "values"));
    CHECK(names(as_values, c.field));
    CHECK(k.untouched());
    CHECK(v.untouched());
  }
}

TEST_CASE("misuse: view helpers never overflow; validate reports the overflowing stride, not aliasing") {
  float x = 0.f;
  const std::int64_t big = INT64_C(1) << 40;
  const kv_view<float> views[] = {
      make_contiguous_view(&x, 1, big, big, big),
      make_contiguous_view(&x, 2, big, big, 1),
      make_capacity_view(&x, 1, 2, 4, INT64_C(1) << 62, 4),
      make_capacity_view(&x, 2, big, 4, big, big),
  };
  for (const auto& view : views) {
    const result r = validate(view, "keys");
    INFO(std::string(r.message()));
    CHECK(r.code() == status::invalid_shape);
    CHECK(names(r, "overflows"));
    CHECK(names(r, "keys.stride_"));
    CHECK_FALSE(names(r, "overlapping"));
  }
  const std::int32_t indptr[] = {0, 1}, indices[] = {0}, last[] = {1};
  const auto paged = make_paged_view(page_layout::hnd, &x, &x + 1, 2, big, big, big, 1, indptr, indices, last);
  const result r = validate(paged, "view");
  INFO(std::string(r.message()));
  CHECK(r.code() == status::invalid_shape);
  CHECK(names(r, "overflows"));
  CHECK(names(r, "view.stride_"));
  // Ordinary sizes are unchanged by the saturation.
  const auto c = make_contiguous_view(&x, 2, 3, 5, 4);
  CHECK(c.stride_batch == 60);
  CHECK(c.stride_head == 20);
  const auto cap = make_capacity_view(&x, 2, 3, 5, 7, 4);
  CHECK(cap.stride_batch == 84);
  CHECK(cap.stride_head == 28);
  const auto p = make_paged_view(page_layout::nhd, &x, &x, 8, 4, 2, 3, 1, indptr, indices, last);
  CHECK(p.stride_page == 24);
  CHECK(p.stride_slot == 6);
}

TEST_CASE("misuse: paged views whose pages, slots, heads or dims alias are rejected before compaction writes") {
  const std::int64_t pages = 6, P = 4, H = 2, D = 3;
  guarded k(pages * P * H * D, 3), v(pages * P * H * D, 4);
  const std::vector<std::int32_t> indptr{0, 2, 3}, indices{4, 1, 3}, last{3, 2};
  const keep_plan plan = every_other(H, {7, 2});
  struct bad_stride {
    page_layout layout;
    std::int64_t paged_kv_view<float>::*field;
    std::int64_t value;
    const char* named;  // the stride the message blames: the one that steps into the span of smaller ones
  };
  const bad_stride cases[] = {
      {page_layout::nhd, &paged_kv_view<float>::stride_page, 20, "stride_page"},  // pages overlap (24 per page)
      {page_layout::nhd, &paged_kv_view<float>::stride_page, 1, "stride_page"},   // pages interleave with dims
      {page_layout::nhd, &paged_kv_view<float>::stride_slot, 5, "stride_slot"},   // slots overlap (6 per slot)
      {page_layout::nhd, &paged_kv_view<float>::stride_head, 2, "stride_head"},   // heads overlap their dims
      {page_layout::nhd, &paged_kv_view<float>::stride_dim, 2, "stride_head"},    // dims reach the next head
      {page_layout::hnd, &paged_kv_view<float>::stride_page, 23, "stride_page"},
      {page_layout::hnd, &paged_kv_view<float>::stride_head, 11, "stride_head"},  // heads overlap (12 per head)
      {page_layout::hnd, &paged_kv_view<float>::stride_slot, 2, "stride_slot"},
  };
  for (const bad_stride& c : cases) {
    INFO("blamed: " << std::string(c.named));
    CAPTURE(c.value);
    auto view = make_paged_view(c.layout, k.data.data(), v.data.data(), pages, P, H, D, 2, indptr.data(),
                                indices.data(), last.data());
    REQUIRE(validate(view, "view").ok());
    view.*c.field = c.value;
    const result direct = validate(view, "view");
    INFO("validate: " << std::string(direct.message()));
    REQUIRE(direct.code() == status::invalid_shape);
    CHECK(names(direct, "view has overlapping strides"));
    CHECK(names(direct, c.named));
    const result compacted = cpu::compact(plan.view(), view);
    INFO("compact: " << std::string(compacted.message()));
    CHECK(compacted.code() == status::invalid_shape);
    CHECK(names(compacted, c.named));
    keep_plan out;
    const result planned = cpu::plan(knorm_uniform{}, layer_inputs<paged_side<const float>>{as_const(view.keys())},
                                     {}, {}, 0.5, out);
    CHECK(planned.code() == status::invalid_shape);
    CHECK(names(planned, "inputs.keys has overlapping strides"));
    CHECK(k.untouched());
    CHECK(v.untouched());
  }
}

TEST_CASE("misuse: a page_size whose token count overflows is rejected with a message naming page_size") {
  float pool[8] = {};
  const auto before = std::vector<float>(pool, pool + 8);
  const std::int64_t huge = INT64_C(1) << 62;
  // Three pages of 2^62 slots: tokens_of() wrapped to a negative count, and plan answered with a message about
  // null output pointers.
  const std::vector<std::int32_t> indptr{0, 3}, indices{0, 1, 2}, last{1};
  const auto view = make_paged_view(page_layout::nhd, pool, pool + 4, 4, huge, 1, 1, 1, indptr.data(), indices.data(),
                                    last.data());
  keep_plan out;
  const result planned =
      cpu::plan(knorm_uniform{}, layer_inputs<paged_side<const float>>{as_const(view.keys())}, {}, {}, 0.5, out);
  INFO("plan: " << std::string(planned.message()));
  CHECK(planned.code() == status::invalid_shape);
  CHECK(names(planned, "inputs.keys"));
  CHECK(names(planned, "page_size"));
  const keep_plan plan = every_other(1, {3});
  const result compacted = cpu::compact(plan.view(), view);
  INFO("compact: " << std::string(compacted.message()));
  CHECK(compacted.code() == status::invalid_shape);
  CHECK(names(compacted, "page_size"));
  CHECK(std::memcmp(pool, before.data(), sizeof(pool)) == 0);

  // A pool that is addressable (one page of 2^61 half-precision slots is 2^62 bytes) but a page table that
  // lists it five times: the token count alone overflows. Only the page table is read.
  half_t hpool[2] = {};
  const std::vector<std::int32_t> indptr5{0, 5}, indices5{0, 0, 0, 0, 0};
  const paged_side<const half_t> side{hpool, 1, 1, 1, 1, INT64_C(1) << 61, INT64_C(1) << 61, 1, 1, 1,
                                      indptr5.data(), indices5.data(), last.data()};
  const result r = cpu::plan(knorm_uniform{}, layer_inputs<paged_side<const half_t>>{side}, {}, {}, 0.5, out);
  INFO("plan (repeated page): " << std::string(r.message()));
  CHECK(r.code() == status::invalid_shape);
  CHECK(names(r, "inputs.keys: sequence 0 has 5 pages of page_size"));
}

TEST_CASE("misuse: compact rejects K and V that share memory before any write, naming keys and values") {
  const std::int64_t H = 2, L = 8, D = 4;
  guarded buf(2 * H * L * D, 5);
  float* base = buf.data.data();
  const keep_plan plan = every_other(H, {L});
  const auto kv = make_contiguous_view(base, 1, H, L, D);
  struct pair {
    const char* what;
    kv_view<float> values;
  };
  const pair cases[] = {
      {"the same view", kv},
      {"values one token later", make_contiguous_view(base + D, 1, H, L, D)},
      {"values half a row later", make_contiguous_view(base + 2, 1, H, L, D)},
      {"values one head later", make_contiguous_view(base + L * D, 1, H, L, D)},
      // Different strides over intersecting ranges: no cheap exact test, rejected conservatively.
      {"values transposed over the keys", kv_view<float>{base + H * L * D - L * D, 1, H, L, D, 0, L * D, 1, L}},
      {"values transposed, same range", kv_view<float>{base, 1, H, L, D, 0, L * D, 1, L}},
  };
  for (const pair& c : cases) {
    INFO("case: " << std::string(c.what));
    const result r = cpu::compact(plan.view(), kv, c.values);
    INFO(std::string(r.message()));
    CHECK(r.code() == status::invalid_argument);
    CHECK(names(r, "keys and values overlap"));
    CHECK(buf.untouched());
  }

  // Paged: both pools the same, or V one page into K.
  const std::int64_t pages = 4, P = 2;
  const std::vector<std::int32_t> indptr{0, 3}, indices{2, 0, 3}, last{1};
  const keep_plan paged_plan = every_other(H, {5});
  for (const std::int64_t shift : {std::int64_t{0}, P * H * D, std::int64_t{1}}) {
    CAPTURE(shift);
    const auto view = make_paged_view(page_layout::nhd, base, base + shift, pages, P, H, D, 1, indptr.data(),
                                      indices.data(), last.data());
    const result r = cpu::compact(paged_plan.view(), view);
    INFO(std::string(r.message()));
    CHECK(r.code() == status::invalid_argument);
    CHECK(names(r, "view.k_data and view.v_data overlap"));
    CHECK(buf.untouched());
  }
}

namespace {
// Compacts K and V given as separate contiguous buffers: the reference for the interleaved layouts below. The plan
// is taken by copy (a fresh copy of the plan the caller applies itself: a plan is applied once).
void compact_separately(keep_plan plan, std::vector<float>& k, std::vector<float>& v, std::int64_t H,
                        std::int64_t L, std::int64_t D) {
  REQUIRE(cpu::compact(plan.view(), make_contiguous_view(k.data(), 1, H, L, D),
                       make_contiguous_view(v.data(), 1, H, L, D)).ok());
}
}  // namespace

TEST_CASE("misuse: K and V interleaved in one buffer with equal strides are accepted and compact exactly") {
  const std::int64_t H = 3, L = 9, D = 4;
  const keep_plan plan = every_other(H, {L});
  // Dense [tokens][2][heads][head_dim]: K and V rows alternate; the byte ranges intersect, no element does.
  std::vector<float> one = fairkv_test::random_floats(static_cast<std::size_t>(L * 2 * H * D), 6);
  std::vector<float> k(static_cast<std::size_t>(H * L * D)), v(k.size());
  for (std::int64_t t = 0; t < L; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        k[static_cast<std::size_t>((h * L + t) * D + d)] = one[static_cast<std::size_t>(((t * 2 + 0) * H + h) * D + d)];
        v[static_cast<std::size_t>((h * L + t) * D + d)] = one[static_cast<std::size_t>(((t * 2 + 1) * H + h) * D + d)];
      }
  const kv_view<float> kview{one.data(), 1, H, L, D, 0, D, 2 * H * D, 1};
  const kv_view<float> vview{one.data() + H * D, 1, H, L, D, 0, D, 2 * H * D, 1};
  compact_separately(plan, k, v, H, L, D);
  const result r = cpu::compact(plan.view(), kview, vview);
  REQUIRE_MESSAGE(r.ok(), r.message());
  for (std::int64_t t = 0; t < L; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        REQUIRE(*(kview.row(0, h, t) + d) == k[static_cast<std::size_t>((h * L + t) * D + d)]);
        REQUIRE(*(vview.row(0, h, t) + d) == v[static_cast<std::size_t>((h * L + t) * D + d)]);
      }

  // FlashInfer's paged pool [pages][2][page_size][heads][head_dim]: V is page_size * heads * head_dim after K.
  const std::int64_t pages = 5, P = 3, page = P * H * D;
  std::vector<float> pool = fairkv_test::random_floats(static_cast<std::size_t>(pages * 2 * page), 7);
  const std::vector<std::int32_t> indptr{0, 3}, indices{4, 0, 2}, last{2};
  auto view = make_paged_view(page_layout::nhd, pool.data(), pool.data() + page, pages, P, H, D, 1, indptr.data(),
                              indices.data(), last.data());
  view.stride_page = 2 * page;
  const std::int64_t tokens = view.tokens_of(0);
  std::vector<float> pk(static_cast<std::size_t>(H * tokens * D)), pv(pk.size());
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        pk[static_cast<std::size_t>((h * tokens + t) * D + d)] = view.keys().row(0, h, t)[d];
        pv[static_cast<std::size_t>((h * tokens + t) * D + d)] = view.values().row(0, h, t)[d];
      }
  const keep_plan paged_plan = every_other(H, {tokens});
  compact_separately(paged_plan, pk, pv, H, tokens, D);
  const result pr = cpu::compact(paged_plan.view(), view);
  REQUIRE_MESSAGE(pr.ok(), pr.message());
  for (std::int64_t j = 0; j < paged_plan.count(0, 0); ++j)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        REQUIRE(view.keys().row(0, h, j)[d] == pk[static_cast<std::size_t>((h * tokens + j) * D + d)]);
        REQUIRE(view.values().row(0, h, j)[d] == pv[static_cast<std::size_t>((h * tokens + j) * D + d)]);
      }
}

TEST_CASE("checked arithmetic: the portable forms agree with 128-bit arithmetic") {
  __extension__ typedef __int128 i128;
  std::mt19937_64 rng(17);
  const std::int64_t edges[] = {0, 1, -1, 2, -2, 3, INT64_MAX, INT64_MIN, INT64_MAX / 2, INT64_MIN / 2,
                                INT64_MAX / 3, -(INT64_MAX / 3), INT64_C(1) << 31, INT64_C(1) << 32,
                                -(INT64_C(1) << 32), (INT64_C(1) << 62) + 1, 3037000499, 3037000500, -3037000500};
  std::vector<std::int64_t> values(std::begin(edges), std::end(edges));
  for (int i = 0; i < 200; ++i) values.push_back(static_cast<std::int64_t>(rng()) >> (rng() % 64));
  int wrong = 0;
  for (const std::int64_t a : values)
    for (const std::int64_t b : values) {
      const i128 mul = static_cast<i128>(a) * b, add = static_cast<i128>(a) + b;
      const bool mul_fits = mul >= INT64_MIN && mul <= INT64_MAX, add_fits = add >= INT64_MIN && add <= INT64_MAX;
      std::int64_t m1 = 0, m2 = 0, a1 = 0, a2 = 0;
      const bool ok = fairkv::detail::checked_mul_portable(a, b, m1) == mul_fits &&
                      fairkv::detail::checked_mul(a, b, m2) == mul_fits &&
                      (!mul_fits || (m1 == static_cast<std::int64_t>(mul) && m2 == m1)) &&
                      fairkv::detail::checked_add_portable(a, b, a1) == add_fits &&
                      fairkv::detail::checked_add(a, b, a2) == add_fits &&
                      (!add_fits || (a1 == static_cast<std::int64_t>(add) && a2 == a1)) &&
                      fairkv::detail::saturating_mul(a, b) == (mul_fits ? static_cast<std::int64_t>(mul) : INT64_MAX);
      if (!ok && ++wrong <= 5) FAIL_CHECK("checked arithmetic wrong for " << a << " and " << b);
    }
  CHECK(wrong == 0);
}
