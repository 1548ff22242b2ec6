// Bounded fuzz of hostile views (issue 10), deterministic seeds. Each case generates a dense (kv_view) or paged
// layout, usually a valid nested one (random dimension order, padding, K and V separate, interleaved or shifted
// into each other), often mutated (shrunk or huge strides, bad extents, null pointers, corrupt page tables).
// Buffers are exactly as large as the view claims to span. Then cpu::plan and cpu::compact either reject the view
// (a status, a message naming it, every byte untouched) or succeed, and then a naive oracle confirms the view was
// valid (no aliasing, K and V disjoint, page table sane) and the buffers equal a naive compaction. Any access
// outside the buffers is caught by the sanitizer build (scripts/test.sh).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"

using namespace fairkv;

namespace {

__extension__ typedef __int128 i128;

using knorm_uniform = policy<scorers::knorm, selectors::per_head, allocators::uniform>;

// Views larger than this (in elements) are never allocated: they must be rejected (the generator only makes them
// by mutations that overflow or leave the address space).
constexpr i128 max_alloc = 1 << 16;

std::int64_t pick(std::mt19937& rng, std::int64_t lo, std::int64_t hi) {  // uniform in [lo, hi]
  return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(hi - lo + 1));
}

// Strides that, on a dimension that steps, always overflow or span more than PTRDIFF_MAX bytes of 2-byte elements.
// (A smaller one, INT64_MAX / 3 say, describes an addressable but enormous view: validation cannot know the
// buffer's size, so that is accepted, and this fuzz must not generate it.)
const std::int64_t huge_values[] = {INT64_MAX, INT64_MAX / 2, INT64_MAX - 5, INT64_C(1) << 62};

// A stride made smaller by 1 to 51 (it may alias, or turn negative).
std::int64_t shrunk(std::mt19937& rng, std::int64_t stride) {
  return stride - 1 - pick(rng, 0, std::max<std::int64_t>(0, std::min<std::int64_t>(stride, 50)));
}

// Strides for dimensions of the given extents, nested innermost-first in `order`, with random padding. With
// pair_level >= 0, an extra dimension of extent 2 (K next to V) sits at that nesting level; its stride is the
// offset from K to V. Dimensions of extent <= 1 get an arbitrary (irrelevant) positive stride.
std::vector<std::int64_t> nested_strides(std::mt19937& rng, const std::vector<std::int64_t>& extents,
                                         const std::vector<int>& order, int pair_level, std::int64_t& pair_stride) {
  std::vector<std::int64_t> strides(extents.size(), 1);
  i128 span = 1;
  auto pad = [&] { return rng() % 4 == 0 ? pick(rng, 1, 3) : 0; };
  const int levels = static_cast<int>(order.size()) + (pair_level >= 0 ? 1 : 0);
  std::size_t next = 0;
  for (int level = 0; level < levels; ++level) {
    const auto stride = static_cast<std::int64_t>(span) + (level == 0 ? rng() % 3 == 0 : pad());
    if (level == pair_level) {
      pair_stride = stride;
      span += stride;
      continue;
    }
    const int i = order[next++];
    if (extents[static_cast<std::size_t>(i)] <= 1) {
      const std::int64_t irrelevant[] = {1, 5, INT64_MAX};
      strides[static_cast<std::size_t>(i)] = irrelevant[rng() % 3];
      continue;
    }
    strides[static_cast<std::size_t>(i)] = stride;
    span += static_cast<i128>(stride) * (extents[static_cast<std::size_t>(i)] - 1);
  }
  return strides;
}

// 1 + the largest element offset; -1 when some stride of a dimension that steps is negative (the view reaches
// below its pointer); 0 when some extent is 0 (nothing addressed).
i128 naive_span(const std::vector<std::int64_t>& extents, const std::vector<std::int64_t>& strides) {
  i128 span = 1;
  for (std::size_t i = 0; i < extents.size(); ++i) {
    if (extents[i] <= 0) return 0;
    if (extents[i] == 1) continue;
    if (strides[i] < 0) return -1;
    span += static_cast<i128>(strides[i]) * (extents[i] - 1);
  }
  return span;
}

// Every element offset of the view (extents small); the view aliases when two coincide.
std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& extents, const std::vector<std::int64_t>& strides) {
  std::vector<std::int64_t> out{0};
  for (std::size_t i = 0; i < extents.size(); ++i) {
    std::vector<std::int64_t> next;
    for (const std::int64_t o : out)
      for (std::int64_t x = 0; x < extents[i]; ++x) next.push_back(o + (extents[i] > 1 ? x * strides[i] : 0));
    out.swap(next);
  }
  return out;
}

