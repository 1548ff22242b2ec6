// Bounded fuzz of the paths issue 34's findings came from, deterministic seeds, run in the Release build and again
// under AddressSanitizer + UndefinedBehaviorSanitizer (scripts/test.sh): executors that drop, repeat, invent or
// throw tasks at random points; hostile numbers in policy parameters and layer inputs (NaN, infinities, negative
// and enormous values, even kernels); and page tables at scale with one corruption each. Every call either returns a
// status with a message, or succeeds with a result an oracle confirms (a valid plan of the right counts, the serial
// compaction, a table with no corruption). The chat-script reader has its own fuzz in tests/llama/test_chat.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "plan_by_spec.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

std::int64_t pick(std::mt19937& rng, std::int64_t lo, std::int64_t hi) {  // uniform in [lo, hi]
  return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
}

// An executor whose every run() misbehaves at random: it runs a random subset of the tasks in a random order,
// may repeat some, may call indices outside [0, n), and may throw part-way. `exact` records whether the last
// run() since the caller reset it called every task exactly once (the only case in which a plan may come back ok).
struct chaotic_executor {
  std::mt19937* rng;
  std::int64_t threads;
  bool* exact;
  [[nodiscard]] std::int64_t concurrency() const noexcept { return threads; }
  void run(std::int64_t n, cpu::task_ref f) const {
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), *rng);
    const int mode = static_cast<int>((*rng)() % 5);
    *exact = *exact && mode == 0;  // sticky over a plan's runs; the caller resets it
    if (mode == 1) order.resize(order.size() - 1 - (*rng)() % order.size());  // drops some (maybe all)
    if (mode == 2) order.push_back(order[(*rng)() % order.size()]);           // repeats one
    if (mode == 3) order.push_back((*rng)() % 2 ? n : -1);                    // invents one
    const std::size_t throw_at = mode == 4 ? (*rng)() % (order.size() + 1) : order.size() + 1;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (i == throw_at) throw std::runtime_error("chaotic executor");
      f(order[i]);
    }
    if (throw_at == order.size()) throw std::runtime_error("chaotic executor, after every task");
  }
};

}  // namespace

TEST_CASE("fuzz: executors failing at random give a serial plan or internal_error, and always the serial compaction") {
  std::mt19937 rng(101);
  int plans_ok = 0, plans_refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t B = pick(rng, 1, 3), H = pick(rng, 1, 6), L = pick(rng, 8, 80), D = pick(rng, 1, 8);
    const auto k0 = fairkv_test::random_floats(static_cast<std::size_t>(B * H * L * D), rng());
    const auto v0 = fairkv_test::random_floats(k0.size(), rng());
    const auto keys = make_contiguous_view<const float>(k0.data(), B, H, L, D);
    const std::vector<segment> segs = {{0, static_cast<std::int32_t>(L / 3)},
                                       {static_cast<std::int32_t>(L / 2), static_cast<std::int32_t>(L)}};
    policy_spec spec;
    spec.selector = rng() % 2 ? selection_kind::per_head : selection_kind::union_heads;
    spec.allocator = rng() % 2 ? allocator_kind::fair : allocator_kind::uniform;
    const std::span<const segment> use = spec.allocator == allocator_kind::fair ? std::span<const segment>(segs)
                                                                                : std::span<const segment>();
    const double ratio = 0.1 + 0.8 * static_cast<double>(rng() % 100) / 100.0;
    keep_plan serial, chaotic;
    REQUIRE(fairkv_test::plan_by_spec(spec, keys_only(keys), use, {}, ratio, serial).ok());
    bool exact = true;
    const chaotic_executor ex{&rng, pick(rng, 2, 6), &exact};
    const result r = fairkv_test::plan_by_spec(ex, spec, keys_only(keys), use, {}, ratio, chaotic);
    if (r.ok()) {
      ++plans_ok;
      CHECK(exact);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h) REQUIRE(chaotic.kept(b, h) == serial.kept(b, h));
    } else {
      ++plans_refused;
      CHECK(r.code() == status::internal_error);
    }
    // Compaction through the same chaos: every row moved exactly once.
    auto k_serial = k0, v_serial = v0, k = k0, v = v0;
    REQUIRE(cpu::compact(keep_plan(serial).view(), make_contiguous_view(k_serial.data(), B, H, L, D),
                         make_contiguous_view(v_serial.data(), B, H, L, D))
                .ok());
    const result c = cpu::compact(ex, serial.view(), make_contiguous_view(k.data(), B, H, L, D),
                                  make_contiguous_view(v.data(), B, H, L, D));
    REQUIRE_MESSAGE(c.ok(), c.message());
    REQUIRE(std::memcmp(k.data(), k_serial.data(), k.size() * sizeof(float)) == 0);
    REQUIRE(std::memcmp(v.data(), v_serial.data(), v.size() * sizeof(float)) == 0);
  }
  MESSAGE("executor fuzz: " << plans_ok << " plans ok, " << plans_refused << " refused");
  CHECK(plans_ok > 0);
  CHECK(plans_refused > 0);
}

