// The concepts themselves, not only fairkv::policy's messages (tests/failtests), refuse every type that misses a
// requirement, and accept the shipped policies and user-written ones that meet them all.
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "fairkv/fairkv.hpp"

namespace {

struct user_keys {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "user_keys";
  template <class Row>
  float operator()(const Row& k, const fairkv::token_info&) const noexcept {
    return k[0];
  }
};
struct user_keys_nameless {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  template <class Row>
  float operator()(const Row& k, const fairkv::token_info&) const noexcept {
    return k[0];
  }
};
struct user_keys_float_only {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "user_keys_float_only";
  float operator()(const fairkv::key_row<float, false>& k, const fairkv::token_info&) const noexcept { return k[0]; }
  float operator()(const fairkv::key_row<float, true>& k, const fairkv::token_info&) const noexcept { return k[0]; }
};
struct user_claims_tova {
  static constexpr fairkv::score_source source = fairkv::score_source::last_attention;
  static constexpr const char* name = "user_claims_tova";
};
struct user_claims_h2o {
  static constexpr fairkv::score_source source = fairkv::score_source::observed_attention;
  static constexpr const char* name = "user_claims_h2o";
};
// external scores are read by the backends from layer_inputs::scores; a user type claiming the source would
// silently be given them instead of running its own operator().
struct user_claims_external {
  static constexpr fairkv::score_source source = fairkv::score_source::external;
  static constexpr const char* name = "user_claims_external";
  [[nodiscard]] float operator()(const fairkv::token_info&) const noexcept { return 0.f; }
};
struct user_claims_per_head {
  static constexpr fairkv::selection_kind kind = fairkv::selection_kind::per_head;
  static constexpr const char* name = "user_claims_per_head";
};
struct user_allocator {
  static constexpr bool uses_segments = true, uses_whitelist = true, segment_local = true, needs_own_allocation = false;
  static constexpr const char* name = "user_allocator";
  fairkv::allocators::protection protect{};
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
struct user_allocator_nameless {
  static constexpr bool uses_segments = true, uses_whitelist = true, segment_local = true, needs_own_allocation = false;
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
struct user_allocator_paper : user_allocator {
  static constexpr bool paper_spans = true;
};

}  // namespace

// Shipped policies.
static_assert(fairkv::Scorer<fairkv::scorers::snapkv<16, 3>> && fairkv::Scorer<fairkv::scorers::tova> &&
              fairkv::Scorer<fairkv::scorers::h2o> && fairkv::Scorer<fairkv::scorers::knorm> &&
              fairkv::Scorer<fairkv::scorers::streaming_llm<0>>);
static_assert(fairkv::Selector<fairkv::selectors::per_head> && fairkv::Selector<fairkv::selectors::union_heads> &&
              fairkv::Selector<fairkv::selectors::head_adaptive>);
static_assert(fairkv::SegmentAllocator<fairkv::allocators::fair_paper>);
// User-written ones: keys and position scorers and allocators are open.
static_assert(fairkv::Scorer<user_keys>);
static_assert(fairkv::SegmentAllocator<user_allocator>);
// Each missing requirement fails the concept itself.
static_assert(!fairkv::Scorer<user_keys_nameless>);
static_assert(!fairkv::Scorer<user_keys_float_only>);  // half_t and bfloat16_t rows would not compile in the planner
static_assert(!fairkv::Scorer<user_claims_tova>);
static_assert(!fairkv::Scorer<user_claims_h2o>);
static_assert(!fairkv::Scorer<user_claims_external>);
static_assert(fairkv::Scorer<fairkv::scorers::external>);
static_assert(!fairkv::Selector<user_claims_per_head>);
static_assert(!fairkv::SegmentAllocator<user_allocator_nameless>);
static_assert(!fairkv::SegmentAllocator<user_allocator_paper>);

TEST_CASE("policy names are the type names that fairkv::parse takes") {
  // union_heads used to report "union"; parse keeps the old spelling working.
  CHECK(std::string_view(fairkv::selectors::union_heads::name) == "union_heads");
  for (const char* n : {fairkv::selectors::per_head::name, fairkv::selectors::union_heads::name,
                        fairkv::selectors::head_adaptive::name, "union"}) {
    fairkv::selection_kind k{};
    CHECK(fairkv::parse(n, k).ok());
  }
  fairkv::selection_kind k{};
  REQUIRE(fairkv::parse("union", k).ok());
  CHECK(k == fairkv::selection_kind::union_heads);
}

TEST_CASE("keep_budget is public: floor(L * (1 - ratio)), at least one token") {
  CHECK(fairkv::keep_budget(10, 0.5) == 5);
  CHECK(fairkv::keep_budget(10, 0.99) == 1);
  CHECK(fairkv::keep_budget(0, 0.5) == 0);
  static_assert(fairkv::keep_budget(7, 0.0) == 7);
}

TEST_CASE("a const keep_plan hands out a read-only view; a writable one converts to it") {
  fairkv::keep_plan plan;
  plan.resize(1, 2, 4);
  const fairkv::keep_plan& cref = plan;
  static_assert(std::is_same_v<decltype(cref.view()), fairkv::const_keep_plan_view>);
  static_assert(std::is_same_v<decltype(plan.view()), fairkv::keep_plan_view>);
  static_assert(std::is_convertible_v<fairkv::keep_plan_view, fairkv::const_keep_plan_view>);
  static_assert(!std::is_convertible_v<fairkv::const_keep_plan_view, fairkv::keep_plan_view>);
  plan.view().counts[1] = 3;
  const fairkv::const_keep_plan_view v = plan.view();
  CHECK(v.count(0, 1) == 3);
  CHECK(v.counts == cref.view().counts);
}
