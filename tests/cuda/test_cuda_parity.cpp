// CPU-vs-GPU parity of the CUDA backend (ggml test-backend-ops style): random cases run through fairkv::cpu (the
// oracle) and fairkv::cuda; plans must be identical and compacted tensors bit-identical.
//  - suite "cuda_host": host-side checks that need no GPU (validation messages equal the CPU's, limits, sizes);
//  - suite "cuda_parity": needs a device. Without one, every case is skipped by doctest and the probe prints
//    "SKIPPED: no CUDA device", which ctest's SKIP_REGULAR_EXPRESSION turns into a visible "Skipped".
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fairkv/cpu/reference/scores.hpp"
#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/fairkv.hpp"
#include "gpu_runner.hpp"
#include "parity_case.hpp"

namespace {

using namespace fairkv_test;
using fairkv::result;
using fairkv::status;

const bool no_device = !probe_device().available;
// FAIRKV_CUDA_QUICK=1: fewer and shorter cases (for runs under compute-sanitizer, which is 10-100x slower).
const bool quick = std::getenv("FAIRKV_CUDA_QUICK") != nullptr;

[[nodiscard]] bool uses_segments(allocator_id a) {
  return a == allocator_id::fair || a == allocator_id::fair_with_whitelist || a == allocator_id::debias ||
         a == allocator_id::fair_paper || a == allocator_id::prioritized;
}
[[nodiscard]] bool uses_whitelist(allocator_id a) {
  return a == allocator_id::whitelist || a == allocator_id::fair_with_whitelist || a == allocator_id::debias ||
         a == allocator_id::fair_paper || a == allocator_id::prioritized;
}

// prioritized: drops the floors when, with every forced token counted apart, they might not fit n_keep (a plan
// that both backends refuse is the host checks' business, not parity's).
void fit_floors(host_case& c, std::int64_t n_keep) {
  std::int64_t need = static_cast<std::int64_t>(std::set<std::int32_t>(c.whitelist.begin(), c.whitelist.end()).size()) +
                      c.protect.n_sink;
  for (std::size_t i = 0; i < c.segments.size(); ++i) {
    need += std::min<std::int64_t>(c.segments[i].size(), 2 * c.protect.boundary);
    if (i < c.priorities.size())
      need += static_cast<std::int64_t>(std::ceil(double(c.priorities[i].floor) * double(c.segments[i].size())));
  }
  need += static_cast<std::int64_t>(std::ceil(double(c.remainder_priority.floor) * double(c.tokens)));
  if (need <= n_keep) return;
  for (fairkv::segment_priority& p : c.priorities) p.floor = 0.f;
  c.remainder_priority.floor = 0.f;
}

template <class T>
void store(host_case& c, std::vector<unsigned char>& bytes, std::int64_t b, std::int64_t h, std::int64_t t,
           std::int64_t d, float x) {
  const fairkv::kv_view<T> v = make_view(c, reinterpret_cast<T*>(bytes.data()));
  v.row(b, h, t)[d * v.stride_dim] = fairkv::from_float<T>(x);
}

// Values that make ties, signed zeros, infinities and NaN likely in the first key element.
float special_value(std::mt19937& rng) {
  static const float pool[] = {std::numeric_limits<float>::quiet_NaN(), -0.0f, 0.0f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               1.0f, 2.0f, -1.0f, 0.5f, 1.0f};
  return pool[rng() % (sizeof(pool) / sizeof(pool[0]))];
}

// Segments the allocator accepts over L tokens: fair_paper's two adjacent spans, or up to four disjoint ones.
std::vector<fairkv::segment> random_segments(std::mt19937& rng, allocator_id a, std::int64_t L) {
  std::vector<fairkv::segment> out;
  if (a == allocator_id::fair_paper) {
    // Two adjacent spans [begin, split) and [split, end), sometimes from 0 or to L, in either order.
    const auto begin = static_cast<std::int32_t>(rng() % 3 == 0 ? 0 : rng() % (L - 1));
    const auto split = static_cast<std::int32_t>(begin + 1 + rng() % (L - 1 - begin));
    const auto end = static_cast<std::int32_t>(rng() % 3 == 0 ? L : split + 1 + rng() % (L - split));
    out = {{begin, split}, {split, end}};
    if (rng() % 2) std::swap(out[0], out[1]);
  } else if (uses_segments(a) && L > 1) {  // disjoint segments in random order
    const int n = static_cast<int>(rng() % 5);
    std::set<std::int32_t> cuts;
    for (int i = 0; i < 2 * n; ++i) cuts.insert(static_cast<std::int32_t>(rng() % (L + 1)));
    std::vector<std::int32_t> v(cuts.begin(), cuts.end());
    for (std::size_t i = 0; i + 1 < v.size(); i += 2)
      if (v[i] < v[i + 1] && rng() % 4 != 0) out.push_back({v[i], v[i + 1]});
    std::shuffle(out.begin(), out.end(), rng);
  }
  return out;
}

// Up to min(n_keep, 999) positions (the CUDA backend forces at most 1024, tested separately), a repeat sometimes.
std::vector<std::int32_t> random_whitelist(std::mt19937& rng, std::int64_t L, std::int64_t n_keep) {
  std::vector<std::int32_t> out;
  const std::int64_t n = static_cast<std::int64_t>(rng() % static_cast<unsigned>(std::min<std::int64_t>(n_keep, 999) + 1));
  for (std::int64_t i = 0; i < n; ++i) out.push_back(static_cast<std::int32_t>(rng() % L));
  if (!out.empty() && rng() % 2) out.push_back(out.front());  // duplicates count once
  return out;
}

host_case random_case(std::mt19937& rng, scorer_id s, selector_id sel, allocator_id a, dtype_id d,
                      std::int64_t batch = 0) {
  auto pick = [&](std::initializer_list<std::int64_t> v) { return *(v.begin() + rng() % v.size()); };
  host_case c;
  c.scorer = s;
  c.selector = sel;
  c.allocator = a;
  c.dtype = d;
  if (s == scorer_id::random) c.seed = static_cast<std::uint32_t>(rng());
  c.batch = batch > 0 ? batch : pick({1, 1, 2});
  c.heads = pick({1, 2, 4, 8});
  c.q_heads = c.heads * pick({1, 2});
  const bool attn = is_attention(s);
  c.tokens = attn ? pick({1, 2, 5, 17, 64, 150})
                  : (quick ? pick({1, 2, 3, 7, 64, 100, 513, 4097}) : pick({1, 2, 3, 7, 64, 100, 513, 1500, 4097, 9000}));
  if (a == allocator_id::fair_paper) c.tokens = std::max<std::int64_t>(c.tokens, 2);  // two non-empty spans
  c.head_dim = pick({1, 3, 8, 64, 128});
  c.layout = static_cast<layout_id>(rng() % 4);
  c.capacity = c.tokens + pick({0, 1, 9});
  c.ratio = static_cast<double>(pick({0, 10, 50, 75, 90, 99})) / 100.0;
  c.alpha = static_cast<float>(pick({0, 20, 50, 100})) / 100.0f;
  c.window = static_cast<std::int32_t>(pick({1, 4, 16}));
  c.attn = attn ? static_cast<attention_input>(rng() % (s == scorer_id::h2o ? 4 : 2)) : attention_input::queries;
  if (c.attn == attention_input::column_sums && uses_segments(a)) c.attn = attention_input::rows;
  // Local sums serve the segment-local allocators that read no whole-sequence scores (debias does, and the CUDA
  // backend refuses it anyway; fair_paper's H2O is not a sum).
  if (c.attn == attention_input::local_column_sums &&
      !(uses_segments(a) && a != allocator_id::fair_paper && a != allocator_id::debias))
    c.attn = uses_segments(a) ? attention_input::rows : attention_input::column_sums;
  c.q_tokens = c.tokens;
  const std::int64_t L = c.tokens;
  c.segments = random_segments(rng, a, L);
  if (uses_whitelist(a)) c.whitelist = random_whitelist(rng, L, fairkv::keep_budget(L, c.ratio));
  if (uses_segments(a)) {
    // Sinks (none, the default, many) and boundary tokens where the budget holds them with the whitelist.
    c.protect.n_sink = static_cast<std::int32_t>(pick({0, 4, 4, 9}));
    c.protect.boundary = static_cast<std::int32_t>(pick({0, 0, 1, 3}));
    std::int64_t hard = static_cast<std::int64_t>(std::set<std::int32_t>(c.whitelist.begin(), c.whitelist.end()).size());
    for (const fairkv::segment& s : c.segments) hard += std::min<std::int64_t>(s.size(), 2 * c.protect.boundary);
    if (hard > fairkv::keep_budget(L, c.ratio) || hard > 1000) c.protect.boundary = 0;
  }
  if (a == allocator_id::prioritized) {  // weights with an unweighted tier and ties; floors where they fit
    const float weights[] = {0.f, 0.5f, 1.f, 1.f, 3.f}, floors[] = {0.f, 0.f, 0.25f, 0.5f};
    if (rng() % 4 != 0)
      for (std::size_t i = 0; i < c.segments.size(); ++i)
        c.priorities.push_back({weights[rng() % 5], floors[rng() % 4]});
    c.remainder_priority = {weights[rng() % 5], floors[rng() % 4] / 2};
    fit_floors(c, fairkv::keep_budget(L, c.ratio));
  }
  const std::int64_t bytes = storage_elements(c) * dtype_bytes(d);
  c.k_bytes.resize(static_cast<std::size_t>(bytes));
  c.v_bytes.resize(static_cast<std::size_t>(bytes));
  for (auto& x : c.k_bytes) x = static_cast<unsigned char>(rng());  // padding and spare capacity are random too
  for (auto& x : c.v_bytes) x = static_cast<unsigned char>(rng());
  std::normal_distribution<float> normal(0.f, 1.f);
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t t = 0; t < L; ++t)
        for (std::int64_t e = 0; e < c.head_dim; ++e) {
          const float x = (s == scorer_id::first_element && e == 0 && rng() % 2) ? special_value(rng) : normal(rng);
          with_dtype(d, [&](auto tag) { store<decltype(tag)>(c, c.k_bytes, b, h, t, e, x); });
        }
  if (s == scorer_id::external) {  // the caller's scores: ties, signed zeros, infinities and NaN included
    c.scores_token_major = rng() % 2 != 0;
    c.scores.resize(static_cast<std::size_t>(c.batch * c.heads * L));
    for (float& x : c.scores) x = rng() % 3 == 0 ? special_value(rng) : normal(rng);
  }
  if (attn) {
    c.queries.resize(static_cast<std::size_t>(c.batch * c.q_heads * c.q_tokens * c.head_dim));
    for (auto& x : c.queries) x = normal(rng);
    // Engine attention: random causal rows, normalised; their column sums, whole and renormalised to each
    // query's region (the segments and the runs between them: fairkv::scoring_regions of these allocators).
    c.attention.assign(static_cast<std::size_t>(c.batch * c.q_heads * L * L), 0.f);
    c.column_sums.assign(static_cast<std::size_t>(c.batch * c.q_heads * L), 0.f);
    c.local_column_sums.assign(static_cast<std::size_t>(c.batch * c.q_heads * L), 0.f);
    std::vector<std::int64_t> region_begin(static_cast<std::size_t>(L), 0);  // of the region holding each token
    for (std::int64_t t = 1; t < L; ++t) {
      bool starts = false;
      for (const fairkv::segment& g : c.segments) starts = starts || g.begin == t || g.end == t;
      region_begin[static_cast<std::size_t>(t)] = starts ? t : region_begin[static_cast<std::size_t>(t - 1)];
    }
    std::uniform_real_distribution<float> u(0.01f, 1.f);
    for (std::int64_t r = 0; r < c.batch * c.q_heads; ++r)
      for (std::int64_t p = 0; p < L; ++p) {
        float* row = c.attention.data() + (r * L + p) * L;
        float sum = 0.f;
        for (std::int64_t t = 0; t <= p; ++t) sum += (row[t] = u(rng));
        for (std::int64_t t = 0; t <= p; ++t) {
          row[t] /= sum;
          c.column_sums[static_cast<std::size_t>(r * L + t)] += row[t];
        }
        const std::int64_t rb = region_begin[static_cast<std::size_t>(p)];
        float local = 0.f;
        for (std::int64_t t = rb; t <= p; ++t) local += row[t];
        for (std::int64_t t = rb; t <= p; ++t) c.local_column_sums[static_cast<std::size_t>(r * L + t)] += row[t] / local;
      }
  }
  c.name = "scorer " + std::to_string(static_cast<int>(s)) + " selector " + std::to_string(static_cast<int>(sel)) +
           " allocator " + std::to_string(static_cast<int>(a)) + " dtype " + std::to_string(static_cast<int>(d)) +
           " layout " + std::to_string(static_cast<int>(c.layout)) + " B" + std::to_string(c.batch) + " H" +
           std::to_string(c.heads) + " Hq" + std::to_string(c.q_heads) + " L" + std::to_string(L) + " D" +
           std::to_string(c.head_dim) + " ratio " + std::to_string(c.ratio) + " segments " +
           std::to_string(c.segments.size()) + " whitelist " + std::to_string(c.whitelist.size()) + " attn " +
           std::to_string(static_cast<int>(c.attn));
  return c;
}