bool aliases(std::vector<std::int64_t> offs) {
  std::sort(offs.begin(), offs.end());
  return std::adjacent_find(offs.begin(), offs.end()) != offs.end();
}

// Whether elements of `elem` bytes at the two offset sets (in elements, relative byte bases) share a byte.
bool bytes_meet(const std::vector<std::int64_t>& a, std::int64_t a_base, const std::vector<std::int64_t>& b,
                std::int64_t b_base, std::int64_t elem) {
  std::vector<std::int64_t> starts;
  for (const std::int64_t o : a) starts.push_back(a_base + o * elem);
  std::sort(starts.begin(), starts.end());
  for (const std::int64_t o : b) {
    const std::int64_t s = b_base + o * elem;
    auto it = std::lower_bound(starts.begin(), starts.end(), s - elem + 1);
    if (it != starts.end() && *it < s + elem) return true;
  }
  return false;
}

template <class T>
std::vector<T> random_elements(std::size_t n, std::mt19937& rng) {
  std::vector<T> v(n);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (auto& x : v) x = from_float<T>(dist(rng));
  return v;
}

// A random valid plan (ascending subsets) for the given lengths.
keep_plan random_plan(std::mt19937& rng, std::int64_t heads, const std::vector<std::int64_t>& lengths) {
  keep_plan p;
  const std::int64_t cap = std::max<std::int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  p.resize(static_cast<std::int64_t>(lengths.size()), heads, cap);
  const keep_plan_view v = p.view();
  for (std::int64_t b = 0; b < v.batch; ++b) {
    v.lengths[b] = static_cast<std::int32_t>(lengths[static_cast<std::size_t>(b)]);
    for (std::int64_t h = 0; h < heads; ++h) {
      std::int32_t n = 0;
      for (std::int32_t t = 0; t < v.lengths[b]; ++t)
        if (rng() % 2) v.row(b, h)[n++] = t;
      v.counts[b * heads + h] = n;
    }
  }
  return p;
}

// Byte equality; an empty buffer (V inside K's buffer) is equal to itself.
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

bool names_a_view(const result& r) {
  const std::string m = r.message();
  return m.find("keys") != std::string::npos || m.find("values") != std::string::npos ||
         m.find("view") != std::string::npos;
}

struct tally {
  int accepted = 0, rejected = 0;
};

// A planner's refusal must name the keys (the view is then compacted with a hand-made plan).
void check_plan_refusal(const result& planned) {
  INFO("plan: " << std::string(planned.message()));
  CHECK(std::string(planned.message()).find("inputs.keys") != std::string::npos);
}

// Counts compact's verdict; a refusal must name a view and leave every byte as it was. True when accepted.
template <class Untouched>
bool accepted(const result& r, tally& t, const Untouched& untouched) {
  if (r.ok()) {
    ++t.accepted;
    return true;
  }
  ++t.rejected;
  INFO("compact: " << std::string(r.message()));
  CHECK(names_a_view(r));
  CHECK(untouched());
  return false;
}

// ---- dense ------------------------------------------------------------------------------------------------------

struct dense_side {
  std::vector<std::int64_t> extents;  // batch, heads, tokens, head_dim
  std::vector<std::int64_t> strides;  // stride_batch, stride_head, stride_token, stride_dim
  std::int64_t base = 0;              // element offset in its buffer
  bool null = false;
};

void mutate_dense(std::mt19937& rng, dense_side& s) {
  const auto i = static_cast<std::size_t>(pick(rng, 0, 3));
  switch (rng() % 6) {
    case 0: s.strides[i] = shrunk(rng, s.strides[i]); break;
    case 1: s.strides[i] = huge_values[rng() % 4]; break;
    case 2: std::swap(s.strides[i], s.strides[static_cast<std::size_t>(pick(rng, 0, 3))]); break;
    case 3: {
      const std::int64_t bad[] = {0, -1, INT64_C(1) << 62};
      s.extents[i] = bad[rng() % 3];
      break;
    }
    case 4: s.null = true; break;
    default: s.strides[i] = pick(rng, 0, 3); break;
  }
}