namespace {

float hostile_float(std::mt19937& rng) {
  const float values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), -1.0f, 0.0f, 1e-38f, 1e38f,
                          std::numeric_limits<float>::denorm_min(), 0.125f, 1.0f};
  return values[rng() % std::size(values)];
}

std::int32_t hostile_int(std::mt19937& rng, std::int32_t sane) {
  const std::int32_t values[] = {sane, sane, sane, 0, -1, 1, 2, INT32_MAX, INT32_MIN, 1 << 20, 16385};
  return values[rng() % std::size(values)];
}

}  // namespace

TEST_CASE("fuzz: hostile numbers in policies and layer inputs are refused or give a valid plan of the right counts") {
  std::mt19937 rng(202);
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const std::int64_t H = pick(rng, 1, 3), G = pick(rng, 1, 3), L = pick(rng, 4, 48), D = pick(rng, 1, 8);
    const std::int64_t Lq = pick(rng, 1, L);
    auto k = fairkv_test::random_floats(static_cast<std::size_t>(H * L * D), rng(), -3.f, 3.f);
    auto q = fairkv_test::random_floats(static_cast<std::size_t>(H * G * Lq * D), rng(), -3.f, 3.f);
    // A few non-finite or extreme elements in the keys or queries.
    for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i) k[rng() % k.size()] = hostile_float(rng);
    for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i) q[rng() % q.size()] = hostile_float(rng);
    layer_inputs<kv_view<const float>> in{make_contiguous_view<const float>(k.data(), 1, H, L, D)};
    in.queries = make_contiguous_view<const float>(q.data(), 1, H * G, Lq, D);
    if (rng() % 3 == 0) in.scale = hostile_float(rng);

    policy_spec spec;
    spec.scorer = static_cast<scorer_kind>(rng() % 5);  // every scorer but external
    spec.selector = static_cast<selection_kind>(rng() % 3);
    spec.allocator = static_cast<allocator_kind>(rng() % 5);  // uniform .. debias
    spec.window = hostile_int(rng, 8);
    spec.kernel = hostile_int(rng, 5);
    spec.n_sink = hostile_int(rng, 4);
    spec.sinks = hostile_int(rng, 4);
    spec.boundary = hostile_int(rng, 0);
    spec.lambda = rng() % 4 == 0 ? hostile_float(rng) : 0.5f;
    spec.alpha_safeguard = rng() % 4 == 0 ? hostile_float(rng) : 0.2f;
    const std::vector<segment> segs = {{0, static_cast<std::int32_t>(L / 2)}};
    const std::vector<std::int32_t> wl = {static_cast<std::int32_t>(L - 1)};
    const bool uses_wl = spec.allocator == allocator_kind::whitelist || spec.allocator == allocator_kind::fair_with_whitelist;
    const std::int64_t budget = rng() % 5 == 0 ? hostile_int(rng, 3) : pick(rng, 1, L);
    keep_plan plan;
    const result r = fairkv_test::plan_by_spec(
        spec, in,
        spec.allocator == allocator_kind::uniform || spec.allocator == allocator_kind::whitelist
            ? std::span<const segment>()
            : std::span<const segment>(segs),
        uses_wl ? std::span<const std::int32_t>(wl) : std::span<const std::int32_t>(), keep_target::of_tokens(budget),
        plan);
    if (!r.ok()) {
      ++refused;
      CHECK(std::string(r.message()).size() > 0);
      continue;
    }
    ++accepted;
    // Non-finite keys or queries are the caller's data: they may reorder tokens, never break the plan's form.
    REQUIRE(validate(plan.view(), "plan").ok());
    const std::int64_t want = std::min<std::int64_t>(budget, L);
    for (std::int64_t h = 0; h < H; ++h) {
      if (spec.selector == selection_kind::head_adaptive) continue;  // per-head counts vary; their sum is checked
      REQUIRE(plan.count(0, h) == want);
    }
    if (spec.selector == selection_kind::head_adaptive) {
      std::int64_t total = 0;
      for (std::int64_t h = 0; h < H; ++h) total += plan.count(0, h);
      REQUIRE(total == want * H);
    }
    // Parameters the library documents as refused never come back ok.
    if (spec.scorer == scorer_kind::snapkv) CHECK((spec.kernel >= 1 && spec.kernel % 2 == 1));
    if (in.scale != 0.f && (spec.scorer == scorer_kind::snapkv || spec.scorer == scorer_kind::tova ||
                            spec.scorer == scorer_kind::h2o))
      CHECK((std::isfinite(in.scale) && in.scale > 0.f));
  }
  MESSAGE("hostile-number fuzz: " << accepted << " accepted, " << refused << " refused");
  CHECK(accepted > 0);
  CHECK(refused > 0);
}

