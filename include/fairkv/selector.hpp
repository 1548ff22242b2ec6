// The Selector concept: how the per-(head, segment) budgets become token sets.
// A selector is a strategy the backends implement (per-head top-k, one set for all heads, or AdaKV-style
// head-adaptive); the type carries its kind and parameters and is passed by value into kernels.
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

template <class S>
concept Selector = std::is_trivially_copyable_v<S> && std::is_standard_layout_v<S> && requires {
  { S::kind } -> std::convertible_to<selection_kind>;
} && (S::kind != selection_kind::head_adaptive || requires(const S& s) {
  { s.alpha_safeguard } -> std::convertible_to<float>;
});

}  // namespace fairkv