template <class T>
kv_view<T> make(const dense_side& s, T* buffer) {
  return {s.null ? nullptr : buffer + s.base, s.extents[0], s.extents[1], s.extents[2], s.extents[3],
          s.strides[0], s.strides[1], s.strides[2], s.strides[3]};
}

template <class T>
void dense_case(std::mt19937& rng, tally& t) {
  const std::vector<std::int64_t> ext{pick(rng, 1, 2), pick(rng, 1, 3), pick(rng, 1, 9), pick(rng, 1, 5)};
  auto inner_order = [&] {
    std::vector<int> o{1, 2, 3};
    std::shuffle(o.begin(), o.end(), rng);
    o.push_back(0);  // kv_view requires the batch outermost
    return o;
  };
  const int placement = static_cast<int>(rng() % 4);  // 0, 1: separate buffers, 2: interleaved, 3: shifted
  std::int64_t pair_stride = 0;
  dense_side k{ext, {}, 0, false}, v{ext, {}, 0, false};
  k.strides = nested_strides(rng, ext, inner_order(), placement == 2 ? static_cast<int>(pick(rng, 0, 4)) : -1,
                             pair_stride);
  v.strides = placement <= 1 ? nested_strides(rng, ext, inner_order(), -1, pair_stride) : k.strides;
  const bool clean = rng() % 3 != 0;
  if (!clean) {
    const bool shared_strides = placement >= 2 && rng() % 2;
    mutate_dense(rng, rng() % 2 ? k : v);
    if (shared_strides) {
      v.strides = k.strides;
      v.extents = k.extents;
    }
  }
  const i128 k_span = naive_span(k.extents, k.strides), v_span = naive_span(v.extents, v.strides);
  const bool k_fits = k_span >= 0 && k_span <= max_alloc, v_fits = v_span >= 0 && v_span <= max_alloc;
  // One buffer for an interleaved or shifted pair when both can be allocated, else one buffer each.
  const bool shared = placement >= 2 && k_fits && v_fits;
  if (placement == 2 && shared) v.base = pair_stride;
  if (placement == 3 && shared) v.base = pick(rng, 0, static_cast<std::int64_t>(k_span));
  // Exactly the claimed sizes (one element for a view that must be rejected, so the pointer is still valid).
  auto size_of = [](const dense_side& s, i128 span, bool fits) {
    return fits ? static_cast<std::size_t>(std::max<i128>(1, s.base + span)) : std::size_t{1};
  };
  std::vector<T> kbuf = random_elements<T>(
      shared ? std::max(size_of(k, k_span, true), size_of(v, v_span, true)) : size_of(k, k_span, k_fits), rng);
  std::vector<T> vbuf = random_elements<T>(shared ? 0 : size_of(v, v_span, v_fits), rng);
  T* vdata = shared ? kbuf.data() : vbuf.data();
  const auto kview = make(k, kbuf.data());
  const auto vview = make(v, vdata);
  const auto k0 = kbuf, v0 = vbuf;
  auto untouched = [&] { return same_bytes(kbuf, k0) && same_bytes(vbuf, v0); };

  // The naive verdict, only needed when the library accepts (and only computable when small).
  auto valid_side = [&](const dense_side& s, i128 span) {
    if (s.null || span < 0 || span > max_alloc) return false;
    if (s.extents[0] <= 0 || s.extents[1] <= 0 || s.extents[3] <= 0 || s.extents[2] < 0) return false;
    if (span == 0) return true;
    return !aliases(offsets(s.extents, s.strides));
  };

  keep_plan plan;
  const result planned = cpu::plan(knorm_uniform{}, keys_only(kview), {}, {}, 0.5, plan);
  if (!planned.ok()) {
    check_plan_refusal(planned);
    const bool small = k.extents[0] >= 1 && k.extents[0] <= 2 && k.extents[1] >= 1 && k.extents[1] <= 3 &&
                       k.extents[2] >= 0 && k.extents[2] <= 9;
    plan = small ? random_plan(rng, k.extents[1], std::vector<std::int64_t>(static_cast<std::size_t>(k.extents[0]),
                                                                             k.extents[2]))
                 : random_plan(rng, 1, {1});
  } else {
    REQUIRE(valid_side(k, k_span));
  }
  const keep_plan_view pv = plan.view();
  if (!accepted(cpu::compact(pv, kview, vview), t, untouched)) return;
  REQUIRE(valid_side(k, k_span));
  REQUIRE(valid_side(v, v_span));
  const auto k_offs = offsets(k.extents, k.strides), v_offs = offsets(v.extents, v.strides);
  const auto e = static_cast<std::int64_t>(sizeof(T));
  if (shared) {
    REQUIRE_FALSE(bytes_meet(k_offs, k.base * e, v_offs, v.base * e, e));
  }
  // A clean interleaved pair (equal strides, disjoint by construction) must never be refused: checked below.
  // Naive compaction on copies of the original buffers.
  auto expect_k = k0, expect_v = v0;
  auto apply = [&](const dense_side& s, const std::vector<T>& from, std::vector<T>& to) {
    auto at = [&](std::int64_t b, std::int64_t h, std::int64_t tok, std::int64_t d) {
      return static_cast<std::size_t>(s.base + b * s.strides[0] * (s.extents[0] > 1) +
                                      h * s.strides[1] * (s.extents[1] > 1) + tok * s.strides[2] * (s.extents[2] > 1) +
                                      d * s.strides[3] * (s.extents[3] > 1));
    };
    for (std::int64_t b = 0; b < pv.batch; ++b)
      for (std::int64_t h = 0; h < pv.heads; ++h)
        for (std::int32_t j = 0; j < pv.count(b, h); ++j)
          for (std::int64_t d = 0; d < s.extents[3]; ++d) to[at(b, h, j, d)] = from[at(b, h, pv.row(b, h)[j], d)];
  };
  apply(k, k0, expect_k);
  apply(v, shared ? k0 : v0, shared ? expect_k : expect_v);
  CHECK(same_bytes(kbuf, expect_k));
  CHECK(same_bytes(vbuf, expect_v));
}