TEST_CASE("fuzz: page tables at scale with one corruption are refused naming it, clean ones accepted") {
  std::mt19937 rng(303);
  int clean = 0, corrupt = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const std::int64_t batch = pick(rng, 1, 4), listed = pick(rng, 1000, 60000);
    // The pool: about the pages listed (checked with one bit per pool page), or many times more (checked through
    // the sorted table instead).
    const std::int64_t pool = rng() % 3 == 0 ? listed * pick(rng, 8, 16) : listed + pick(rng, 0, 1000);
    std::vector<std::int32_t> all(static_cast<std::size_t>(pool));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<std::int32_t> ids(all.begin(), all.begin() + listed);
    std::vector<std::int32_t> indptr(static_cast<std::size_t>(batch + 1), 0), last(static_cast<std::size_t>(batch), 1);
    for (std::int64_t b = 1; b < batch; ++b)
      indptr[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(listed * b / batch);
    indptr[static_cast<std::size_t>(batch)] = static_cast<std::int32_t>(listed);
    const int corruption = static_cast<int>(rng() % 6);  // 0: none
    const std::size_t at = rng() % ids.size(), other = (at + 1 + rng() % (ids.size() - 1)) % ids.size();  // != at
    switch (corruption) {
      case 1: ids[at] = ids[other]; break;  // a page listed twice
      case 2: ids[at] = -1 - static_cast<std::int32_t>(rng() % 5); break;
      case 3: ids[at] = static_cast<std::int32_t>(pool + static_cast<std::int64_t>(rng() % 3)); break;
      case 4: last[rng() % last.size()] = rng() % 2 ? 0 : 2; break;  // page_size is 1
      case 5: if (batch > 1) std::swap(indptr[1], indptr[static_cast<std::size_t>(batch)]); else indptr[1] = -1; break;
      default: break;
    }
    const bool expect_ok = corruption == 0;
    // One element per page, K and V pools as large as claimed (validation reads only the tables).
    std::vector<float> k(static_cast<std::size_t>(pool)), v(k.size());
    const auto view = make_paged_view(page_layout::nhd, k.data(), v.data(), pool, 1, 1, 1, batch, indptr.data(),
                                      ids.data(), last.data());
    const result r = validate(view, "view");
    CAPTURE(corruption);
    CAPTURE(pool);
    if (expect_ok) {
      ++clean;
      CHECK_MESSAGE(r.ok(), std::string(r.message()));
    } else {
      ++corrupt;
      CHECK_FALSE(r.ok());
      if (corruption == 1) CHECK_MESSAGE(std::string(r.message()).find("twice (positions") != std::string::npos, std::string(r.message()));
    }
  }
  MESSAGE("page-table fuzz: " << clean << " clean, " << corrupt << " corrupt");
  CHECK(clean > 0);
  CHECK(corrupt > 0);
}