// Plans the case at a token budget instead of its ratio: within the sequence (1..L) or above it (kept whole). The
// whitelist and boundary tokens are trimmed to fit the budget, so the plan succeeds.
void use_token_budget(std::mt19937& rng, host_case& c) {
  const std::int64_t L = c.tokens;
  const std::int64_t n = rng() % 5 == 0 ? L + static_cast<std::int64_t>(rng() % 3)
                                        : 1 + static_cast<std::int64_t>(rng() % static_cast<unsigned>(L));
  c.target = fairkv::keep_target::of_tokens(n);
  auto distinct = [&] {
    return static_cast<std::int64_t>(std::set<std::int32_t>(c.whitelist.begin(), c.whitelist.end()).size());
  };
  std::int64_t hard = distinct();
  for (const fairkv::segment& s : c.segments) hard += std::min<std::int64_t>(s.size(), 2 * c.protect.boundary);
  if (hard > std::min(n, L)) c.protect.boundary = 0;
  while (distinct() > std::min(n, L)) c.whitelist.pop_back();
  fit_floors(c, std::min(n, L));
  c.name += " tokens " + std::to_string(n);
}

// Gives every sequence of the case its own segments, whitelist and target (a ratio, or a token budget within or
// above the sequence), as a batch of requests with different system prompts would. Boundary tokens are dropped
// where some sequence's budget cannot hold them with its whitelist; the column sums renormalised to the regions
// of one list cannot serve several, so those cases read the attention rows instead.
void use_requests(std::mt19937& rng, host_case& c, const std::vector<std::int32_t>& lengths = {}) {
  const bool shared_target = rng() % 4 == 0;
  c.segments.clear();
  c.whitelist.clear();
  c.seg_indptr = {0};
  c.wl_indptr = {0};
  c.targets.clear();
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const std::int64_t L = lengths.empty() ? c.tokens : lengths[static_cast<std::size_t>(b)];
    const double ratios[] = {0.0, 0.1, 0.5, 0.75, 0.9};
    const fairkv::keep_target t =
        rng() % 3 == 0 ? fairkv::keep_target::of_tokens(1 + static_cast<std::int64_t>(rng() % static_cast<unsigned>(L + 2)))
                       : fairkv::keep_target::of_ratio(ratios[rng() % 5]);
    if (b == 0 || !shared_target) c.targets.push_back(t);
    const std::int64_t n_keep = c.targets.back().n_keep(L);
    // An empty sequence (an idle slot) takes no lists.
    const std::vector<fairkv::segment> seg =
        L > 0 ? random_segments(rng, c.allocator, L) : std::vector<fairkv::segment>{};
    const std::vector<std::int32_t> wl = uses_whitelist(c.allocator) && L > 0 ? random_whitelist(rng, L, n_keep)
                                                                               : std::vector<std::int32_t>{};
    std::int64_t hard = static_cast<std::int64_t>(std::set<std::int32_t>(wl.begin(), wl.end()).size());
    for (const fairkv::segment& g : seg) hard += std::min<std::int64_t>(g.size(), 2 * c.protect.boundary);
    if (hard > n_keep || hard > 1000) c.protect.boundary = 0;  // sinks and boundaries are the policy's, for all
    c.segments.insert(c.segments.end(), seg.begin(), seg.end());
    c.whitelist.insert(c.whitelist.end(), wl.begin(), wl.end());
    c.seg_indptr.push_back(static_cast<std::int32_t>(c.segments.size()));
    c.wl_indptr.push_back(static_cast<std::int32_t>(c.whitelist.size()));
  }
  if (c.attn == attention_input::local_column_sums) c.attn = attention_input::rows;
  if (c.allocator == allocator_id::prioritized) {  // weights are the policy's: per-request segments get defaults
    c.priorities.clear();
    c.remainder_priority = {};
  }
  c.name += " requests: targets " + std::to_string(c.targets.size()) + ", segments " +
            std::to_string(c.segments.size()) + ", whitelist " + std::to_string(c.whitelist.size());
}

// A ragged paged batch holding a dense case's keys: sequence b is the first lengths[b] tokens of c's sequence b,
// in pages of a random size at shuffled ids of an NHD or HND pool with spare pages (random bytes elsewhere).
// Sequences 0 and 1 share their first full pages, sometimes (those hold sequence 1's keys: planning only reads);
// c's K then holds what the pages hold, so c's K as a padded view is the same batch.
paged_case paginate(std::mt19937& rng, host_case& c, const std::vector<std::int32_t>& lengths) {
  paged_case p;
  p.dtype = c.dtype;
  p.layout = rng() % 2 ? fairkv::page_layout::hnd : fairkv::page_layout::nhd;
  p.batch = c.batch;
  p.heads = c.heads;
  p.head_dim = c.head_dim;
  p.page_size = std::vector<std::int64_t>{1, 3, 16}[rng() % 3];
  p.indptr = {0};
  std::int64_t pages = 0;
  for (const std::int32_t L : lengths) {
    const std::int64_t np = (L + p.page_size - 1) / p.page_size;
    pages += np;
    p.indptr.push_back(static_cast<std::int32_t>(pages));
    p.last_page_len.push_back(static_cast<std::int32_t>(L - (np - 1) * p.page_size));
  }
  p.num_pages = pages + static_cast<std::int64_t>(rng() % 4);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(p.num_pages));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.indices.assign(ids.begin(), ids.begin() + pages);
  if (p.batch >= 2) {  // a shared prefix, as prefix caching leaves it: sequence 1 lists sequence 0's first full pages
    const std::int64_t full = std::min(p.indptr[1] - p.indptr[0], p.indptr[2] - p.indptr[1]) - 1;
    const std::int64_t shared = full > 0 ? static_cast<std::int64_t>(rng() % static_cast<unsigned>(full + 1)) : 0;
    for (std::int64_t j = 0; j < shared; ++j) p.indices[static_cast<std::size_t>(p.indptr[1] + j)] = p.indices[static_cast<std::size_t>(j)];
  }
  const auto bytes = static_cast<std::size_t>(p.num_pages * p.page_size * p.heads * p.head_dim * dtype_bytes(p.dtype));
  p.k_pool.resize(bytes);
  p.v_pool.resize(bytes);
  for (auto& x : p.k_pool) x = static_cast<unsigned char>(rng());
  for (auto& x : p.v_pool) x = static_cast<unsigned char>(rng());
  with_dtype(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto dense = make_view(c, reinterpret_cast<const T*>(c.k_bytes.data()));
    const auto paged = make_paged(p, reinterpret_cast<T*>(p.k_pool.data()), reinterpret_cast<T*>(p.v_pool.data()),
                                  p.indptr.data(), p.indices.data(), p.last_page_len.data()).keys();
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t h = 0; h < c.heads; ++h)
        for (std::int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
          for (std::int64_t e = 0; e < c.head_dim; ++e)
            paged.row(b, h, t)[e * paged.stride_dim] = dense.row(b, h, t)[e * dense.stride_dim];
    const auto back = make_view(c, reinterpret_cast<T*>(c.k_bytes.data()));
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t h = 0; h < c.heads; ++h)
        for (std::int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
          for (std::int64_t e = 0; e < c.head_dim; ++e)
            back.row(b, h, t)[e * back.stride_dim] = paged.row(b, h, t)[e * paged.stride_dim];
  });
  return p;
}

// cpu::plan over the paged keys (host tables), with the case's lists: one, or per request.
result cpu_plan_paged(const host_case& c, paged_case& p, std::int64_t window, fairkv::keep_plan& out) {
  return with_target(c, [&](auto target) { return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto pv = make_paged(p, reinterpret_cast<const T*>(p.k_pool.data()),
                               reinterpret_cast<const T*>(p.v_pool.data()), p.indptr.data(), p.indices.data(),
                               p.last_page_len.data());
    const auto in = make_ragged_inputs(c, pv.keys(), window, c.queries.data(), c.attention.data(),
                                       c.column_sums.data(), c.scores.empty() ? nullptr : c.scores.data(),
                                       c.local_column_sums.data());
    if (!c.targets.empty()) return fairkv::cpu::plan(pol, in, c.requests(), out);
    return fairkv::cpu::plan(pol, in, c.segments, c.whitelist, target, out);
  }); });
}

// cpu::plan over the case's own K as a padded batch: sequence b holds lengths[b] of its c.tokens slots.
result cpu_plan_padded(const host_case& c, const std::vector<std::int32_t>& lengths, std::int64_t window,
                       fairkv::keep_plan& out) {
  return with_target(c, [&](auto target) { return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    auto keys = make_view(c, reinterpret_cast<const T*>(c.k_bytes.data()));
    keys.lengths = lengths.data();
    const auto in = make_ragged_inputs(c, keys, window, c.queries.data(), c.attention.data(), c.column_sums.data(),
                                       c.scores.empty() ? nullptr : c.scores.data(), c.local_column_sums.data());
    if (!c.targets.empty()) return fairkv::cpu::plan(pol, in, c.requests(), out);
    return fairkv::cpu::plan(pol, in, c.segments, c.whitelist, target, out);
  }); });
}

