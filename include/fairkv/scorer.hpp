// The Scorer concept: how important is each cached token, per KV head (higher = keep).
//
// A scorer says what it needs through `static constexpr score_source source`; a backend supplies exactly that:
//  - position:  `float operator()(token_info) const`             (nothing is read: e.g. StreamingLLM)
//  - keys:      `float operator()(const key_row<T>&, token_info) const` for any element type T (e.g. K-Norm)
//  - window_attention / last_attention / observed_attention: the backend computes the attention statistic
//    (SnapKV / TOVA / H2O semantics) from the window's queries and the cached keys, or takes the engine's
//    attention weights; the scorer only carries its parameters (`window`, `kernel`).
// Scorers are trivially copyable aggregates so they can be passed by value into GPU kernels.
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

namespace detail {
template <class S, score_source Source>
struct scorer_interface : std::true_type {};  // attention scorers: parameters are checked by the backend

template <class S>
struct scorer_interface<S, score_source::position>
    : std::bool_constant<requires(const S& s, token_info i) {
        { s(i) } -> std::convertible_to<float>;
      }> {};

template <class S>
struct scorer_interface<S, score_source::keys>
    : std::bool_constant<requires(const S& s, key_row<float> rf, key_row<half_t> rh, key_row<bfloat16_t> rb,
                                  token_info i) {
        { s(rf, i) } -> std::convertible_to<float>;
        { s(rh, i) } -> std::convertible_to<float>;
        { s(rb, i) } -> std::convertible_to<float>;
      }> {};

template <class S>
struct scorer_interface<S, score_source::window_attention>
    : std::bool_constant<requires(const S& s) {
        { s.window } -> std::convertible_to<std::int32_t>;
        { s.kernel } -> std::convertible_to<std::int32_t>;
      }> {};

template <class S>
concept has_source = requires {
  { S::source } -> std::convertible_to<score_source>;
};
}  // namespace detail

template <class S>
concept Scorer = std::is_trivially_copyable_v<S> && std::is_standard_layout_v<S> && detail::has_source<S> &&
                 detail::scorer_interface<S, S::source>::value;

}  // namespace fairkv
