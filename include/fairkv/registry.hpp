// The built-in scorers, selectors and allocators, listed once. Everything that names them reads this list:
// fairkv::parse and its messages, fairkv::dispatch (dispatch.hpp), the runner's and fairkv-llamacpp's choices and
// --help, the Python package's SCORERS / SELECTORS / ALLOCATORS, and the CUDA parity suite's coverage check; the
// README's lists are checked against it (tests/core/check_registry.py). Adding a built-in is its own header, one
// entry here, and its tests (docs/design-notes.md, "Adding a built-in").
//
// An entry is a type: the policy part it builds (`type`), its key (`kind`), an optional second name accepted on
// input (`alias`), and how it is made from a policy_spec (`make`). The name is the part's own `type::name`, so
// the spelling lives in one place. The tables below (builtin_scorers, ...) are the same entries as plain data for
// code that lists or looks up names at run time.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "fairkv/allocators/debias.hpp"
#include "fairkv/allocators/fair.hpp"
#include "fairkv/allocators/fair_paper.hpp"
#include "fairkv/allocators/prioritized.hpp"
#include "fairkv/allocators/uniform.hpp"
#include "fairkv/allocators/whitelist.hpp"
#include "fairkv/policy_spec.hpp"
#include "fairkv/scorers/external.hpp"
#include "fairkv/scorers/h2o.hpp"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/scorers/random.hpp"
#include "fairkv/scorers/snapkv.hpp"
#include "fairkv/scorers/streaming_llm.hpp"
#include "fairkv/scorers/tova.hpp"
#include "fairkv/selectors/head_adaptive.hpp"
#include "fairkv/selectors/per_head.hpp"
#include "fairkv/selectors/union_heads.hpp"

namespace fairkv::registry {

template <class... Entries>
struct list {};

// A part with no run-time parameters and no alias; an entry with either derives from it and redefines `make` or
// `alias`.
template <auto Kind, class T>
struct simple {
  using type = T;
  static constexpr auto kind = Kind;
  static constexpr std::string_view alias{};
  [[nodiscard]] static constexpr T make(const policy_spec&) noexcept { return T{}; }
};

// ---- scorers: the first entry is what an out-of-range scorer_kind falls back to ----
struct streaming_llm_entry : simple<scorer_kind::streaming_llm, scorers::streaming_llm<>> {
  [[nodiscard]] static constexpr type make(const policy_spec& spec) noexcept {
    type s{};
    s.n_sink = spec.n_sink;
    return s;
  }
};
struct snapkv_entry : simple<scorer_kind::snapkv, scorers::snapkv<>> {
  [[nodiscard]] static constexpr type make(const policy_spec& spec) noexcept {
    type s{};
    s.window = spec.window;
    s.kernel = spec.kernel;
    return s;
  }
};
struct random_entry : simple<scorer_kind::random, scorers::random> {
  [[nodiscard]] static constexpr type make(const policy_spec& spec) noexcept { return type{spec.seed}; }
};
struct h2o_entry : simple<scorer_kind::h2o, scorers::h2o> {
  static constexpr std::string_view alias = "observed_attention";  // kvpress's name for the press
};
using scorers = list<simple<scorer_kind::knorm, fairkv::scorers::knorm>, streaming_llm_entry, snapkv_entry,
                     simple<scorer_kind::tova, fairkv::scorers::tova>, h2o_entry,
                     simple<scorer_kind::external, fairkv::scorers::external>, random_entry>;

// ---- selectors ----
struct union_heads_entry : simple<selection_kind::union_heads, fairkv::selectors::union_heads> {
  static constexpr std::string_view alias = "union";  // the selector's first name
};
struct head_adaptive_entry : simple<selection_kind::head_adaptive, fairkv::selectors::head_adaptive> {
  [[nodiscard]] static constexpr type make(const policy_spec& spec) noexcept { return type{spec.alpha_safeguard}; }
};
using selectors =
    list<simple<selection_kind::per_head, fairkv::selectors::per_head>, union_heads_entry, head_adaptive_entry>;

// ---- allocators ----
// The segment-aware allocators protect spec.sinks leading tokens and spec.boundary tokens at each segment end.
[[nodiscard]] constexpr allocators::protection protection_of(const policy_spec& spec) noexcept {
  return {spec.sinks, spec.boundary};
}
template <allocator_kind Kind, class T>
struct protecting : simple<Kind, T> {
  [[nodiscard]] static constexpr T make(const policy_spec& spec) noexcept { return T{protection_of(spec)}; }
};
struct debias_entry : simple<allocator_kind::debias, fairkv::allocators::debias> {
  [[nodiscard]] static constexpr type make(const policy_spec& spec) noexcept {
    return type{spec.lambda, protection_of(spec)};
  }
};
struct fair_paper_entry : simple<allocator_kind::fair_paper, fairkv::allocators::fair_paper> {
  // The paper's presses keep no sinks of their own: fair_paper has its own default (policy_spec::paper_sinks).
  [[nodiscard]] static constexpr type make(const policy_spec& spec) noexcept {
    return type{{spec.paper_sinks, spec.boundary}};
  }
};
struct prioritized_entry : simple<allocator_kind::prioritized, fairkv::allocators::prioritized> {
  [[nodiscard]] static constexpr type make(const policy_spec& spec) noexcept {
    return type{spec.priorities, spec.remainder_priority, protection_of(spec)};
  }
};
using allocators = list<simple<allocator_kind::uniform, fairkv::allocators::uniform>,
                        simple<allocator_kind::whitelist, fairkv::allocators::whitelist>,
                        protecting<allocator_kind::fair, fairkv::allocators::fair>,
                        protecting<allocator_kind::fair_with_whitelist, fairkv::allocators::fair_with_whitelist>,
                        debias_entry, fair_paper_entry, prioritized_entry>;

// ---- the same entries as data ----
struct scorer_info {
  scorer_kind kind;
  std::string_view name, alias;
  score_source source;  // what the backend reads to score: keys, positions, attention statistics, the caller's
};
struct selector_info {
  selection_kind kind;
  std::string_view name, alias;
};
struct allocator_info {
  allocator_kind kind;
  std::string_view name, alias;
  bool uses_segments, uses_whitelist;
};

namespace detail {
template <class... E>
constexpr auto scorer_table(list<E...>) {
  return std::array<scorer_info, sizeof...(E)>{{{E::kind, E::type::name, E::alias, E::type::source}...}};
}
template <class... E>
constexpr auto selector_table(list<E...>) {
  return std::array<selector_info, sizeof...(E)>{{{E::kind, E::type::name, E::alias}...}};
}
template <class... E>
constexpr auto allocator_table(list<E...>) {
  return std::array<allocator_info, sizeof...(E)>{
      {{E::kind, E::type::name, E::alias, E::type::uses_segments, E::type::uses_whitelist}...}};
}

// Every enumerator 0..N-1 has exactly one entry, and no name or alias is taken twice: parse() is a bijection.
template <class Table>
constexpr bool well_formed(const Table& t) {
  for (std::size_t k = 0; k < t.size(); ++k) {
    int hits = 0;
    for (const auto& e : t) hits += static_cast<std::size_t>(e.kind) == k;
    if (hits != 1) return false;
  }
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i].name.empty() || t[i].name == t[i].alias) return false;
    for (std::size_t j = 0; j < t.size(); ++j) {
      if (i == j) continue;
      if (t[i].name == t[j].name || t[i].name == t[j].alias) return false;
      if (!t[i].alias.empty() && t[i].alias == t[j].alias) return false;
    }
  }
  return true;
}