// ---- paged ------------------------------------------------------------------------------------------------------

template <class T>
void paged_case(std::mt19937& rng, tally& t) {
  std::int64_t N = pick(rng, 1, 8), P = pick(rng, 1, 4), H = pick(rng, 1, 3), D = pick(rng, 1, 4);
  const std::int64_t B = pick(rng, 1, 3);
  std::vector<int> order{0, 1, 2, 3};  // page, slot, head, dim
  std::shuffle(order.begin(), order.end(), rng);
  const bool interleaved = rng() % 3 == 0;
  std::int64_t pair_stride = 0;
  auto strides = nested_strides(rng, {N, P, H, D}, order, interleaved ? static_cast<int>(pick(rng, 0, 4)) : -1,
                                pair_stride);
  // Page table: distinct pages, up to three per sequence.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(N));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::int32_t> indptr{0}, last;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = std::min<std::int64_t>(pick(rng, 0, 3), N - indptr.back());
    indptr.push_back(static_cast<std::int32_t>(indptr.back() + n));
    last.push_back(static_cast<std::int32_t>(n > 0 ? pick(rng, 1, P) : pick(rng, 0, P)));
  }
  std::vector<std::int32_t> indices(ids.begin(), ids.begin() + indptr.back());
  std::int64_t v_shift = -1;  // K and V pools in one buffer, V this many elements after K (-1: separate buffers)
  bool null_k = false, null_tables = false;
  if (interleaved) v_shift = pair_stride;
  if (rng() % 2 == 0) {  // a mutation
    const auto i = static_cast<std::size_t>(pick(rng, 0, 3));
    const auto nnz = static_cast<std::int64_t>(indices.size());
    switch (rng() % 11) {
      case 0: strides[i] = shrunk(rng, strides[i]); break;
      case 1: strides[i] = huge_values[rng() % 4]; break;
      case 2: std::swap(strides[i], strides[static_cast<std::size_t>(pick(rng, 0, 3))]); break;
      case 3:
        if (nnz >= 2) indices[static_cast<std::size_t>(pick(rng, 1, nnz - 1))] = indices[0];
        break;
      case 4:
        if (nnz >= 1)
          indices[static_cast<std::size_t>(pick(rng, 0, nnz - 1))] = rng() % 2 ? static_cast<std::int32_t>(N) : -1;
        break;
      case 5:
        last[static_cast<std::size_t>(pick(rng, 0, B - 1))] = rng() % 2 ? 0 : static_cast<std::int32_t>(P + 1);
        break;
      case 6:
        if (B >= 2) indptr[1] = indptr[2] + 1;
        break;
      case 7: P = INT64_C(1) << 62; break;
      case 8: (rng() % 2 ? N : H) = 0; break;
      case 9: (rng() % 2 ? null_k : null_tables) = true; break;
      default: v_shift = pick(rng, 0, 2 * N * P * H * D); break;  // V somewhere into (or past) the K pool
    }
    indices.resize(static_cast<std::size_t>(std::max<std::int32_t>(0, indptr.back())));
  }
  const std::vector<std::int64_t> ext{N, P, H, D};
  const i128 span = naive_span(ext, strides);
  const bool allocatable = span >= 0 && span <= max_alloc;
  const std::int64_t pool = allocatable ? std::max<std::int64_t>(1, static_cast<std::int64_t>(span)) : 1;
  const bool shared = v_shift >= 0 && allocatable;
  std::vector<T> kbuf =
      random_elements<T>(static_cast<std::size_t>(shared ? std::max(pool, v_shift + pool) : pool), rng);
  std::vector<T> vbuf = random_elements<T>(static_cast<std::size_t>(shared ? 0 : pool), rng);
  T* vdata = shared ? kbuf.data() + v_shift : vbuf.data();
  paged_kv_view<T> view{null_k ? nullptr : kbuf.data(), vdata, N, P, H, D, strides[0], strides[1], strides[2],
                        strides[3], B, null_tables ? nullptr : indptr.data(), indices.data(), last.data()};
  const auto k0 = kbuf, v0 = vbuf;
  auto untouched = [&] { return same_bytes(kbuf, k0) && same_bytes(vbuf, v0); };
  // Naive tokens of each sequence when the table is sane enough to say (for the hand-made plan).
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = indptr[static_cast<std::size_t>(b + 1)] - indptr[static_cast<std::size_t>(b)];
    const std::int64_t len = n <= 0 ? 0 : (n - 1) * std::min<std::int64_t>(P, 64) + last[static_cast<std::size_t>(b)];
    lengths.push_back(std::clamp<std::int64_t>(len, 0, 64));
  }

  const paged_side<const T> keys{view.k_data, N, B, H, D, P, strides[0], strides[1], strides[2], strides[3],
                                 view.indptr, view.indices, view.last_page_len};
  keep_plan plan;
  const result planned = cpu::plan(knorm_uniform{}, layer_inputs<paged_side<const T>>{keys}, {}, {}, 0.5, plan);
  if (!planned.ok()) {
    check_plan_refusal(planned);
    plan = random_plan(rng, std::clamp<std::int64_t>(H, 1, 3), lengths);
  }
  const keep_plan_view pv = plan.view();
  if (!accepted(cpu::compact(pv, view), t, untouched)) return;
  // Accepted: the oracle must agree the view was valid.
  REQUIRE(allocatable);
  REQUIRE_FALSE(null_k);
  REQUIRE_FALSE(null_tables);
  REQUIRE(N > 0);
  REQUIRE(H > 0);
  REQUIRE(P <= 4);
  const auto offs = offsets(ext, strides);
  REQUIRE_FALSE(aliases(offs));
  const auto e = static_cast<std::int64_t>(sizeof(T));
  if (shared) REQUIRE_FALSE(bytes_meet(offs, 0, offs, v_shift * e, e));
  REQUIRE(indptr[0] == 0);
  std::vector<std::int32_t> sorted = indices;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  for (const std::int32_t id : indices) REQUIRE((id >= 0 && id < N));
  for (std::int64_t b = 0; b < B; ++b) {
    REQUIRE(indptr[static_cast<std::size_t>(b + 1)] >= indptr[static_cast<std::size_t>(b)]);
    if (indptr[static_cast<std::size_t>(b + 1)] > indptr[static_cast<std::size_t>(b)])
      REQUIRE((last[static_cast<std::size_t>(b)] >= 1 && last[static_cast<std::size_t>(b)] <= P));
  }
  // Naive compaction: token t of sequence b lives in page indices[indptr[b] + t / P], slot t % P.
  auto expect_k = k0, expect_v = v0;
  auto at = [&](std::int64_t base, std::int64_t b, std::int64_t h, std::int64_t tok, std::int64_t d) {
    const std::int64_t page = indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b)] + tok / P)];
    return static_cast<std::size_t>(base + page * strides[0] * (N > 1) + (tok % P) * strides[1] * (P > 1) +
                                    h * strides[2] * (H > 1) + d * strides[3] * (D > 1));
  };
  const std::int64_t v_base = shared ? v_shift : 0;
  std::vector<T>& v_to = shared ? expect_k : expect_v;
  const std::vector<T>& v_from = shared ? k0 : v0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int32_t j = 0; j < pv.count(b, h); ++j)
        for (std::int64_t d = 0; d < D; ++d) {
          expect_k[at(0, b, h, j, d)] = k0[at(0, b, h, pv.row(b, h)[j], d)];
          v_to[at(v_base, b, h, j, d)] = v_from[at(v_base, b, h, pv.row(b, h)[j], d)];
        }
  CHECK(same_bytes(kbuf, expect_k));
  CHECK(same_bytes(vbuf, expect_v));
}

}  // namespace

