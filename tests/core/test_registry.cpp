// The registry (include/fairkv/registry.hpp) is the one list of built-ins: parse, dispatch, the CLIs, Python and
// the README all follow it. These cases hold it to what its users rely on, with the expected names written out by
// hand (an independent copy: a renamed or dropped built-in fails here, not in a user's config file).
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fairkv/fairkv.hpp"

namespace {

namespace reg = fairkv::registry;

template <class Table>
std::vector<std::string> names(const Table& t) {
  std::vector<std::string> out;
  for (const auto& e : t) out.emplace_back(e.name);
  return out;
}

// The parts dispatch hands over, by their type names.
struct seen {
  std::string scorer, selector, allocator;
};
seen dispatched(const fairkv::policy_spec& spec) {
  seen s;
  const fairkv::result r = fairkv::dispatch(spec, [&](const auto& p) -> fairkv::result {
    s = {p.scorer.name, p.selector.name, p.allocator.name};
    return {};
  });
  CHECK(r.ok());
  return s;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The README paragraph that starts with `- **<title>**` (up to the next bullet).
std::string readme_bullet(const std::string& readme, const std::string& title) {
  const std::string start = "- **" + title + "**";
  const std::size_t b = readme.find(start);
  REQUIRE_MESSAGE(b != std::string::npos, "README.md has no bullet ", start);
  const std::size_t e = readme.find("\n- ", b + start.size());
  return readme.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

}  // namespace

TEST_CASE("registry: the built-ins, in order, by the names users type") {
  CHECK(names(reg::builtin_scorers) ==
        std::vector<std::string>{"knorm", "streaming_llm", "snapkv", "tova", "h2o", "external", "random"});
  CHECK(names(reg::builtin_selectors) == std::vector<std::string>{"per_head", "union_heads", "head_adaptive"});
  CHECK(names(reg::builtin_allocators) == std::vector<std::string>{"uniform", "whitelist", "fair", "fair_with_whitelist",
                                                                   "debias", "fair_paper", "prioritized"});
  CHECK(std::string_view(reg::scorer_names.data()) == "knorm, streaming_llm, snapkv, tova, h2o, external, random");
  CHECK(std::string_view(reg::selector_names.data()) == "per_head, union_heads, head_adaptive");
  CHECK(std::string_view(reg::allocator_names.data()) ==
        "uniform, whitelist, fair, fair_with_whitelist, debias, fair_paper, prioritized");
  // What each scorer reads, which the runner's prefill capture is chosen by.
  CHECK(reg::info(fairkv::scorer_kind::knorm)->source == fairkv::score_source::keys);
  CHECK(reg::info(fairkv::scorer_kind::streaming_llm)->source == fairkv::score_source::position);
  CHECK(reg::info(fairkv::scorer_kind::snapkv)->source == fairkv::score_source::window_attention);
  CHECK(reg::info(fairkv::scorer_kind::tova)->source == fairkv::score_source::last_attention);
  CHECK(reg::info(fairkv::scorer_kind::h2o)->source == fairkv::score_source::observed_attention);
  CHECK(reg::info(fairkv::scorer_kind::external)->source == fairkv::score_source::external);
  CHECK(reg::info(fairkv::scorer_kind::random)->source == fairkv::score_source::position);
  CHECK(reg::info(fairkv::allocator_kind::fair)->uses_segments);
  CHECK_FALSE(reg::info(fairkv::allocator_kind::fair)->uses_whitelist);
  CHECK(reg::info(fairkv::allocator_kind::whitelist)->uses_whitelist);
  CHECK_FALSE(reg::info(fairkv::allocator_kind::uniform)->uses_segments);
  CHECK(reg::info(static_cast<fairkv::scorer_kind>(200)) == nullptr);
}

TEST_CASE("registry: parse maps every name and alias to its kind, and names them all when it refuses") {
  for (const auto& e : reg::builtin_scorers) {
    fairkv::scorer_kind k{};
    REQUIRE(fairkv::parse(e.name, k).ok());
    CHECK(k == e.kind);
    CHECK(reg::info(k)->name == e.name);
  }
  for (const auto& e : reg::builtin_selectors) {
    fairkv::selection_kind k{};
    REQUIRE(fairkv::parse(e.name, k).ok());
    CHECK(k == e.kind);
  }
  for (const auto& e : reg::builtin_allocators) {
    fairkv::allocator_kind k{};
    REQUIRE(fairkv::parse(e.name, k).ok());
    CHECK(k == e.kind);
  }
  fairkv::scorer_kind s{};
  REQUIRE(fairkv::parse("observed_attention", s).ok());  // kvpress's name for H2O
  CHECK(s == fairkv::scorer_kind::h2o);
  fairkv::selection_kind sel{};
  REQUIRE(fairkv::parse("union", sel).ok());
  CHECK(sel == fairkv::selection_kind::union_heads);

  const fairkv::result bad = fairkv::parse("KNorm", s);  // names are case-sensitive
  CHECK(bad.code() == fairkv::status::invalid_argument);
  CHECK(std::string(bad.message()) ==
        "unknown scorer 'KNorm' (knorm, streaming_llm, snapkv, tova, h2o, external, random)");
  fairkv::allocator_kind a{};
  CHECK(std::string(fairkv::parse("", a).message()) ==
        "unknown allocator '' (uniform, whitelist, fair, fair_with_whitelist, debias, fair_paper, prioritized)");
  CHECK(std::string(fairkv::parse("per-head", sel).message()) ==
        "unknown selector 'per-head' (per_head, union_heads, head_adaptive)");
}

TEST_CASE("registry: dispatch builds the part each kind names, with the spec's parameters") {
  for (const auto& sc : reg::builtin_scorers)
    for (const auto& se : reg::builtin_selectors)
      for (const auto& al : reg::builtin_allocators) {
        fairkv::policy_spec spec;
        spec.scorer = sc.kind;
        spec.selector = se.kind;
        spec.allocator = al.kind;
        const seen s = dispatched(spec);
        CHECK(s.scorer == sc.name);
        CHECK(s.selector == se.name);
        CHECK(s.allocator == al.name);
      }

  const fairkv::segment_priority prio[2] = {{2.0f, 0.25f}, {1.0f, 0.0f}};
  fairkv::policy_spec spec;
  spec.window = 16;
  spec.kernel = 7;
  spec.n_sink = 9;
  spec.alpha_safeguard = 0.35f;
  spec.lambda = 0.25f;
  spec.sinks = 3;
  spec.paper_sinks = 1;
  spec.boundary = 2;
  spec.priorities = prio;
  spec.remainder_priority = {0.5f, 0.0f};
  spec.selector = fairkv::selection_kind::head_adaptive;
  // dispatch instantiates every combination, so a check reads a part's members only once its type is the one
  // expected; any other policy reaching it is a failure.
  auto check = [&](auto expected_scorer, auto expected_allocator, auto want) {
    using S = decltype(expected_scorer);
    using A = decltype(expected_allocator);
    bool checked = false;
    const fairkv::result r = fairkv::dispatch(spec, [&](const auto& p) -> fairkv::result {
      using P = std::decay_t<decltype(p)>;
      if constexpr (std::is_same_v<typename P::scorer_type, S> && std::is_same_v<typename P::allocator_type, A> &&
                    std::is_same_v<typename P::selector_type, fairkv::selectors::head_adaptive>) {
        CHECK(p.selector.alpha_safeguard == doctest::Approx(0.35f));
        want(p);
        checked = true;
      }
      return {};
    });
    CHECK(r.ok());
    CHECK(checked);
  };
  spec.scorer = fairkv::scorer_kind::snapkv;
  spec.allocator = fairkv::allocator_kind::debias;
  check(fairkv::scorers::snapkv<>{}, fairkv::allocators::debias{}, [](const auto& p) {
    CHECK(p.scorer.window == 16);
    CHECK(p.scorer.kernel == 7);
    CHECK(p.allocator.lambda == doctest::Approx(0.25f));
    CHECK(p.allocator.protect.n_sink == 3);
    CHECK(p.allocator.protect.boundary == 2);
  });
  spec.scorer = fairkv::scorer_kind::streaming_llm;
  spec.allocator = fairkv::allocator_kind::fair_paper;
  check(fairkv::scorers::streaming_llm<>{}, fairkv::allocators::fair_paper{}, [](const auto& p) {
    CHECK(p.scorer.n_sink == 9);
    CHECK(p.allocator.protect.n_sink == 1);  // the paper's own default, not the fair allocators' sinks
    CHECK(p.allocator.protect.boundary == 2);
  });
  spec.allocator = fairkv::allocator_kind::fair_with_whitelist;
  check(fairkv::scorers::streaming_llm<>{}, fairkv::allocators::fair_with_whitelist{}, [](const auto& p) {
    CHECK(p.allocator.protect.n_sink == 3);
    CHECK(p.allocator.protect.boundary == 2);
  });
  spec.allocator = fairkv::allocator_kind::prioritized;
  check(fairkv::scorers::streaming_llm<>{}, fairkv::allocators::prioritized{}, [&](const auto& p) {
    CHECK(p.allocator.priorities.data() == prio);
    CHECK(p.allocator.priorities.size() == 2);
    CHECK(p.allocator.remainder.weight == doctest::Approx(0.5f));
    CHECK(p.allocator.protect.n_sink == 3);
  });
}

TEST_CASE("registry: a kind that is no enumerator falls back to the first entry (knorm, per_head, uniform)") {
  fairkv::policy_spec spec;
  spec.scorer = static_cast<fairkv::scorer_kind>(99);
  spec.selector = static_cast<fairkv::selection_kind>(99);
  spec.allocator = static_cast<fairkv::allocator_kind>(99);
  const seen s = dispatched(spec);
  CHECK(s.scorer == "knorm");
  CHECK(s.selector == "per_head");
  CHECK(s.allocator == "uniform");
}

TEST_CASE("registry: the README lists every built-in in its bullet") {
  const std::string readme = read_file(std::string(FAIRKV_SOURCE_DIR) + "/README.md");
  const std::string sc = readme_bullet(readme, "Scorers"), se = readme_bullet(readme, "Selectors"),
                    al = readme_bullet(readme, "Allocators");
  // "`name" (code spans), appended rather than concatenated: GCC 12 warns (-Wrestrict) on "`" + std::string.
  auto listed = [](const std::string& bullet, std::string_view name) {
    std::string needle(1, '`');
    needle.append(name);
    return bullet.find(needle) != std::string::npos;
  };
  for (const auto& e : reg::builtin_scorers) CHECK_MESSAGE(listed(sc, e.name), e.name);
  for (const auto& e : reg::builtin_selectors) CHECK_MESSAGE(listed(se, e.name), e.name);
  for (const auto& e : reg::builtin_allocators) CHECK_MESSAGE(listed(al, e.name), e.name);
}