// "a, b, c" with a terminating NUL, for messages that list the valid names.
template <const auto& Table>
constexpr std::size_t joined_size() {
  std::size_t n = 1;
  for (const auto& e : Table) n += e.name.size() + 2;
  return n - 2;
}
template <const auto& Table>
constexpr std::array<char, joined_size<Table>()> join_names() {
  std::array<char, joined_size<Table>()> out{};
  std::size_t i = 0;
  for (const auto& e : Table) {
    if (i != 0) {
      out[i++] = ',';
      out[i++] = ' ';
    }
    for (char c : e.name) out[i++] = c;
  }
  out[i] = '\0';
  return out;
}
}  // namespace detail

inline constexpr auto builtin_scorers = detail::scorer_table(scorers{});
inline constexpr auto builtin_selectors = detail::selector_table(selectors{});
inline constexpr auto builtin_allocators = detail::allocator_table(allocators{});
static_assert(detail::well_formed(builtin_scorers), "fairkv::registry: every scorer_kind needs exactly one entry");
static_assert(detail::well_formed(builtin_selectors), "fairkv::registry: every selection_kind needs exactly one entry");
static_assert(detail::well_formed(builtin_allocators),
              "fairkv::registry: every allocator_kind needs exactly one entry");

// The names, comma-separated (NUL-terminated: `.data()` is a C string).
inline constexpr auto scorer_names = detail::join_names<builtin_scorers>();
inline constexpr auto selector_names = detail::join_names<builtin_selectors>();
inline constexpr auto allocator_names = detail::join_names<builtin_allocators>();

// The entry of a kind; nullptr for a value that is not an enumerator (a cast from bad input).
template <class Table, class Kind>
[[nodiscard]] constexpr const typename Table::value_type* find(const Table& t, Kind kind) noexcept {
  for (const auto& e : t)
    if (e.kind == kind) return &e;
  return nullptr;
}
[[nodiscard]] constexpr const scorer_info* info(scorer_kind k) noexcept { return find(builtin_scorers, k); }
[[nodiscard]] constexpr const selector_info* info(selection_kind k) noexcept { return find(builtin_selectors, k); }
[[nodiscard]] constexpr const allocator_info* info(allocator_kind k) noexcept { return find(builtin_allocators, k); }

// The entry a name or alias selects; nullptr when none does.
template <class Table>
[[nodiscard]] constexpr const typename Table::value_type* lookup(const Table& t, std::string_view name) noexcept {
  for (const auto& e : t)
    if (name == e.name || (!e.alias.empty() && name == e.alias)) return &e;
  return nullptr;
}

}  // namespace fairkv::registry