TEST_CASE("fuzz: dense views are rejected untouched or compacted exactly inside their buffers") {
  std::mt19937 rng(20240610);
  tally t;
  for (int i = 0; i < 3000; ++i) {
    CAPTURE(i);
    if (i % 2) dense_case<float>(rng, t); else dense_case<half_t>(rng, t);
  }
  MESSAGE("dense fuzz: " << t.accepted << " accepted, " << t.rejected << " rejected");
  CHECK(t.accepted > 600);  // the generator must exercise both paths
  CHECK(t.rejected > 600);
}

TEST_CASE("fuzz: paged views and page tables are rejected untouched or compacted exactly inside their pools") {
  std::mt19937 rng(977);
  tally t;
  for (int i = 0; i < 3000; ++i) {
    CAPTURE(i);
    if (i % 2) paged_case<float>(rng, t); else paged_case<bfloat16_t>(rng, t);
  }
  MESSAGE("paged fuzz: " << t.accepted << " accepted, " << t.rejected << " rejected");
  CHECK(t.accepted > 600);
  CHECK(t.rejected > 600);
}

TEST_CASE("fuzz: the K/V overlap test is exact for equal strides and never misses an overlap") {
  std::mt19937 rng(31);
  int exact = 0, conservative = 0;
  for (int i = 0; i < 3000; ++i) {
    CAPTURE(i);
    // Two nested views of up to four dims, equal strides most of the time, bases within each other's reach,
    // at any byte offset (footprints are only addresses: nothing is dereferenced).
    const std::vector<std::int64_t> ea{pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 4), pick(rng, 1, 4)};
    std::vector<std::int64_t> eb = ea;
    if (rng() % 4 == 0) {  // a shorter V (never longer: a's irrelevant strides must stay irrelevant)
      const auto d = static_cast<std::size_t>(pick(rng, 0, 3));
      eb[d] = pick(rng, 1, ea[d]);
    }
    std::vector<int> order{0, 1, 2, 3};
    std::shuffle(order.begin(), order.end(), rng);
    std::int64_t unused = 0;
    const auto sa = nested_strides(rng, ea, order, -1, unused);
    std::shuffle(order.begin(), order.end(), rng);
    const auto sb = rng() % 5 == 0 ? nested_strides(rng, eb, order, -1, unused) : sa;
    const std::int64_t elem = rng() % 2 ? 4 : 2;
    const std::int64_t reach = static_cast<std::int64_t>(naive_span(ea, sa)) * elem;
    const std::int64_t shift = pick(rng, -reach - 8, reach + 8);
    const std::uintptr_t base = std::uintptr_t{1} << 40;
    fairkv::detail::footprint fa{base, elem, 4, {}}, fb{base + static_cast<std::uintptr_t>(shift), elem, 4, {}};
    for (std::size_t d = 0; d < 4; ++d) {
      fa.dims[d] = {ea[d], sa[d], "e", "s"};
      fb.dims[d] = {eb[d], sb[d], "e", "s"};
    }
    const bool meet = bytes_meet(offsets(ea, sa), 0, offsets(eb, sb), shift, elem);
    const bool said = fairkv::detail::may_overlap(fa, fb);
    if (meet) REQUIRE(said);  // never misses an overlap
    bool same_strides = true;
    for (std::size_t d = 0; d < 4; ++d)
      if (ea[d] > 1 && eb[d] > 1 && sa[d] != sb[d]) same_strides = false;
    if (same_strides) {
      REQUIRE(said == meet);  // exact: legitimate interleaving is never refused
      ++exact;
    } else if (said && !meet) {
      ++conservative;
    }
  }
  MESSAGE("overlap fuzz: " << exact << " exact cases, " << conservative << " conservative refusals");
  CHECK(exact > 1500);
}
