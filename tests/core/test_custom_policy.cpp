// A user-defined scorer and allocator are plain structs that satisfy the concepts and run in the planner.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "fairkv/fairkv.hpp"

namespace {

// Keeps keys with a large first component: an engine-specific heuristic.
struct first_component {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "first_component";
  template <class Row>
  float operator()(const Row& k, const fairkv::token_info&) const noexcept {
    return k[0];
  }
};
static_assert(fairkv::Scorer<first_component>);

// Gives every budget to the last group (e.g. "only the user's latest message matters"), whitelist first.
struct last_group_first {
  static constexpr bool uses_segments = true;
  static constexpr bool uses_whitelist = true;
  static constexpr bool segment_local = false;
  static constexpr bool needs_own_allocation = false;
  static constexpr const char* name = "last_group_first";
  fairkv::result allocate(const fairkv::allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    const std::int64_t g = ctx.groups();
    for (std::int64_t h = 0; h < ctx.heads; ++h) {
      std::int64_t left = ctx.n_keep;
      for (std::int64_t i = 0; i < g; ++i) left -= (budgets[h * g + i] = ctx.forced[i]);
      for (std::int64_t i = g - 1; i >= 0 && left > 0; --i) {
        const std::int64_t extra = std::min(left, ctx.sizes[i] - ctx.forced[i]);
        budgets[h * g + i] += extra;
        left -= extra;
      }
    }
    return {};
  }
};
static_assert(fairkv::SegmentAllocator<last_group_first>);

// A broken allocator: the planner must catch budgets that do not sum to n_keep.
struct greedy_allocator : last_group_first {
  fairkv::result allocate(const fairkv::allocation_context& ctx, std::span<std::int64_t> budgets) const noexcept {
    for (std::int64_t i = 0; i < ctx.heads * ctx.groups(); ++i) budgets[i] = ctx.sizes[i % ctx.groups()];
    return {};
  }
};

}  // namespace

TEST_CASE("a user-defined scorer and allocator compose with the shipped selector") {
  std::vector<float> k = {5, 0, 1, 0, 9, 0, 2, 0, 7, 0, 3, 0};  // [1 head, 6 tokens, 2 dims]
  const auto in = fairkv::keys_only(fairkv::make_contiguous_view(k.data(), 1, 1, 6, 2));
  fairkv::keep_plan plan;
  REQUIRE(fairkv::cpu::plan(fairkv::policy<first_component, fairkv::selectors::per_head, fairkv::allocators::uniform>{},
                            in, {}, {}, 0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 2, 4});
  const std::vector<fairkv::segment> segs{{0, 3}};
  const std::vector<std::int32_t> wl{1};
  REQUIRE(fairkv::cpu::plan(fairkv::policy<first_component, fairkv::selectors::per_head, last_group_first>{}, in, segs, wl,
                            0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{1, 4, 5});  // forced 1, then the remainder group [3, 6) gets 2
  const fairkv::result r =
      fairkv::cpu::plan(fairkv::policy<first_component, fairkv::selectors::per_head, greedy_allocator>{}, in, segs, {},
                        0.5, plan);
  CHECK(r.code() == fairkv::status::internal_error);
  CHECK(std::string(r.message()).find("last_group_first") != std::string::npos);
}

#include <sstream>

#include "fairkv/dispatch.hpp"

TEST_CASE("dispatch turns runtime names into the compile-time policy they name") {
  fairkv::policy_spec spec;
  REQUIRE(fairkv::parse("snapkv", spec.scorer).ok());
  REQUIRE(fairkv::parse("union", spec.selector).ok());
  REQUIRE(fairkv::parse("fair_with_whitelist", spec.allocator).ok());
  spec.window = 16;
  const std::string name = fairkv::dispatch(spec, [](auto pol) {
    using P = decltype(pol);
    std::ostringstream out;  // (std::string operator+ trips a GCC 12 -Wrestrict false positive under -O3)
    out << P::scorer_type::name << '/' << P::selector_type::name << '/' << P::allocator_type::name;
    if constexpr (requires { pol.scorer.window; }) out << '/' << pol.scorer.window;
    return out.str();
  });
  CHECK(name == "snapkv/union_heads/fair_with_whitelist/16");
  fairkv::scorer_kind s{};
  const fairkv::result bad = fairkv::parse("snap", s);
  CHECK(bad.code() == fairkv::status::invalid_argument);
  CHECK(std::string(bad.message()).find("unknown scorer 'snap'") != std::string::npos);
}