result cpu_plan_requests(const host_case& c, fairkv::keep_plan& out) {
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto in = make_inputs<T>(c, reinterpret_cast<const T*>(c.k_bytes.data()), c.queries.data(),
                                   c.attention.data(), c.column_sums.data(),
                                   c.scores.empty() ? nullptr : c.scores.data(), c.local_column_sums.data());
    return fairkv::cpu::plan(pol, in, c.requests(), out);
  });
}

result cpu_plan(const host_case& c, fairkv::keep_plan& out) {
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto in = make_inputs<T>(c, reinterpret_cast<const T*>(c.k_bytes.data()), c.queries.data(),
                                   c.attention.data(), c.column_sums.data(),
                                   c.scores.empty() ? nullptr : c.scores.data(), c.local_column_sums.data());
    return with_target(c, [&](auto target) {
      return fairkv::cpu::plan(pol, in, c.segments, c.whitelist, target, out);
    });
  });
}

// `lengths`: K and V as a padded batch holding these lengths.
result cpu_compact(const host_case& c, const fairkv::keep_plan& plan, std::vector<unsigned char>& k,
                   std::vector<unsigned char>& v, const std::vector<std::int32_t>* lengths = nullptr) {
  return with_dtype(c.dtype, [&](auto tag) -> result {
    using T = decltype(tag);
    auto kv = make_view(c, reinterpret_cast<T*>(k.data()));
    auto vv = make_view(c, reinterpret_cast<T*>(v.data()));
    if (lengths != nullptr) kv.lengths = vv.lengths = lengths->data();
    return fairkv::cpu::compact(plan.view(), kv, vv);
  });
}

// Plans equal: same lengths, counts and kept indices.
bool same_plan(const fairkv::keep_plan& a, const fairkv::keep_plan& b, std::string& why) {
  if (a.batch() != b.batch() || a.heads() != b.heads()) return why = "extents differ", false;
  for (std::int64_t bb = 0; bb < a.batch(); ++bb) {
    if (a.length(bb) != b.length(bb)) return why = "length of sequence " + std::to_string(bb) + " differs", false;
    for (std::int64_t h = 0; h < a.heads(); ++h)
      if (a.kept(bb, h) != b.kept(bb, h)) {
        why = "kept set of (batch " + std::to_string(bb) + ", head " + std::to_string(h) + ") differs: count " +
              std::to_string(a.count(bb, h)) + " vs " + std::to_string(b.count(bb, h));
        return false;
      }
  }
  return true;
}

// Compacts copies of the case's K and V with `plan` on both backends: bit-identical bytes, including untouched
// slots and padding.
void check_compaction_parity(const host_case& c, const fairkv::keep_plan& plan,
                             const std::vector<std::int32_t>* lengths = nullptr) {
  std::vector<unsigned char> ck = c.k_bytes, cv = c.v_bytes, gk = c.k_bytes, gv = c.v_bytes;
  REQUIRE(cpu_compact(c, plan, ck, cv, lengths).ok());
  const result gc = gpu_compact(c, plan, gk, gv, lengths);
  REQUIRE_MESSAGE(gc.ok(), std::string(gc.message()));
  CHECK(ck == gk);
  CHECK(cv == gv);
}

// Plans an exact case (key or position scorer) on both backends, requires identical plans, then compacts with it.
// A case with per-request lists plans them in one call on each backend (graph: through a planner handle).
void check_exact_parity(const host_case& c, bool graph = false) {
  fairkv::keep_plan want, got;
  const bool requests = !c.targets.empty();
  const result cr = requests ? cpu_plan_requests(c, want) : cpu_plan(c, want);
  REQUIRE_MESSAGE(cr.ok(), std::string(cr.message()));
  const result gr = requests ? gpu_plan_requests(c, got, graph) : gpu_plan(c, got, graph);
  REQUIRE_MESSAGE(gr.ok(), std::string(gr.message()));
  std::string why;
  CHECK_MESSAGE(same_plan(want, got, why), why);
  check_compaction_parity(c, want);
}

// Runs an attention case on both backends. Dot products and exp differ from Eigen/libm in the last bits, so the
// plans may differ by a few swaps of near-tied tokens (returns false); anything else fails. True: identical plans.
// Attention plans of two backends (or two key layouts): true when identical; otherwise the counts must match
// exactly (budgets are integer arithmetic) and only near-tie swaps are allowed.
bool same_but_near_ties(const fairkv::keep_plan& want, const fairkv::keep_plan& got) {
  std::string why;
  if (same_plan(want, got, why)) return true;
  for (std::int64_t b = 0; b < want.batch(); ++b)
    for (std::int64_t h = 0; h < want.heads(); ++h) {
      CHECK(want.count(b, h) == got.count(b, h));
      const auto x = want.kept(b, h), y = got.kept(b, h);
      std::vector<std::int32_t> diff;
      std::set_symmetric_difference(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(diff));
      CHECK_MESSAGE(diff.size() <= 4u + x.size() / 50u, why);
    }
  return false;
}

bool attention_parity(const host_case& c) {
  fairkv::keep_plan want, got;
  const bool requests = !c.targets.empty();
  const result cr = requests ? cpu_plan_requests(c, want) : cpu_plan(c, want);
  REQUIRE_MESSAGE(cr.ok(), std::string(cr.message()));
  const result gr = requests ? gpu_plan_requests(c, got) : gpu_plan(c, got);
  REQUIRE_MESSAGE(gr.ok(), std::string(gr.message()));
  return same_but_near_ties(want, got);
}

