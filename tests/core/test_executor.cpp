// The parallel CPU backend: plans and compaction with a 2- and a 4-thread executor equal the serial ones bit for
// bit, for every scorer x selector x allocator through fairkv::dispatch over random shapes. Kept small (a few
// hundred tokens at most) so the ASan pass stays fast.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "plan_by_spec.hpp"
#include "test_util.hpp"
#include "thread_executor.hpp"

namespace {

using fairkv_testing::thread_executor;

struct shape {
  std::int64_t batch, heads, group, tokens, dim;
};

bool same_plan(const fairkv::keep_plan& a, const fairkv::keep_plan& b, std::int64_t batch, std::int64_t heads) {
  for (std::int64_t s = 0; s < batch; ++s)
    for (std::int64_t h = 0; h < heads; ++h) {
      if (a.count(s, h) != b.count(s, h)) return false;
      const auto ka = a.kept(s, h), kb = b.kept(s, h);
      if (!std::equal(ka.begin(), ka.end(), kb.begin(), kb.end())) return false;
    }
  return true;
}

}  // namespace

TEST_CASE("executor: 2 and 4 threads plan and compact bit for bit as the serial backend, every policy") {
  using namespace fairkv;
  const thread_executor two(2), four(4);
  std::mt19937 rng(17);
  const shape shapes[] = {{1, 3, 3, 97, 8}, {2, 4, 2, 64, 16}, {3, 6, 1, 40, 4}, {1, 1, 4, 33, 8}, {2, 8, 2, 150, 8}};
  int planned = 0, compared = 0;
  for (const shape& sh : shapes) {
    CAPTURE(sh.heads);
    CAPTURE(sh.tokens);
    const std::int64_t L = sh.tokens, qh = sh.heads * sh.group;
    const auto keys_data = fairkv_test::random_floats(static_cast<std::size_t>(sh.batch * sh.heads * L * sh.dim), rng());
    const auto values_data = fairkv_test::random_floats(keys_data.size(), rng());
    const auto q_data = fairkv_test::random_floats(static_cast<std::size_t>(sh.batch * qh * L * sh.dim), rng());
    auto score_data = fairkv_test::random_floats(static_cast<std::size_t>(sh.batch * sh.heads * L), rng());
    score_data[3] = score_data[5];  // a tie, broken by the order, not by the thread that saw it
    auto keys = make_contiguous_view<const float>(keys_data.data(), sh.batch, sh.heads, L, sh.dim);
    auto in = with_queries(keys, make_contiguous_view<const float>(q_data.data(), sh.batch, qh, L, sh.dim));
    in.scores = score_view{score_data.data(), sh.batch, sh.heads, L, sh.heads * L, L, 1};
    const auto half = static_cast<std::int32_t>(L / 2), last = static_cast<std::int32_t>(L - 1);
    const std::vector<segment> segs = {{2, half}, {half, last}};
    const std::vector<std::int32_t> wl = {1, 3};
    for (scorer_kind sk : {scorer_kind::knorm, scorer_kind::streaming_llm, scorer_kind::snapkv, scorer_kind::tova,
                           scorer_kind::h2o, scorer_kind::external})
      for (selection_kind sel : {selection_kind::per_head, selection_kind::union_heads, selection_kind::head_adaptive})
        for (allocator_kind ak : {allocator_kind::uniform, allocator_kind::whitelist, allocator_kind::fair,
                                  allocator_kind::fair_with_whitelist, allocator_kind::debias,
                                  allocator_kind::fair_paper}) {
          policy_spec spec;
          spec.scorer = sk;
          spec.selector = sel;
          spec.allocator = ak;
          spec.window = 8;
          spec.lambda = 0.5f;
          const bool with_segs = ak != allocator_kind::uniform && ak != allocator_kind::whitelist;
          const bool with_wl = ak == allocator_kind::whitelist || ak == allocator_kind::fair_with_whitelist;
          const std::span<const segment> sg = with_segs ? std::span<const segment>(segs) : std::span<const segment>();
          const std::span<const std::int32_t> w =
              with_wl ? std::span<const std::int32_t>(wl) : std::span<const std::int32_t>();
          const double ratio = 0.3 + 0.2 * double(rng() % 3);
          CAPTURE(int(sk));
          CAPTURE(int(sel));
          CAPTURE(int(ak));
          keep_plan serial, p2, p4;
          const result r0 = fairkv_test::plan_by_spec(spec, in, sg, w, ratio, serial);
          const result r2 = fairkv_test::plan_by_spec(two, spec, in, sg, w, ratio, p2);
          const result r4 = fairkv_test::plan_by_spec(four, spec, in, sg, w, ratio, p4);
          REQUIRE(r2.code() == r0.code());
          REQUIRE(r4.code() == r0.code());
          if (!r0) continue;
          ++planned;
          CHECK(same_plan(serial, p2, sh.batch, sh.heads));
          CHECK(same_plan(serial, p4, sh.batch, sh.heads));
          // Compaction of K and V in place, once per executor (each with its own plan, equal to the serial one:
          // a plan is applied once), from the same cache.
          std::vector<float> k0 = keys_data, v0 = values_data, k4 = keys_data, v4 = values_data;
          auto view = [&](std::vector<float>& d) {
            return make_contiguous_view<float>(d.data(), sh.batch, sh.heads, L, sh.dim);
          };
          REQUIRE(cpu::compact(serial.view(), view(k0), view(v0)).ok());
          REQUIRE(cpu::compact(four, p4.view(), view(k4), view(v4)).ok());
          CHECK(std::memcmp(k0.data(), k4.data(), k0.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(v0.data(), v4.data(), v0.size() * sizeof(float)) == 0);
          ++compared;
        }
  }
  MESSAGE(planned << " plans compared");
  CHECK(planned >= 400);  // most combinations are valid requests (fair_paper refuses external scores, ...)
  CHECK(compared == planned);
}

TEST_CASE("executor: the workspace is sized for the executor's concurrency; the serial layout is unchanged") {
  using namespace fairkv;
  const auto keys_data = fairkv_test::random_floats(4 * 50 * 8, 3);
  auto keys = make_contiguous_view<const float>(keys_data.data(), 1, 4, 50, 8);
  const policy<scorers::knorm, selectors::per_head, allocators::uniform> pol{};
  std::size_t serial = 0, via_serial_executor = 0, parallel = 0;
  REQUIRE(cpu::plan(nullptr, serial, pol, keys_only(keys), {}, {}, 0.5, keep_plan_view{}).ok());
  REQUIRE(cpu::plan(cpu::serial_executor{}, nullptr, via_serial_executor, pol, keys_only(keys), {}, {}, 0.5,
                    keep_plan_view{})
              .ok());
  const thread_executor four(4);
  REQUIRE(cpu::plan(four, nullptr, parallel, pol, keys_only(keys), {}, {}, 0.5, keep_plan_view{}).ok());
  CHECK(via_serial_executor == serial);
  CHECK(parallel > serial);
  // A buffer sized for the serial planner is too small for four tasks: refused, not overrun.
  std::vector<std::byte> ws(serial);
  keep_plan out;
  out.resize(1, 4, 50);
  const result r = cpu::plan(four, ws.data(), serial, pol, keys_only(keys), {}, {}, 0.5, out.view());
  CHECK(r.code() == status::insufficient_workspace);
}

namespace {

// Executors with an engine's bugs: each claims concurrency 4 and misbehaves in run().
enum class fault { runs_nothing, runs_first_only, runs_one_twice, runs_out_of_range, throws_after_first };
struct faulty_executor {
  fault kind;
  [[nodiscard]] std::int64_t concurrency() const noexcept { return 4; }
  void run(std::int64_t n, fairkv::cpu::task_ref f) const {
    switch (kind) {
      case fault::runs_nothing: return;
      case fault::runs_first_only: f(0); return;
      case fault::runs_one_twice:
        for (std::int64_t i = 0; i < n; ++i) f(i);
        f(n - 1);
        return;
      case fault::runs_out_of_range:
        for (std::int64_t i = 0; i <= n; ++i) f(i);
        return;
      case fault::throws_after_first:
        f(0);
        throw std::runtime_error("pool is shutting down");
    }
  }
};

}  // namespace

TEST_CASE("executor: a pool that drops, repeats, invents or throws is an internal error, never an ok plan") {
  using namespace fairkv;
  const auto keys_data = fairkv_test::random_floats(4 * 50 * 8, 5);
  const auto keys = make_contiguous_view<const float>(keys_data.data(), 1, 4, 50, 8);
  const policy<scorers::knorm, selectors::per_head, allocators::uniform> pol{};
  for (const fault kind : {fault::runs_nothing, fault::runs_first_only, fault::runs_one_twice,
                           fault::runs_out_of_range, fault::throws_after_first}) {
    CAPTURE(static_cast<int>(kind));
    keep_plan out;
    const result r = cpu::plan(faulty_executor{kind}, pol, keys_only(keys), {}, {}, 0.5, out);
    CHECK(r.code() == status::internal_error);
    CHECK(std::string(r.message()).find(kind == fault::throws_after_first ? "the executor threw"
                                                                          : "must call f(i) once for every i") !=
          std::string::npos);
  }
}

TEST_CASE("executor: compaction through a faulty pool moves every row exactly once, as the serial one does") {
  // Rows already moved cannot be put back, so compaction never stops half way: the calling thread moves the rows
  // the pool dropped (or lost by throwing), and a repeated task moves nothing twice (a second move of a row reads
  // slots the first one wrote). The cache ends byte for byte as after a serial compaction.
  using namespace fairkv;
  const auto k0 = fairkv_test::random_floats(2 * 4 * 50 * 8, 5), v0 = fairkv_test::random_floats(2 * 4 * 50 * 8, 6);
  const policy<scorers::knorm, selectors::per_head, allocators::uniform> pol{};
  keep_plan plan;
  REQUIRE(cpu::plan(pol, keys_only(make_contiguous_view<const float>(k0.data(), 2, 4, 50, 8)), {}, {}, 0.37, plan).ok());
  auto k_serial = k0, v_serial = v0;
  REQUIRE(cpu::compact(keep_plan(plan).view(), make_contiguous_view(k_serial.data(), 2, 4, 50, 8),
                       make_contiguous_view(v_serial.data(), 2, 4, 50, 8))
              .ok());
  REQUIRE(k_serial != k0);
  for (const fault kind : {fault::runs_nothing, fault::runs_first_only, fault::runs_one_twice,
                           fault::runs_out_of_range, fault::throws_after_first}) {
    CAPTURE(static_cast<int>(kind));
    auto k = k0, v = v0;
    const keep_plan fresh = plan;  // copied before compaction: a plan is applied once
    const result c = cpu::compact(faulty_executor{kind}, fresh.view(), make_contiguous_view(k.data(), 2, 4, 50, 8),
                                  make_contiguous_view(v.data(), 2, 4, 50, 8));
    CHECK_MESSAGE(c.ok(), c.message());
    CHECK(std::memcmp(k.data(), k_serial.data(), k.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(v.data(), v_serial.data(), v.size() * sizeof(float)) == 0);
  }
}
