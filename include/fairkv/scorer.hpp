// The Scorer concept: how important is each cached token, per KV head (higher = keep).
//
// A scorer says what it needs through `static constexpr score_source source`; a backend supplies exactly that:
//  - position:  `float operator()(token_info) const`             (nothing is read: e.g. StreamingLLM)
//  - keys:      `float operator()(const key_row<T, C>&, token_info) const` for every element type T and both
//               strides C (e.g. K-Norm)
//  - window_attention / last_attention / observed_attention: the backend computes the attention statistic
//    (SnapKV / TOVA / H2O semantics) from the window's queries and the cached keys, or takes the engine's
//    attention weights; the scorer only carries its parameters (`window`, `kernel`).
//  - external: the caller's own scores (layer_inputs::scores, views/score_view.hpp), read as they are; the
//    backend computes nothing (scorers::external).
// position and keys are open: an engine adds its own scorer as a plain struct. The attention sources and external
// are a closed set: the backends implement each of them themselves and read nothing from the scorer but its
// parameters, so a user type claiming one would silently get the built-in behaviour. Only scorers::snapkv,
// scorers::tova, scorers::h2o and scorers::external may declare them; anything else fails the concept (and
// fairkv::policy says why). An engine with its own scoring pipeline does not write a scorer: it passes its scores
// through scorers::external.
// Every scorer has a `static constexpr const char* name` (error messages and reports use it).
// Scorers are trivially copyable aggregates so they can be passed by value into GPU kernels. The CUDA backend
// calls a position or keys scorer's operator() in a kernel, so it must be marked FAIRKV_HOST_DEVICE there (nvcc
// refuses a host-only call from device code; the CPU backend does not care). examples/custom_scorer shows both.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "fairkv/config.hpp"
#include "fairkv/dtype.hpp"

namespace fairkv {

enum class score_source : std::uint8_t {
  position,            // token index only
  keys,                // one key row at a time
  window_attention,    // attention of the last `window` queries (SnapKV)
  last_attention,      // attention row of the last query, mean over all query heads (TOVA)
  observed_attention,  // attention accumulated over all causal queries, normalised by their count (H2O)
  external,            // scores supplied by the caller, [batch, kv_heads, tokens] (scorers::external)
};

[[nodiscard]] constexpr bool is_attention_source(score_source s) noexcept {
  return s == score_source::window_attention || s == score_source::last_attention ||
         s == score_source::observed_attention;
}

// Where the token being scored sits.
struct token_info {
  std::int64_t index = 0;   // token position in the sequence
  std::int64_t tokens = 0;  // sequence length
  std::int64_t head = 0;    // KV head
  std::int64_t batch = 0;
};

// One key row as a key scorer sees it: element i converted to float. `Contiguous` lets a backend promise
// stride 1 at compile time, so the scorer's loop vectorises.
template <class T, bool Contiguous = false>
struct key_row {
  const T* data = nullptr;
  std::int64_t dim = 0;
  std::int64_t stride = 1;
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr std::int64_t size() const noexcept { return dim; }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr float operator[](std::int64_t i) const noexcept {
    if constexpr (Contiguous)
      return to_float(data[i]);
    else
      return to_float(data[i * stride]);
  }
};

// The sources the backends fill themselves, each reserved for its built-in scorer.
[[nodiscard]] constexpr bool is_reserved_source(score_source s) noexcept {
  return is_attention_source(s) || s == score_source::external;
}

namespace scorers {  // the built-in scorers of the reserved sources (scorers/*.hpp), named here to close them
template <int Window, int Kernel>
struct snapkv;
struct tova;
struct h2o;
struct external;
}  // namespace scorers

namespace detail {

// The one type allowed to declare each reserved source.
template <class S>
inline constexpr bool is_builtin_reserved_scorer_v = false;
template <int Window, int Kernel>
inline constexpr bool is_builtin_reserved_scorer_v<scorers::snapkv<Window, Kernel>> = true;
template <>
inline constexpr bool is_builtin_reserved_scorer_v<scorers::tova> = true;
template <>
inline constexpr bool is_builtin_reserved_scorer_v<scorers::h2o> = true;
template <>
inline constexpr bool is_builtin_reserved_scorer_v<scorers::external> = true;

template <class S, score_source Source>
struct scorer_interface : std::true_type {};

template <class S>
struct scorer_interface<S, score_source::position>
    : std::bool_constant<requires(const S& s, token_info i) {
        { s(i) } -> std::convertible_to<float>;
      }> {};

// The backends pass a stride-1 row (key_row<T, true>) where the layout allows and a strided one elsewhere.
template <class S, class T>
concept key_scorer_for = requires(const S& s, key_row<T, true> contiguous, key_row<T, false> strided, token_info i) {
  { s(contiguous, i) } -> std::convertible_to<float>;
  { s(strided, i) } -> std::convertible_to<float>;
};

template <class S>
struct scorer_interface<S, score_source::keys>
    : std::bool_constant<key_scorer_for<S, float> && key_scorer_for<S, half_t> && key_scorer_for<S, bfloat16_t>> {};

template <class S>
struct scorer_interface<S, score_source::window_attention>
    : std::bool_constant<requires(const S& s) {
        { s.window } -> std::convertible_to<std::int32_t>;
        { s.kernel } -> std::convertible_to<std::int32_t>;
      }> {};

// The planners branch on `source` with if constexpr, so it must be a constant expression.
template <class S>
concept has_source = requires { typename std::integral_constant<score_source, S::source>; };

template <class S>
concept has_name = requires {
  { S::name } -> std::convertible_to<const char*>;
};

// Each requirement on its own, so fairkv::policy can say which one a type misses (policy.hpp).
template <class S>
struct scorer_requirements {
  static constexpr bool aggregate = std::is_trivially_copyable_v<S> && std::is_standard_layout_v<S>;
  static constexpr bool source = has_source<S>;
  static constexpr bool name = has_name<S>;
  static constexpr bool builtin_source = [] {
    if constexpr (has_source<S>)
      return !is_reserved_source(S::source) || is_builtin_reserved_scorer_v<S>;
    else
      return true;
  }();
  static constexpr bool interface = [] {
    if constexpr (has_source<S>)
      return scorer_interface<S, S::source>::value;
    else
      return true;
  }();
  static constexpr bool all = aggregate && source && name && builtin_source && interface;
};

}  // namespace detail

template <class S>
concept Scorer = detail::scorer_requirements<S>::all;

}  // namespace fairkv
