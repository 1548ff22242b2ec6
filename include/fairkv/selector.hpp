// The Selector concept: how the per-(head, segment) budgets become token sets.
// A selector is a strategy the backends implement (per-head top-k, one set for all heads, or AdaKV-style
// head-adaptive); the type carries its kind and parameters and is passed by value into kernels.
//
// The kinds are a closed set: each backend implements every kind itself and reads nothing from the selector but
// its parameters, so a user type claiming a kind would silently run the built-in strategy. Only the built-in type
// of each kind (selectors/per_head.hpp, union_heads.hpp, head_adaptive.hpp) satisfies the concept; a new strategy
// is a new kind implemented by every backend, not a user struct.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

namespace fairkv {

enum class selection_kind : std::uint8_t {
  per_head,       // each KV head keeps its own top-b tokens (kvpress default)
  union_heads,    // one token set for every head, chosen on the head-mean score (frees whole pages)
  head_adaptive,  // AdaKV: per-head safeguard, then a layer-global choice across heads (ragged lengths)
};

namespace selectors {  // the built-in selectors (selectors/*.hpp), named here to close the set of kinds
struct per_head;
struct union_heads;
struct head_adaptive;
}  // namespace selectors

namespace detail {

// The planners branch on `kind` with if constexpr, so it must be a constant expression.
template <class S>
concept has_selection_kind = requires { typename std::integral_constant<selection_kind, S::kind>; };

template <class S>
inline constexpr bool is_builtin_selector_v =
    std::same_as<S, selectors::per_head> || std::same_as<S, selectors::union_heads> ||
    std::same_as<S, selectors::head_adaptive>;

// Each requirement on its own, so fairkv::policy can say which one a type misses (policy.hpp).
template <class S>
struct selector_requirements {
  static constexpr bool aggregate = std::is_trivially_copyable_v<S> && std::is_standard_layout_v<S>;
  static constexpr bool kind = has_selection_kind<S>;
  static constexpr bool name = requires {
    { S::name } -> std::convertible_to<const char*>;
  };
  static constexpr bool builtin = is_builtin_selector_v<S>;
  static constexpr bool alpha = [] {
    if constexpr (has_selection_kind<S>) {
      if constexpr (S::kind == selection_kind::head_adaptive)
        return requires(const S& s) {
          { s.alpha_safeguard } -> std::convertible_to<float>;
        };
    }
    return true;
  }();
  static constexpr bool all = aggregate && kind && name && builtin && alpha;
};

}  // namespace detail

template <class S>
concept Selector = detail::selector_requirements<S>::all;

}  // namespace fairkv