// A random valid plan (ascending subsets) of `capacity` slots for compaction tests.
fairkv::keep_plan random_plan(std::mt19937& rng, std::int64_t batch, std::int64_t heads,
                              const std::vector<std::int64_t>& lengths, std::int64_t capacity) {
  fairkv::keep_plan p;
  p.resize(batch, heads, capacity);
  const fairkv::keep_plan_view v = p.view();
  for (std::int64_t b = 0; b < batch; ++b) {
    v.lengths[b] = static_cast<std::int32_t>(lengths[static_cast<std::size_t>(b)]);
    for (std::int64_t h = 0; h < heads; ++h) {
      const unsigned keep_pct = rng() % 101;
      const std::int64_t prefix = rng() % 3 == 0 ? static_cast<std::int64_t>(rng() % (lengths[b] + 1)) : 0;
      std::int32_t n = 0;
      for (std::int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
        if (t < prefix || rng() % 100 < keep_pct) v.row(b, h)[n++] = static_cast<std::int32_t>(t);
      v.counts[b * heads + h] = n;
    }
  }
  return p;
}

const scorer_id exact_scorers[] = {scorer_id::first_element, scorer_id::knorm, scorer_id::streaming_llm,
                                   scorer_id::external, scorer_id::random};
const scorer_id attention_scorers[] = {scorer_id::snapkv, scorer_id::tova, scorer_id::h2o};
// Scorers compiled for float keys only (parity_case.hpp's with_policy).
[[nodiscard]] bool float_keys_only(scorer_id s) {
  return is_attention(s) || s == scorer_id::streaming_llm || s == scorer_id::external || s == scorer_id::random;
}
const selector_id all_selectors[] = {selector_id::per_head, selector_id::union_heads, selector_id::head_adaptive};
const allocator_id all_allocators[] = {allocator_id::uniform,    allocator_id::whitelist,
                                       allocator_id::fair,       allocator_id::fair_with_whitelist,
                                       allocator_id::fair_paper, allocator_id::prioritized};
const dtype_id all_dtypes[] = {dtype_id::f32, dtype_id::f16, dtype_id::bf16};

// The type names of the parts a case's ids compile to (with_policy), so coverage is checked against the types
// themselves rather than a second spelling of the names.
struct part_names {
  std::string scorer, selector, allocator;
};
part_names names_of(scorer_id s, selector_id sel, allocator_id a) {
  host_case c;
  c.scorer = s;
  c.selector = sel;
  c.allocator = a;
  part_names n;
  (void)with_policy(c, [&](const auto& pol, auto) -> result {
    n = {pol.scorer.name, pol.selector.name, pol.allocator.name};
    return {};
  });
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
TEST_SUITE("cuda_host") {
  TEST_CASE("cuda host checks: the parity cases cover every built-in of fairkv's registry") {
    std::set<std::string> scorers, selectors, allocators;
    for (const scorer_id s : exact_scorers)
      scorers.insert(names_of(s, selector_id::per_head, allocator_id::uniform).scorer);
    for (const scorer_id s : attention_scorers)
      scorers.insert(names_of(s, selector_id::per_head, allocator_id::uniform).scorer);
    for (const selector_id sel : all_selectors)
      selectors.insert(names_of(scorer_id::knorm, sel, allocator_id::uniform).selector);
    for (const allocator_id a : all_allocators)
      allocators.insert(names_of(scorer_id::knorm, selector_id::per_head, a).allocator);
    for (const auto& e : fairkv::registry::builtin_scorers)
      CHECK_MESSAGE(scorers.count(std::string(e.name)) == 1, "scorer ", e.name, " has no parity case");
    for (const auto& e : fairkv::registry::builtin_selectors)
      CHECK_MESSAGE(selectors.count(std::string(e.name)) == 1, "selector ", e.name, " has no parity case");
    // debias is the one built-in the CUDA backend refuses (not_supported, "the CUDA backend's limits" below).
    for (const auto& e : fairkv::registry::builtin_allocators)
      CHECK_MESSAGE((allocators.count(std::string(e.name)) == 1) != (e.kind == fairkv::allocator_kind::debias),
                    "allocator ", e.name, " has no parity case");
  }

  TEST_CASE("cuda host checks: invalid inputs are rejected with the CPU oracle's status and message") {
    std::mt19937 rng(7);
    struct mutation {
      const char* what;
      void (*apply)(host_case&);
    };
    const mutation mutations[] = {
        {"ratio 1", [](host_case& c) { c.ratio = 1.0; }},
        {"ratio -0.1", [](host_case& c) { c.ratio = -0.1; }},
        {"ratio NaN", [](host_case& c) { c.ratio = std::nan(""); }},
        {"segment out of range", [](host_case& c) { c.segments = {{0, static_cast<std::int32_t>(c.tokens + 1)}}; }},
        {"empty segment", [](host_case& c) { c.segments = {{3, 3}}; }},
        {"overlapping segments", [](host_case& c) { c.segments = {{0, 10}, {5, 20}}; }},
        {"whitelist out of range", [](host_case& c) { c.whitelist = {0, static_cast<std::int32_t>(c.tokens)}; }},
        {"negative whitelist", [](host_case& c) { c.whitelist = {-1}; }},
        {"whitelist over budget", [](host_case& c) {
           c.ratio = 0.9;
           c.whitelist.clear();
           for (std::int32_t t = 0; t < 20; ++t) c.whitelist.push_back(t);
         }},
        {"segments without fair", [](host_case& c) {
           c.allocator = allocator_id::whitelist;
           c.segments = {{0, 4}};
         }},
        {"whitelist with fair", [](host_case& c) {
           c.allocator = allocator_id::fair;
           c.segments.clear();
           c.whitelist = {1};
         }},
        {"alpha outside [0, 1]", [](host_case& c) {
           c.selector = selector_id::head_adaptive;
           c.alpha = 1.5f;
         }},
        {"snapkv window 0", [](host_case& c) {
           c.scorer = scorer_id::snapkv;
           c.window = 0;
         }},
        {"snapkv without queries", [](host_case& c) {
           c.scorer = scorer_id::snapkv;
           std::vector<float>().swap(c.queries);
           c.attn = attention_input::rows;
           std::vector<float>().swap(c.attention);
         }},
        {"GQA heads do not divide", [](host_case& c) {
           c.scorer = scorer_id::tova;
           c.q_heads = c.heads * 2 + 1;
           c.queries.assign(static_cast<std::size_t>(c.batch * c.q_heads * c.q_tokens * c.head_dim), 0.5f);
         }},
        {"queries longer than the cache", [](host_case& c) {
           c.scorer = scorer_id::snapkv;
           c.q_tokens = c.tokens + 1;
           c.queries.assign(static_cast<std::size_t>(c.batch * c.q_heads * c.q_tokens * c.head_dim), 0.5f);
         }},
        {"queries do not cover a segment's window", [](host_case& c) {
           c.scorer = scorer_id::snapkv;
           c.segments = {{0, 10}};
           c.whitelist.clear();
           c.q_tokens = 16;
           c.queries.assign(static_cast<std::size_t>(c.batch * c.q_heads * c.q_tokens * c.head_dim), 0.5f);
         }},
        {"segment-local H2O from column sums", [](host_case& c) {
           c.scorer = scorer_id::h2o;
           c.attn = attention_input::column_sums;
         }},
        {"zero heads", [](host_case& c) { c.heads = 0; }},
        {"fair_paper with segments that do not touch", [](host_case& c) {
           c.allocator = allocator_id::fair_paper;
           c.segments = {{20, 30}, {0, 10}};
         }},
        {"fair_paper SnapKV: queries do not cover the earlier span's window", [](host_case& c) {
           c.allocator = allocator_id::fair_paper;
           c.scorer = scorer_id::snapkv;
           c.window = 16;
           c.segments = {{32, 50}, {10, 32}};  // widened [0, 32) and [32, 64): windows [24, 32) and [56, 64)
           c.q_tokens = 36;
           c.queries.assign(static_cast<std::size_t>(c.batch * c.q_heads * c.q_tokens * c.head_dim), 0.5f);
         }},
        {"external without scores", [](host_case& c) { c.scorer = scorer_id::external; }},
        {"external scores shorter than the cache", [](host_case& c) {
           c.scorer = scorer_id::external;
           c.score_tokens = c.tokens - 1;
           c.scores.assign(static_cast<std::size_t>(c.batch * c.heads * c.score_tokens), 1.f);
         }},
        {"external scores with fair_paper", [](host_case& c) {
           c.scorer = scorer_id::external;
           c.allocator = allocator_id::fair_paper;
           c.segments = {{0, 10}, {10, 64}};
           c.scores.assign(static_cast<std::size_t>(c.batch * c.heads * c.tokens), 1.f);
         }},
        {"fair_paper H2O from column sums", [](host_case& c) {
           c.allocator = allocator_id::fair_paper;
           c.scorer = scorer_id::h2o;
           c.segments = {{0, 10}, {10, 64}};
           c.attn = attention_input::column_sums;
         }},
    };
    for (const mutation& m : mutations) {
      host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::fair_with_whitelist,
                                dtype_id::f32);
      // a fixed, mid-sized case so each mutation is meaningful
      c.batch = 1;
      c.heads = 2;
      c.q_heads = 4;
      c.tokens = 64;
      c.q_tokens = 64;
      c.head_dim = 8;
      c.capacity = 64;
      c.layout = layout_id::contiguous;
      c.ratio = 0.5;
      c.segments.clear();
      c.whitelist.clear();
      c.attn = attention_input::queries;
      c.k_bytes.assign(static_cast<std::size_t>(64 * 2 * 8 * 4), 0);
      for (std::size_t i = 0; i < c.k_bytes.size(); i += 4) {
        const float x = static_cast<float>(i % 29) - 14.f;
        std::memcpy(&c.k_bytes[i], &x, 4);
      }
      c.queries.assign(static_cast<std::size_t>(1 * 4 * 64 * 8), 0.25f);
      c.attention.assign(static_cast<std::size_t>(4 * 64 * 64), 1.0f / 64);
      c.column_sums.assign(static_cast<std::size_t>(4 * 64), 1.0f);
      m.apply(c);
      CAPTURE(m.what);
      fairkv::keep_plan cp;
      const result want = cpu_plan(c, cp);
      const result got = gpu_can_implement(c);
      REQUIRE_FALSE(want.ok());
      CHECK(got.code() == want.code());
      CHECK(std::string(got.message()) == std::string(want.message()));
    }
  }

  TEST_CASE("cuda host checks: valid random cases are implementable and the size query is consistent") {
    std::mt19937 rng(11);
    int n = 0;
    for (const scorer_id s : {scorer_id::first_element, scorer_id::knorm, scorer_id::streaming_llm, scorer_id::snapkv,
                              scorer_id::tova, scorer_id::h2o, scorer_id::external})
      for (const selector_id sel : all_selectors)
        for (const allocator_id a : all_allocators) {
          if (s == scorer_id::external && a == allocator_id::fair_paper) continue;  // refused (mutations above)
          const dtype_id d = float_keys_only(s) ? dtype_id::f32 : all_dtypes[rng() % 3];
          const host_case c = random_case(rng, s, sel, a, d);
          CAPTURE(c.name);
          fairkv::keep_plan cp;
          const result want = cpu_plan(c, cp);
          REQUIRE_MESSAGE(want.ok(), std::string(want.message()));
          const result got = gpu_can_implement(c);
          CHECK_MESSAGE(got.ok(), std::string(got.message()));
          const result handle = gpu_planner_can_implement(c);
          CHECK_MESSAGE(handle.ok(), std::string(handle.message()));
          std::size_t bytes = 0;
          CHECK(gpu_size_query(c, bytes).ok());
          CHECK(bytes >= static_cast<std::size_t>(c.batch * c.heads * c.tokens) * 4u);  // at least the scores
          ++n;
        }
    CHECK(n == 6 * 3 * 6 + 3 * 5);
  }

  TEST_CASE("cuda planner: can_implement refuses as the free function and the CPU oracle do") {
    std::mt19937 rng(5);
    const host_case base =
        random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::fair_with_whitelist, dtype_id::f32);
    struct refusal {
      const char* what;
      void (*apply)(host_case&);
      status code;
      const char* needle;
      bool cpu_accepts;  // a limit of the CUDA backend only
    };
    const refusal refusals[] = {
        {"ratio", [](host_case& c) { c.ratio = 1.5; }, status::invalid_argument, "ratio = 1.5", false},
        {"whitelist", [](host_case& c) { c.whitelist = {static_cast<std::int32_t>(c.tokens)}; }, status::out_of_range,
         "whitelist[0]", false},
        {"segments overlap", [](host_case& c) { c.segments = {{0, 4}, {2, 6}}; }, status::overlapping_segments,
         "overlaps", false},
        {"too many segments",
         [](host_case& c) {
           c.tokens = c.q_tokens = c.capacity = 200;
           c.k_bytes.assign(static_cast<std::size_t>(storage_elements(c) * 4), 0);
           c.whitelist.clear();
           c.segments.clear();
           for (std::int32_t i = 0; i < cuda_max_segments() + 1; ++i) c.segments.push_back({2 * i, 2 * i + 1});
         },
         status::not_supported, "at most 31", true},
    };
    for (const refusal& r : refusals) {
      CAPTURE(r.what);
      host_case c = base;
      r.apply(c);
      const result handle = gpu_planner_can_implement(c);
      const result free_fn = gpu_can_implement(c);
      CHECK(handle.code() == r.code);
      CHECK(std::string(handle.message()).find(r.needle) != std::string::npos);
      CHECK(std::string(handle.message()) == std::string(free_fn.message()));
      fairkv::keep_plan cp;
      const result cpu = cpu_plan(c, cp);
      if (r.cpu_accepts) {
        CHECK(cpu.ok());
      } else {
        CHECK(cpu.code() == r.code);
        CHECK(std::string(cpu.message()) == std::string(handle.message()));
      }
    }
  }

  TEST_CASE("cuda host checks: token budgets are refused as the CPU refuses them, same status and message") {
    std::mt19937 rng(14);
    struct refusal {
      const char* what;
      void (*apply)(host_case&);
      status code;
    };
    const refusal refusals[] = {
        {"budget 0", [](host_case& c) { c.target = fairkv::keep_target::of_tokens(0); }, status::invalid_argument},
        {"negative budget", [](host_case& c) { c.target = fairkv::keep_target::of_tokens(-4); },
         status::invalid_argument},
        {"ratio and budget together",
         [](host_case& c) {
           fairkv::keep_target t = fairkv::keep_target::of_tokens(8);
           t.ratio = 0.25;
           c.target = t;
         },
         status::invalid_argument},
        {"whitelist over the budget",
         [](host_case& c) {
           c.target = fairkv::keep_target::of_tokens(8);
           c.whitelist.clear();
           for (std::int32_t t = 0; t < 10; ++t) c.whitelist.push_back(3 * t);
         },
         status::budget_exceeded},
        {"boundary tokens over the budget",
         [](host_case& c) {
           c.target = fairkv::keep_target::of_tokens(5);
           c.whitelist = {40};
           c.protect.boundary = 2;
           c.segments = {{0, 10}, {20, 30}};
         },
         status::budget_exceeded},
    };
    for (const refusal& r : refusals) {
      CAPTURE(r.what);
      host_case c =
          random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::fair_with_whitelist, dtype_id::f32);
      while (c.tokens < 64)
        c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::fair_with_whitelist, dtype_id::f32);
      c.segments.clear();
      c.whitelist.clear();
      c.protect = {};
      r.apply(c);
      fairkv::keep_plan cp;
      const result want = cpu_plan(c, cp);
      REQUIRE(want.code() == r.code);
      for (const result& got : {gpu_can_implement(c), gpu_planner_can_implement(c)}) {
        CHECK(got.code() == want.code());
        CHECK(std::string(got.message()) == std::string(want.message()));
      }
      // The size query validates the target but, like the CPU's, not the budget's room for forced tokens.
      std::size_t bytes = 0, cpu_bytes = 0;
      const result size = gpu_size_query(c, bytes);
      const result cpu_size = with_policy(c, [&](const auto& pol, auto tag) -> result {
        using T = decltype(tag);
        const auto in = make_inputs<T>(c, reinterpret_cast<const T*>(c.k_bytes.data()), nullptr, nullptr, nullptr);
        return fairkv::cpu::plan(nullptr, cpu_bytes, pol, in, c.segments, c.whitelist, *c.target,
                                 fairkv::keep_plan_view{});
      });
      CHECK(size.code() == cpu_size.code());
      CHECK(std::string(size.message()) == std::string(cpu_size.message()));
    }
    // The budget_exceeded message names the budget in tokens.
    host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::whitelist, dtype_id::f32);
    while (c.tokens < 20)
      c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::whitelist, dtype_id::f32);
    c.target = fairkv::keep_target::of_tokens(8);
    c.whitelist = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    const result r = gpu_can_implement(c);
    CHECK(r.code() == status::budget_exceeded);
    CHECK(std::string(r.message()) == "the whitelist holds 10 distinct positions but sequence 0 keeps only 8 of its " +
                                          std::to_string(c.tokens) + " tokens at a budget of 8 tokens");
  }

  TEST_CASE("cuda host checks: per-request lists are refused as the CPU refuses them, naming the sequence") {
    std::mt19937 rng(11);
    host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::fair_with_whitelist,
                              dtype_id::f32, 3);
    c.tokens = c.q_tokens = c.capacity = 120;
    c.layout = layout_id::contiguous;
    c.protect = {};
    c.k_bytes.assign(static_cast<std::size_t>(storage_elements(c) * 4), 0);
    c.segments = {{0, 10}, {10, 40}, {5, 30}, {0, 120}};
    c.seg_indptr = {0, 2, 3, 4};
    c.whitelist = {3, 7, 119};
    c.wl_indptr = {0, 1, 1, 3};
    c.targets = {fairkv::keep_target::of_ratio(0.5), fairkv::keep_target::of_tokens(7),
                 fairkv::keep_target::of_ratio(0.2)};
    fairkv::keep_plan cp;
    REQUIRE(cpu_plan_requests(c, cp).ok());
    CHECK(gpu_can_implement_requests(c).ok());
    auto same_refusal = [&](const host_case& bad, const char* names) {
      fairkv::keep_plan out;
      const result want = cpu_plan_requests(bad, out), got = gpu_can_implement_requests(bad);
      CAPTURE(want.message());
      CHECK_FALSE(want.ok());
      CHECK(got.code() == want.code());
      CHECK(std::string(got.message()) == std::string(want.message()));
      CHECK(std::string(got.message()).find(names) != std::string::npos);
    };
    host_case bad = c;
    bad.segments[2] = {100, 130};  // sequence 1's segment leaves the sequence
    same_refusal(bad, "sequence 1");
    bad = c;
    bad.targets.pop_back();  // two targets for three sequences
    same_refusal(bad, "3");
    bad = c;
    bad.seg_indptr.back() = 3;
    same_refusal(bad, "seg_indptr");
    bad = c;
    bad.targets[2] = fairkv::keep_target::of_tokens(0);
    same_refusal(bad, "sequence 2");
    bad = c;
    bad.targets.clear();
    bad.targets.push_back(fairkv::keep_target::of_tokens(2));  // sequence 2's whitelist of 2 fits, the plan does
    CHECK(gpu_can_implement_requests(bad).ok() == cpu_plan_requests(bad, cp).ok());
    // This backend's own limit names the sequence too: 32 segments in sequence 2, where the CPU plans them.
    bad = c;
    bad.segments.resize(3);
    for (std::int32_t i = 0; i < cuda_max_segments() + 1; ++i) bad.segments.push_back({3 * i, 3 * i + 2});
    bad.seg_indptr = {0, 2, 3, static_cast<std::int32_t>(bad.segments.size())};
    REQUIRE(cpu_plan_requests(bad, cp).ok());
    const result limit = gpu_can_implement_requests(bad);
    CHECK(limit.code() == status::not_supported);
    CHECK(std::string(limit.message()).rfind("sequence 2: ", 0) == 0);
  }

  TEST_CASE("cuda host checks: the CUDA backend's limits are reported, not silently exceeded") {
    std::mt19937 rng(3);
    host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::fair, dtype_id::f32);
    c.tokens = 200;
    c.q_tokens = 200;
    c.capacity = 200;
    c.layout = layout_id::contiguous;
    c.ratio = 0.5;
    c.k_bytes.assign(static_cast<std::size_t>(storage_elements(c) * 4), 0);
    c.segments.clear();
    for (std::int32_t i = 0; i < cuda_max_segments() + 1; ++i) c.segments.push_back({2 * i, 2 * i + 1});
    fairkv::keep_plan cp;
    REQUIRE(cpu_plan(c, cp).ok());  // valid for the CPU oracle
    const result r = gpu_can_implement(c);
    CHECK(r.code() == status::not_supported);
    CHECK(std::string(r.message()).find("at most") != std::string::npos);
    c.segments.clear();
    // A whitelist longer than the kernel-argument capacity is refused, even where the CPU accepts it.
    c.allocator = allocator_id::fair_with_whitelist;
    c.tokens = c.q_tokens = c.capacity = 3000;
    c.ratio = 0.1;
    c.k_bytes.assign(static_cast<std::size_t>(storage_elements(c) * 4), 0);
    for (std::int32_t t = 0; t < 1100; ++t) c.whitelist.push_back(t);
    REQUIRE(cpu_plan(c, cp).ok());
    const result w = gpu_can_implement(c);
    CHECK(w.code() == status::not_supported);
    CHECK(std::string(w.message()).find("1024") != std::string::npos);
    c.whitelist.clear();
    const result d = gpu_plan_cpu_only(c);
    CHECK(d.code() == status::not_supported);
    CHECK(std::string(d.message()).find("debias") != std::string::npos);
    // fair_paper is implemented: accepted on the host and, where a device (or the emulator) runs it, the CPU's plan.
    c.allocator = allocator_id::fair_paper;
    c.segments = {{100, 3000}, {0, 100}};
    c.whitelist = {5, 150, 2999};
    REQUIRE(cpu_plan(c, cp).ok());
    const result pc = gpu_can_implement(c);
    CHECK_MESSAGE(pc.ok(), std::string(pc.message()));
    if (!no_device) {
      fairkv::keep_plan got;
      const result pr = gpu_plan(c, got);
      REQUIRE_MESSAGE(pr.ok(), std::string(pr.message()));
      std::string why;
      CHECK_MESSAGE(same_plan(cp, got, why), why);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
TEST_SUITE("cuda_parity") {
  TEST_CASE("cuda parity: device probe") {
    if (no_device) {
      std::printf("SKIPPED: no CUDA device (%s); the CPU-vs-GPU parity cases did not run\n",
                  probe_device().description.c_str());
      MESSAGE("SKIPPED: no CUDA device (" << probe_device().description << ")");
    } else {
      MESSAGE("CUDA device: " << probe_device().description);
    }
  }

  TEST_CASE("cuda parity: exact scorers, every selector, allocator and dtype" * doctest::skip(no_device)) {
    std::mt19937 rng(2024);
    int cases = 0, paper = 0;
    for (int rep = 0; rep < (quick ? 1 : 3); ++rep)
      for (const scorer_id s : exact_scorers)
        for (const selector_id sel : all_selectors)
          for (const allocator_id a : all_allocators)
            for (const dtype_id d : all_dtypes) {
              if (float_keys_only(s) && d != dtype_id::f32) continue;
              if (s == scorer_id::external && a == allocator_id::fair_paper) continue;  // refused (cuda_host)
              const host_case c = random_case(rng, s, sel, a, d);
              CAPTURE(c.name);
              check_exact_parity(c, rep == 2 || (quick && cases % 5 == 0));
              ++cases;
              paper += a == allocator_id::fair_paper ? 1 : 0;
            }
    MESSAGE(cases << " exact parity cases (" << paper << " fair_paper)");
  }

  TEST_CASE("cuda parity: token budgets, the CPU's plans bit for bit" * doctest::skip(no_device)) {
    std::mt19937 rng(1404);
    int cases = 0, attention = 0, attention_exact = 0;
    for (const scorer_id s : exact_scorers)
      for (const selector_id sel : all_selectors)
        for (const allocator_id a : all_allocators) {
          if (s == scorer_id::external && a == allocator_id::fair_paper) continue;  // refused (cuda_host)
          const dtype_id d = float_keys_only(s) ? dtype_id::f32 : all_dtypes[rng() % 3];
          host_case c;
          do c = random_case(rng, s, sel, a, d);
          while (c.tokens > (quick ? 600 : 1500));
          use_token_budget(rng, c);
          CAPTURE(c.name);
          check_exact_parity(c, cases % 7 == 0);
          fairkv::keep_plan got;  // the CPU's, which the GPU's equals
          REQUIRE(cpu_plan(c, got).ok());
          const std::int64_t kept = std::min(c.target->tokens, c.tokens);
          for (std::int64_t b = 0; b < c.batch; ++b) {
            std::int64_t total = 0;
            for (std::int64_t h = 0; h < c.heads; ++h) {
              total += got.count(b, h);
              if (sel != selector_id::head_adaptive) CHECK(got.count(b, h) == kept);
            }
            CHECK(total == c.heads * kept);
          }
          ++cases;
        }
    // Attention scorers (SnapKV, TOVA, H2O) at a token budget: near-ties aside, the same plans.
    for (const scorer_id s : {scorer_id::snapkv, scorer_id::tova, scorer_id::h2o})
      for (const allocator_id a : all_allocators) {
        host_case c = random_case(rng, s, all_selectors[rng() % 3], a, dtype_id::f32);
        use_token_budget(rng, c);
        CAPTURE(c.name);
        attention_exact += attention_parity(c) ? 1 : 0;
        ++attention;
      }
    MESSAGE(cases << " exact token-budget cases; " << attention << " attention cases, " << attention_exact
                  << " bit-identical");
    const auto combinations = std::size(exact_scorers) * std::size(all_selectors) * std::size(all_allocators);
    CHECK(cases == static_cast<int>(combinations) - 3);  // external x fair_paper is refused, for every selector
    CHECK(attention_exact * 10 >= attention * 7);
  }

  TEST_CASE("cuda parity: per-request segments, whitelists and targets in one launch sequence" *
            doctest::skip(no_device)) {
    std::mt19937 rng(3607);
    int cases = 0, attention = 0, attention_exact = 0, shared = 0;
    for (int rep = 0; rep < (quick ? 1 : 2); ++rep)
      for (const scorer_id s : {scorer_id::knorm, scorer_id::streaming_llm, scorer_id::external, scorer_id::snapkv,
                                scorer_id::tova, scorer_id::h2o})
        for (const selector_id sel : all_selectors)
          for (const allocator_id a : all_allocators) {
            if (a == allocator_id::debias) continue;  // the CUDA backend refuses it (cuda_host)
            if (s == scorer_id::external && a == allocator_id::fair_paper) continue;
            const bool attn = is_attention(s);
            const dtype_id d = float_keys_only(s) || attn ? dtype_id::f32 : all_dtypes[rng() % 3];
            host_case c;
            do c = random_case(rng, s, sel, a, d, 2 + static_cast<std::int64_t>(rng() % 3));
            while (c.tokens > (quick ? 600 : 1500) || (a == allocator_id::fair_paper && c.tokens < 3));
            use_requests(rng, c);
            CAPTURE(c.name);
            ++cases;
            shared += c.targets.size() == 1 ? 1 : 0;
            if (!attn) {
              check_exact_parity(c, cases % 3 == 0);
            } else {
              ++attention;
              attention_exact += attention_parity(c) ? 1 : 0;
            }
          }
    MESSAGE(cases << " request batches of 2-4 sequences (" << shared << " with one target for all), " << attention
                  << " attention, " << attention_exact << " of them bit-identical");
    CHECK(attention_exact * 10 >= attention * 8);
  }

  TEST_CASE("cuda parity: ragged batches, paged (NHD and HND) and padded, one list or per-request lists" *
            doctest::skip(no_device)) {
    std::mt19937 rng(5309);
    int cases = 0, attention = 0, attention_exact = 0, requests = 0, idle = 0;
    for (int rep = 0; rep < (quick ? 1 : 2); ++rep)
      for (const scorer_id s : {scorer_id::knorm, scorer_id::streaming_llm, scorer_id::external, scorer_id::snapkv,
                                scorer_id::tova, scorer_id::h2o})
        for (const selector_id sel : all_selectors)
          for (const allocator_id a : all_allocators) {
            const bool attn = is_attention(s);
            if (a == allocator_id::debias || (s == scorer_id::external && a == allocator_id::fair_paper)) continue;
            // Attention over a ragged batch: the window's rows are the last of each sequence, so scoring that needs
            // rows inside the sequence (segment-local SnapKV / TOVA, fair_paper) is left to the dense suites;
            // segment-local H2O reads the renormalised column sums.
            if (attn && (a == allocator_id::fair_paper || (uses_segments(a) && s != scorer_id::h2o))) continue;
            const dtype_id d = float_keys_only(s) || attn ? dtype_id::f32 : all_dtypes[rng() % 3];
            host_case c;
            do c = random_case(rng, s, sel, a, d, 1 + static_cast<std::int64_t>(rng() % 4));
            while (c.tokens < 3 || c.tokens > (quick ? 600 : 1500));
            // SnapKV's window and TOVA's last row must lie in the queries every sequence shares: at least one
            // window long.
            const std::int64_t floor =
                attn ? std::min<std::int64_t>(c.tokens, c.window + 1) : (a == allocator_id::fair_paper ? 2 : 1);
            std::vector<std::int32_t> lengths;
            for (std::int64_t b = 0; b < c.batch; ++b)
              lengths.push_back(static_cast<std::int32_t>(floor + rng() % static_cast<unsigned>(c.tokens - floor + 1)));
            const std::size_t longest = rng() % lengths.size();
            lengths[longest] = static_cast<std::int32_t>(c.tokens);  // the longest fills the plan
            // An idle slot (no tokens), sometimes: it plans to nothing and takes no lists.
            if (c.batch >= 2 && a != allocator_id::fair_paper && rng() % 4 == 0) {
              lengths[(longest + 1 + rng() % static_cast<unsigned>(c.batch - 1)) % lengths.size()] = 0;
              ++idle;
            }
            std::int32_t shortest = static_cast<std::int32_t>(c.tokens);  // of the sequences with tokens
            for (const std::int32_t L : lengths)
              if (L > 0) shortest = std::min(shortest, L);
            c.target.reset();
            if (rng() % 2 == 0) {
              use_requests(rng, c, lengths);
              ++requests;
            } else {  // one list, within the shortest sequence
              c.segments = random_segments(rng, a, shortest);
              c.whitelist = uses_whitelist(a) ? random_whitelist(rng, shortest, fairkv::keep_budget(shortest, c.ratio))
                                              : std::vector<std::int32_t>{};
              std::int64_t hard = static_cast<std::int64_t>(std::set<std::int32_t>(c.whitelist.begin(), c.whitelist.end()).size());
              for (const fairkv::segment& g : c.segments) hard += std::min<std::int64_t>(g.size(), 2 * c.protect.boundary);
              if (hard > fairkv::keep_budget(shortest, c.ratio) || hard > 1000) c.protect.boundary = 0;
              if (a == allocator_id::prioritized) {
                c.priorities.clear();
                c.remainder_priority = {};
              }
            }
            // H2O's rows span the whole sequence: it reads column sums here (renormalised to the regions of
            // random_case's list, numbers both backends read alike).
            if (s == scorer_id::h2o)
              c.attn = uses_segments(a) ? attention_input::local_column_sums : attention_input::column_sums;
            paged_case p = paginate(rng, c, lengths);
            const std::int64_t window = attn ? shortest : 1 + static_cast<std::int64_t>(rng() % static_cast<unsigned>(shortest));
            CAPTURE(c.name);
            CAPTURE(window);
            // The same batch twice: paged, and the case's own K as a padded kv_view (its c.tokens slots per
            // sequence, lengths in device memory).
            fairkv::keep_plan want, got, want_padded, got_padded;
            const result cr = cpu_plan_paged(c, p, window, want);
            REQUIRE_MESSAGE(cr.ok(), std::string(cr.message()));
            const result cp = cpu_plan_padded(c, lengths, window, want_padded);
            REQUIRE_MESSAGE(cp.ok(), std::string(cp.message()));
            result verdict, padded_verdict;
            const result gr = gpu_plan_paged(c, p, lengths, window, got, verdict);
            REQUIRE_MESSAGE(gr.ok(), std::string(gr.message()));
            REQUIRE_MESSAGE(verdict.ok(), std::string(verdict.message()));
            const result gp = gpu_plan_padded(c, lengths, lengths, window, got_padded, padded_verdict);
            REQUIRE_MESSAGE(gp.ok(), std::string(gp.message()));
            REQUIRE_MESSAGE(padded_verdict.ok(), std::string(padded_verdict.message()));
            ++cases;
            if (!attn) {
              std::string why;
              CHECK_MESSAGE(same_plan(want, got, why), why);
              CHECK_MESSAGE(same_plan(want, want_padded, why), why);
              CHECK_MESSAGE(same_plan(want, got_padded, why), why);
              if (cases % 3 == 0) check_compaction_parity(c, want_padded, &lengths);
              continue;
            }
            attention += 2;
            attention_exact += same_but_near_ties(want, got) ? 1 : 0;
            attention_exact += same_but_near_ties(want_padded, got_padded) ? 1 : 0;
            same_but_near_ties(want, want_padded);  // one backend, two layouts of the same keys
          }
    CHECK(idle > 10);
    MESSAGE(cases << " ragged batches, paged and padded (" << requests << " with per-request lists, " << idle
                  << " with an empty sequence), " << attention
                  << " attention plans, " << attention_exact << " of them bit-identical");
    CHECK(attention_exact * 10 >= attention * 8);
  }

  TEST_CASE("cuda parity: paged keys whose table disagrees with the host's lengths are reported, not read" *
            doctest::skip(no_device)) {
    std::mt19937 rng(8);
    host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::uniform, dtype_id::f32, 3);
    while (c.tokens < 8) c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::uniform, dtype_id::f32, 3);
    c.target.reset();
    const std::vector<std::int32_t> lengths = {static_cast<std::int32_t>(c.tokens), 5, 7};
    const paged_case good = paginate(rng, c, lengths);
    fairkv::keep_plan got;
    result verdict;
    REQUIRE(gpu_plan_paged(c, good, lengths, 1, got, verdict).ok());
    CHECK_MESSAGE(verdict.ok(), std::string(verdict.message()));
    // The host says sequence 2 has 6 tokens, its table 7.
    std::vector<std::int32_t> wrong = lengths;
    wrong[2] = 6;
    REQUIRE(gpu_plan_paged(c, good, wrong, 1, got, verdict).ok());
    CHECK(verdict.code() == status::invalid_argument);
    const std::string mismatch =
        "inputs.keys: sequence 2 has 7 tokens in device memory (its page table, or inputs.keys.lengths) but "
        "lengths[2] = 6";
    CHECK(std::string(verdict.message()) == mismatch);
    // A page id outside the pool: reported, and no kernel reads through it (a real device would fault).
    paged_case bad = good;
    bad.indices[1] = static_cast<std::int32_t>(bad.num_pages + 1000000);
    REQUIRE(gpu_plan_paged(c, bad, lengths, 1, got, verdict).ok());
    CHECK(verdict.code() == status::out_of_range);
    CHECK(std::string(verdict.message()).find("inputs.keys.indices[1]") != std::string::npos);
    // Host-side refusals: no lengths for paged keys, a zero length.
    const result missing = gpu_plan_paged(c, good, {}, 1, got, verdict);
    CHECK(missing.code() == status::invalid_argument);
    CHECK(std::string(missing.message()).find("host copy of every sequence's length") != std::string::npos);
    // The host says sequence 1 is empty, its table holds 5 tokens: an empty sequence is planned (to nothing), so
    // the device reports the disagreement; a batch with nothing in it is refused.
    REQUIRE(gpu_plan_paged(c, good, {static_cast<std::int32_t>(c.tokens), 0, 7}, 1, got, verdict).ok());
    CHECK(std::string(verdict.message()) ==
          "inputs.keys: sequence 1 has 5 tokens in device memory (its page table, or inputs.keys.lengths) but "
          "lengths[1] = 0");
    const result empty = gpu_plan_paged(c, good, {0, 0, 0}, 1, got, verdict);
    CHECK(empty.code() == status::empty_cache);
    CHECK(std::string(empty.message()) == "all 3 sequences of inputs.keys are empty");
    // A padded kv_view: its device lengths against the host's, and the host's within the view.
    REQUIRE(gpu_plan_padded(c, lengths, lengths, 1, got, verdict).ok());
    CHECK_MESSAGE(verdict.ok(), std::string(verdict.message()));
    REQUIRE(gpu_plan_padded(c, lengths, wrong, 1, got, verdict).ok());
    CHECK(std::string(verdict.message()) == mismatch);
    const result no_host = gpu_plan_padded(c, lengths, {}, 1, got, verdict);
    CHECK(no_host.code() == status::invalid_argument);
    CHECK(std::string(no_host.message())
              .find("are padded (inputs.keys.lengths in device memory): give the host copy") != std::string::npos);
    std::vector<std::int32_t> past = lengths;
    past[1] = static_cast<std::int32_t>(c.tokens + 1);
    const result beyond = gpu_plan_padded(c, past, past, 1, got, verdict);
    CHECK(beyond.code() == status::invalid_shape);
    CHECK(std::string(beyond.message()).find("lengths[1] = " + std::to_string(c.tokens + 1) + " exceeds the " +
                                             std::to_string(c.tokens) + " token slots") != std::string::npos);
    const result unpadded = gpu_plan_with_lengths(c, lengths);
    CHECK(unpadded.code() == status::invalid_argument);
    CHECK(std::string(unpadded.message()).find("lengths were given for a kv_view without lengths") !=
          std::string::npos);
  }

  TEST_CASE("cuda parity: padded compaction checks the views' device lengths before moving a row" *
            doctest::skip(no_device)) {
    std::mt19937 rng(12);
    host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::uniform, dtype_id::f16, 3);
    while (c.tokens < 8)
      c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::uniform, dtype_id::f16, 3);
    c.target.reset();
    const std::vector<std::int32_t> lengths = {5, static_cast<std::int32_t>(c.tokens), 1};
    fairkv::keep_plan plan;
    REQUIRE(cpu_plan_padded(c, lengths, 1, plan).ok());
    check_compaction_parity(c, plan, &lengths);
    // Lengths past the view (which the host cannot read): reported, nothing written. Other lengths than the plan's:
    // the CPU's refusal.
    std::vector<std::int32_t> past = lengths;
    past[2] = static_cast<std::int32_t>(c.tokens + 3);
    std::vector<unsigned char> gk = c.k_bytes, gv = c.v_bytes;
    result r = gpu_compact(c, plan, gk, gv, &past);
    CHECK(r.code() == status::invalid_shape);
    CHECK(std::string(r.message()) == "view: lengths[2] = " + std::to_string(c.tokens + 3) + " is outside [0, tokens " +
                                          std::to_string(c.tokens) + "]");
    std::vector<std::int32_t> other = lengths;
    other[0] = 4;
    r = gpu_compact(c, plan, gk, gv, &other);
    CHECK(r.code() == status::invalid_plan);
    std::vector<unsigned char> ck = c.k_bytes, cv = c.v_bytes;
    CHECK(cpu_compact(c, plan, ck, cv, &other).code() == status::invalid_plan);
    CHECK(gk == c.k_bytes);
    CHECK(gv == c.v_bytes);
  }

  TEST_CASE("cuda parity: attention scorers (near-ties aside, the same plans)" * doctest::skip(no_device)) {
    std::mt19937 rng(99);
    int cases = 0, exact = 0, paper = 0, paper_exact = 0, local = 0;
    for (int rep = 0; rep < (quick ? 1 : 4); ++rep)
      for (const scorer_id s : attention_scorers)
        for (const selector_id sel : all_selectors)
          for (const allocator_id a : all_allocators) {
            const host_case c = random_case(rng, s, sel, a, dtype_id::f32);
            CAPTURE(c.name);
            const bool same = attention_parity(c);
            ++cases;
            exact += same ? 1 : 0;
            paper += a == allocator_id::fair_paper ? 1 : 0;
            paper_exact += same && a == allocator_id::fair_paper ? 1 : 0;
            local += c.attn == attention_input::local_column_sums ? 1 : 0;
          }
    MESSAGE(cases << " attention cases, " << exact << " with bit-identical plans (fair_paper: " << paper << " cases, "
                  << paper_exact << " bit-identical; " << local << " from local column sums)");
    CHECK(exact * 10 >= cases * 8);  // near-ties are rare on random data
    CHECK(local > 0);
  }

  TEST_CASE("cuda parity: fair_paper window pads and peaked attention" * doctest::skip(no_device)) {
    // The paper pads a span's window (TOVA: its anchor) with the head's maximum, without + 1, so the oldest window
    // token ties with the span's best scored token and loses (lower index wins): visible only when the span's
    // budget equals its window, which these cases arrange. Peaked attention (queries x 4, engine rows raised to the
    // 8th power) makes the softmax's range, [0, p] and not [span begin, p], change the ranking.
    std::mt19937 rng(31);
    int cases = 0, exact = 0;
    for (int rep = 0; rep < (quick ? 1 : 4); ++rep)
      for (const scorer_id s : {scorer_id::snapkv, scorer_id::tova})
        for (const selector_id sel : all_selectors) {
          host_case c;
          do c = random_case(rng, s, sel, allocator_id::fair_paper, dtype_id::f32);
          while (c.tokens < 17);
          const std::int64_t L = c.tokens;
          c.window = 4;
          c.whitelist.clear();
          c.protect = {};
          std::vector<std::pair<std::int32_t, double>> picks;  // (split, ratio) where a span's budget is its window
          for (std::int32_t split = 2; split + 2 <= L; ++split)
            for (int pct = 1; pct < 100; ++pct) {
              const std::int64_t n_keep = fairkv::keep_budget(L, pct / 100.0), earlier = n_keep * split / L;
              const auto w = s == scorer_id::tova ? fairkv::detail::paper_windows{1, 1}
                                                  : fairkv::detail::paper_window_split(c.window, split, L);
              if ((earlier == w.earlier && split > w.earlier) || (n_keep - earlier == w.later && L - split > w.later))
                picks.emplace_back(split, pct / 100.0);
            }
          REQUIRE(!picks.empty());
          const auto [split, ratio] = picks[rng() % picks.size()];
          c.ratio = ratio;
          c.segments = {{static_cast<std::int32_t>(rng() % static_cast<unsigned>(split)), split},
                        {split, static_cast<std::int32_t>(split + 1 + rng() % static_cast<unsigned>(L - split))}};
          for (float& q : c.queries) q *= 4.f;
          for (std::int64_t r = 0; r < c.batch * c.q_heads; ++r)
            for (std::int64_t p = 0; p < L; ++p) {
              float* row = c.attention.data() + (r * L + p) * L;
              float sum = 0.f;
              for (std::int64_t t = 0; t <= p; ++t) sum += (row[t] = std::pow(row[t], 8.f));
              for (std::int64_t t = 0; t <= p; ++t) row[t] /= sum;
            }
          CAPTURE(c.name);
          CAPTURE(split);
          CAPTURE(ratio);
          exact += attention_parity(c) ? 1 : 0;
          ++cases;
        }
    MESSAGE(cases << " fair_paper pad-tie / peaked-attention cases, " << exact << " with bit-identical plans");
    CHECK(exact * 10 >= cases * 8);
  }

  TEST_CASE("cuda planner: initialize once, run twice, the CPU's plan both times" * doctest::skip(no_device)) {
    std::mt19937 rng(17);
    for (const scorer_id s : {scorer_id::knorm, scorer_id::streaming_llm, scorer_id::snapkv})
      for (const selector_id sel : all_selectors) {
        host_case c = random_case(rng, s, sel, allocator_id::fair_with_whitelist, dtype_id::f32);
        CAPTURE(c.name);
        fairkv::keep_plan want, first, second;
        REQUIRE(cpu_plan(c, want).ok());
        const result r = gpu_plan_handle(c, first, second);
        REQUIRE_MESSAGE(r.ok(), std::string(r.message()));
        std::string why;
        CHECK_MESSAGE(same_plan(first, second, why), why);
        if (s != scorer_id::snapkv) CHECK_MESSAGE(same_plan(want, first, why), why);  // attention: near-ties aside
      }
  }

  TEST_CASE("cuda: key rows above 48 KiB of shared memory opt in; beyond the device's opt-in limit, refused" *
            doctest::skip(no_device)) {
    std::mt19937 rng(29);
    host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::uniform, dtype_id::f32);
    c.batch = 1;
    c.heads = 2;
    c.tokens = c.q_tokens = c.capacity = 24;
    c.head_dim = 16384;  // 64 KiB per staged key row
    c.layout = layout_id::contiguous;
    c.segments.clear();
    c.whitelist.clear();
    c.k_bytes.resize(static_cast<std::size_t>(storage_elements(c) * 4));
    for (std::size_t i = 0; i < c.k_bytes.size(); i += 4) {
      const float x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.f;
      std::memcpy(&c.k_bytes[i], &x, 4);
    }
    c.v_bytes = c.k_bytes;
    // Compaction stages one K and one V row (128 KiB) per chunk: also above 48 KiB.
    check_exact_parity(c);
    // 60000 floats per row exceed every device's opt-in limit (227 KiB on H100): refused before any launch.
    c.head_dim = 60000;
    c.tokens = c.q_tokens = c.capacity = 2;
    c.k_bytes.assign(static_cast<std::size_t>(storage_elements(c) * 4), 0);
    fairkv::keep_plan want, got;
    REQUIRE(cpu_plan(c, want).ok());
    const result big = gpu_can_implement(c);
    CHECK(big.code() == status::not_supported);
    CHECK(std::string(big.message()).find("shared memory") != std::string::npos);
    CHECK(gpu_plan(c, got).code() == status::not_supported);
  }

  TEST_CASE("cuda scores against the plain reference (cpu/reference/scores.hpp), every built-in scorer" *
            doctest::skip(no_device)) {
    // The device's scores themselves, not only the plans they lead to: within float rounding of the region's
    // largest reference score; the tokens the reference keeps first (+inf: SnapKV's window, TOVA's last query)
    // above every scored token.
    std::mt19937 rng(61);
    int compared = 0, attention_compared = 0;
    for (const scorer_id s : {scorer_id::knorm, scorer_id::streaming_llm, scorer_id::external, scorer_id::random,
                              scorer_id::snapkv, scorer_id::tova, scorer_id::h2o})
      for (int i = 0; i < (quick ? 3 : 10); ++i) {
        const dtype_id d = float_keys_only(s) ? dtype_id::f32 : all_dtypes[static_cast<std::size_t>(i) % 3];
        const host_case c = random_case(rng, s, selector_id::per_head, allocator_id::uniform, d);
        if (is_attention(s) && c.attn != attention_input::queries) continue;  // the reference reads queries
        CAPTURE(c.name);
        std::vector<float> g;
        const result gr = gpu_score(c, g);
        REQUIRE_MESSAGE(gr.ok(), std::string(gr.message()));
        const result cr = with_policy(c, [&](const auto& pol, auto tag) -> result {
          using T = decltype(tag);
          const auto in = make_inputs<T>(c, reinterpret_cast<const T*>(c.k_bytes.data()), c.queries.data(),
                                         c.attention.data(), c.column_sums.data(),
                                         c.scores.empty() ? nullptr : c.scores.data(), c.local_column_sums.data());
          const std::int64_t H = c.heads, L = c.tokens;
          for (std::int64_t b = 0; b < c.batch; ++b) {
            std::vector<double> ref;
            FAIRKV_TRY(fairkv::cpu::reference::score_region(pol.scorer, in, b, 0, L, ref));
            double top = 0.0, scored_max = -INFINITY;
            for (std::int64_t x = 0; x < H * L; ++x)
              if (std::isfinite(ref[static_cast<std::size_t>(x)])) {
                top = std::max(top, std::abs(ref[static_cast<std::size_t>(x)]));
                scored_max = std::max(scored_max, static_cast<double>(g[static_cast<std::size_t>(b * H * L + x)]));
              }
            const double tol = 2e-5 * top + 1e-7;
            int bad = 0;
            for (std::int64_t x = 0; x < H * L; ++x) {
              const double r = ref[static_cast<std::size_t>(x)], f = g[static_cast<std::size_t>(b * H * L + x)];
              // NaN and -inf (an external scorer's own values) pass through; +inf is kept first.
              const bool ok = std::isnan(r)                                ? std::isnan(f)
                              : r == -std::numeric_limits<double>::infinity() ? f == r
                              : std::isinf(r)                              ? f > scored_max
                                                                           : std::abs(f - r) <= tol;
              if (!ok && ++bad <= 3)
                FAIL_CHECK("sequence ", b, " head ", x / L, " token ", x % L, ": device ", f, ", reference ", r,
                           " (tolerance ", tol, ")");
            }
            CHECK(bad == 0);
          }
          return {};
        });
        REQUIRE_MESSAGE(cr.ok(), std::string(cr.message()));
        ++compared;
        attention_compared += is_attention(s) ? 1 : 0;
      }
    MESSAGE("scores compared with the reference: " << compared << " cases, " << attention_compared << " attention");
    CHECK(attention_compared > 0);
  }

  TEST_CASE("cuda parity: dense and strided compaction with random plans" * doctest::skip(no_device)) {
    std::mt19937 rng(5);
    for (int i = 0; i < (quick ? 15 : 60); ++i) {
      host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::uniform, all_dtypes[i % 3]);
      CAPTURE(c.name);
      std::vector<unsigned char> v = c.v_bytes;
      for (auto& x : v) x = static_cast<unsigned char>(rng());
      c.v_bytes = v;
      const fairkv::keep_plan plan =
          random_plan(rng, c.batch, c.heads, std::vector<std::int64_t>(static_cast<std::size_t>(c.batch), c.tokens),
                      c.tokens + static_cast<std::int64_t>(i % 2));
      check_compaction_parity(c, plan);
    }
  }

  TEST_CASE("cuda parity: paged compaction (NHD and HND, shuffled pages, V in K's layout or its own)" *
            doctest::skip(no_device)) {
    std::mt19937 rng(17);
    for (int i = 0; i < (quick ? 12 : 40); ++i) {
      paged_case c;
      c.dtype = all_dtypes[i % 3];
      c.layout = i % 2 ? fairkv::page_layout::hnd : fairkv::page_layout::nhd;
      c.v_other_layout = i % 4 >= 2;
      c.batch = 1 + static_cast<std::int64_t>(rng() % 3);
      c.heads = 1 + static_cast<std::int64_t>(rng() % 4);
      c.head_dim = std::vector<std::int64_t>{1, 3, 8, 64, 128}[rng() % 5];
      c.page_size = std::vector<std::int64_t>{1, 4, 16}[rng() % 3];
      std::vector<std::int64_t> lengths;
      c.indptr = {0};
      std::int64_t pages = 0;
      for (std::int64_t b = 0; b < c.batch; ++b) {
        const std::int64_t L = 1 + static_cast<std::int64_t>(rng() % 300);
        lengths.push_back(L);
        const std::int64_t np = (L + c.page_size - 1) / c.page_size;
        pages += np;
        c.indptr.push_back(static_cast<std::int32_t>(pages));
        c.last_page_len.push_back(static_cast<std::int32_t>(L - (np - 1) * c.page_size));
      }
      c.num_pages = pages + 3;
      std::vector<std::int32_t> ids(static_cast<std::size_t>(c.num_pages));
      for (std::size_t p = 0; p < ids.size(); ++p) ids[p] = static_cast<std::int32_t>(p);
      std::shuffle(ids.begin(), ids.end(), rng);
      c.indices.assign(ids.begin(), ids.begin() + pages);
      const std::size_t bytes =
          static_cast<std::size_t>(c.num_pages * c.page_size * c.heads * c.head_dim * dtype_bytes(c.dtype));
      c.k_pool.resize(bytes);
      c.v_pool.resize(bytes);
      for (auto& x : c.k_pool) x = static_cast<unsigned char>(rng());
      for (auto& x : c.v_pool) x = static_cast<unsigned char>(rng());
      const std::int64_t cap = *std::max_element(lengths.begin(), lengths.end());
      const fairkv::keep_plan plan = random_plan(rng, c.batch, c.heads, lengths, cap);
      CAPTURE(i);
      std::vector<unsigned char> ck = c.k_pool, cv = c.v_pool, gk = c.k_pool, gv = c.v_pool;
      const result cr = with_dtype(c.dtype, [&](auto tag) {
        using T = decltype(tag);
        return fairkv::cpu::compact(plan.view(), make_paged(c, reinterpret_cast<T*>(ck.data()),
                                                            reinterpret_cast<T*>(cv.data()), c.indptr.data(),
                                                            c.indices.data(), c.last_page_len.data()));
      });
      REQUIRE_MESSAGE(cr.ok(), std::string(cr.message()));
      const result gc = gpu_compact_paged(c, plan, gk, gv);
      REQUIRE_MESSAGE(gc.ok(), std::string(gc.message()));
      CHECK(ck == gk);
      CHECK(cv == gv);
    }
  }

  TEST_CASE("cuda parity: a page listed twice is reported by the device, as the CPU does, and nothing moves" *
            doctest::skip(no_device)) {
    paged_case c;
    c.batch = 3;
    c.heads = 2;
    c.head_dim = 8;
    c.page_size = 4;
    c.num_pages = 4000;  // many pages: the device check is linear in them
    std::vector<std::int64_t> lengths;
    c.indptr = {0};
    for (std::int64_t b = 0; b < c.batch; ++b) {
      lengths.push_back(400);
      c.indptr.push_back(static_cast<std::int32_t>(100 * (b + 1)));
      c.last_page_len.push_back(4);
    }
    for (std::int32_t p = 0; p < 300; ++p) c.indices.push_back(3999 - 13 * p);  // distinct pages
    c.indices[250] = c.indices[17];  // sequence 2 reuses a page of sequence 0
    const std::size_t bytes = static_cast<std::size_t>(c.num_pages * c.page_size * c.heads * c.head_dim * 4);
    c.k_pool.resize(bytes);
    c.v_pool.resize(bytes);
    std::mt19937 rng(41);
    for (auto& x : c.k_pool) x = static_cast<unsigned char>(rng());
    for (auto& x : c.v_pool) x = static_cast<unsigned char>(rng());
    const fairkv::keep_plan plan = random_plan(rng, c.batch, c.heads, lengths, 400);
    std::vector<unsigned char> ck = c.k_pool, cv = c.v_pool, gk = c.k_pool, gv = c.v_pool;
    const result cr = fairkv::cpu::compact(plan.view(), make_paged(c, reinterpret_cast<float*>(ck.data()),
                                                                   reinterpret_cast<float*>(cv.data()), c.indptr.data(),
                                                                   c.indices.data(), c.last_page_len.data()));
    const result gr = gpu_compact_paged(c, plan, gk, gv);
    CHECK(cr.code() == status::invalid_shape);
    CHECK(gr.code() == status::invalid_shape);
    CHECK(std::string(gr.message()).find("page " + std::to_string(c.indices[17]) + " twice (positions 17 and 250)") !=
          std::string::npos);
    CHECK(gk == c.k_pool);
    CHECK(gv == c.v_pool);
  }

  TEST_CASE("cuda parity: compact_into from shared prefix pages into pages of its own, and its refusals" *
            doctest::skip(no_device)) {
    std::mt19937 rng(53);
    for (int i = 0; i < (quick ? 8 : 30); ++i) {
      paged_case c;
      c.dtype = all_dtypes[i % 3];
      c.layout = i % 2 ? fairkv::page_layout::hnd : fairkv::page_layout::nhd;
      c.v_other_layout = i % 4 >= 2;
      c.batch = 1 + static_cast<std::int64_t>(rng() % 3);
      c.heads = 1 + static_cast<std::int64_t>(rng() % 3);
      c.head_dim = std::vector<std::int64_t>{1, 3, 8, 64}[rng() % 4];
      c.page_size = std::vector<std::int64_t>{1, 4, 16}[rng() % 3];
      // Every sequence starts with the same `shared` pages (a prefix cache), then pages of its own.
      const std::int64_t shared = 1 + static_cast<std::int64_t>(rng() % 3);
      std::vector<std::int64_t> lengths;
      std::int32_t next = static_cast<std::int32_t>(shared);
      c.indptr = {0};
      for (std::int64_t b = 0; b < c.batch; ++b) {
        const std::int64_t own = static_cast<std::int64_t>(rng() % 3);
        for (std::int32_t p = 0; p < shared; ++p) c.indices.push_back(p);
        for (std::int64_t p = 0; p < own; ++p) c.indices.push_back(next++);
        const std::int64_t last = 1 + static_cast<std::int64_t>(rng() % c.page_size);
        c.indptr.push_back(static_cast<std::int32_t>(c.indices.size()));
        c.last_page_len.push_back(static_cast<std::int32_t>(last));
        lengths.push_back((shared + own - 1) * c.page_size + last);
      }
      const std::int64_t cap = *std::max_element(lengths.begin(), lengths.end());
      const fairkv::keep_plan plan = random_plan(rng, c.batch, c.heads, lengths, cap);
      // The destination: fresh pages after the source's, as many as each sequence's longest head needs.
      paged_case to = c;
      to.indptr = {0};
      to.indices.clear();
      to.last_page_len.clear();
      for (std::int64_t b = 0; b < c.batch; ++b) {
        std::int64_t longest = 0;
        for (std::int64_t h = 0; h < c.heads; ++h) longest = std::max<std::int64_t>(longest, plan.count(b, h));
        const std::int64_t np = (longest + c.page_size - 1) / c.page_size;
        for (std::int64_t p = 0; p < np; ++p) to.indices.push_back(next++);
        to.indptr.push_back(static_cast<std::int32_t>(to.indices.size()));
        to.last_page_len.push_back(static_cast<std::int32_t>(np == 0 ? 0 : longest - (np - 1) * c.page_size));
      }
      c.num_pages = to.num_pages = next + 2;
      const std::size_t bytes =
          static_cast<std::size_t>(c.num_pages * c.page_size * c.heads * c.head_dim * dtype_bytes(c.dtype));
      c.k_pool.resize(bytes);
      c.v_pool.resize(bytes);
      for (auto& x : c.k_pool) x = static_cast<unsigned char>(rng());
      for (auto& x : c.v_pool) x = static_cast<unsigned char>(rng());
      CAPTURE(i);
      std::vector<unsigned char> ck = c.k_pool, cv = c.v_pool, gk = c.k_pool, gv = c.v_pool;
      const result cr = with_dtype(c.dtype, [&](auto tag) {
        using T = decltype(tag);
        auto* k = reinterpret_cast<T*>(ck.data());
        auto* v = reinterpret_cast<T*>(cv.data());
        return fairkv::cpu::compact_into(
            plan.view(), make_paged(c, k, v, c.indptr.data(), c.indices.data(), c.last_page_len.data()).as_const(),
            make_paged(to, k, v, to.indptr.data(), to.indices.data(), to.last_page_len.data()));
      });
      REQUIRE_MESSAGE(cr.ok(), std::string(cr.message()));
      const result gr = gpu_compact_into(c, to, plan, gk, gv);
      REQUIRE_MESSAGE(gr.ok(), std::string(gr.message()));
      CHECK(ck == gk);
      CHECK(cv == gv);
      // A destination page that is a shared source page: refused on the device, nothing written.
      if (!to.indices.empty()) {
        paged_case bad = to;
        bad.indices.back() = 0;
        std::vector<unsigned char> bk = c.k_pool, bv = c.v_pool;
        const result br = gpu_compact_into(c, bad, plan, bk, bv);
        CHECK(br.code() == status::invalid_argument);
        CHECK(std::string(br.message()).find("page 0 is also in from's table") != std::string::npos);
        CHECK(bk == c.k_pool);
        CHECK(bv == c.v_pool);
      }
    }
  }

  TEST_CASE("cuda parity: an invalid plan is reported by the device and writes nothing" * doctest::skip(no_device)) {
    std::mt19937 rng(23);
    const host_case c = random_case(rng, scorer_id::knorm, selector_id::per_head, allocator_id::uniform, dtype_id::bf16);
    fairkv::keep_plan want;
    REQUIRE(cpu_plan(c, want).ok());
    fairkv::keep_plan bad = want;
    const fairkv::keep_plan_view v = bad.view();
    if (v.counts[0] >= 2) {
      std::swap(v.indices[0], v.indices[1]);  // not ascending
    } else {
      v.counts[0] = static_cast<std::int32_t>(c.tokens + 1);  // count above the length
    }
    std::vector<unsigned char> gk = c.k_bytes, gv = c.v_bytes;
    const result r = gpu_compact(c, bad, gk, gv);
    CHECK(r.code() == status::invalid_plan);
    CHECK(gk == c.k_bytes);
    CHECK(gv == c.v_bytes);
  }
}
