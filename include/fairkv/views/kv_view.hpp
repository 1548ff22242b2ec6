// A non-owning view of one layer's K (or V) in engine memory: [batch, heads, tokens, head_dim] with explicit
// strides in elements. Covers HF-style [B, H, L, D], llama.cpp-style rows [L][H*D] and transposed V
// ([H*D][L]: stride_d = L, stride_t = 1), and padded batches of sequences of different lengths ([B, H, Lmax, D]
// plus each sequence's length, as batched engines keep them). fairkv never copies what a view points at.
#pragma once

#include <cstdint>
#include <type_traits>

#include "fairkv/config.hpp"
#include "fairkv/detail/checked_math.hpp"
#include "fairkv/dtype.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/footprint.hpp"

namespace fairkv {

template <class T>
struct kv_view {
  static_assert(is_element_type_v<std::remove_const_t<T>>,
                "fairkv::kv_view<T>: T must be float, fairkv::half_t or fairkv::bfloat16_t (optionally const)");
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  T* data = nullptr;       // [batch, heads, tokens, head_dim] addressed through the strides below
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t tokens = 0;
  std::int64_t head_dim = 0;
  std::int64_t stride_batch = 0;  // in elements
  std::int64_t stride_head = 0;
  std::int64_t stride_token = 0;
  std::int64_t stride_dim = 1;
  // A padded batch: sequence b holds lengths[b] <= tokens tokens (rows [lengths[b], tokens) are padding, never
  // read). Null: every sequence holds `tokens`. The array lives where `data` does (host for the CPU backend, device
  // memory for CUDA, whose planner also takes a host copy of it, as FlashInfer's plan() takes its host indptr).
  const std::int32_t* lengths = nullptr;

  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr T* row(std::int64_t b, std::int64_t h, std::int64_t t) const noexcept {
    return data + b * stride_batch + h * stride_head + t * stride_token;
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr std::int64_t tokens_of(std::int64_t b) const noexcept {
    return lengths != nullptr ? lengths[b] : tokens;
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr bool rows_contiguous() const noexcept { return stride_dim == 1; }

  // A view of the same memory with const elements (what scorers read).
  [[nodiscard]] constexpr kv_view<const value_type> as_const() const noexcept {
    return {data, batch, heads, tokens, head_dim, stride_batch, stride_head, stride_token, stride_dim, lengths};
  }
  // T* -> const T* is implicit, so is this. A template whose target names U, so neither nvcc nor clang
  // (-Wclass-conversion, on by default) sees kv_view<const T> converting to itself.
  template <class U = T>
    requires(!std::is_const_v<U>)
  constexpr operator kv_view<const U>() const noexcept {  // NOLINT(google-explicit-constructor)
    return as_const();
  }
};

// The helpers cannot report an error, so a stride whose product overflows is saturated to INT64_MAX: validate()
// then rejects it as an overflow naming that stride, instead of a wrapped value passing or failing as "aliasing".

// [batch, heads, tokens, head_dim] densely packed, head_dim fastest (HF / kvpress layout).
template <class T>
[[nodiscard]] constexpr kv_view<T> make_contiguous_view(T* data, std::int64_t batch, std::int64_t heads,
                                                        std::int64_t tokens, std::int64_t head_dim) noexcept {
  using detail::saturating_mul;
  return {data, batch, heads, tokens, head_dim, saturating_mul(saturating_mul(heads, tokens), head_dim),
          saturating_mul(tokens, head_dim), head_dim, 1};
}

// A cache with room for `capacity` tokens per head of which `tokens` are filled: [batch, heads, capacity, head_dim].
template <class T>
[[nodiscard]] constexpr kv_view<T> make_capacity_view(T* data, std::int64_t batch, std::int64_t heads,
                                                      std::int64_t tokens, std::int64_t capacity,
                                                      std::int64_t head_dim) noexcept {
  using detail::saturating_mul;
  return {data, batch, heads, tokens, head_dim, saturating_mul(saturating_mul(heads, capacity), head_dim),
          saturating_mul(capacity, head_dim), head_dim, 1};
}

// A padded batch, [batch, heads, capacity, head_dim] densely packed, sequence b holding lengths[b] tokens.
template <class T>
[[nodiscard]] constexpr kv_view<T> make_padded_view(T* data, std::int64_t batch, std::int64_t heads,
                                                    std::int64_t capacity, std::int64_t head_dim,
                                                    const std::int32_t* lengths) noexcept {
  kv_view<T> v = make_contiguous_view(data, batch, heads, capacity, head_dim);
  v.lengths = lengths;
  return v;
}

namespace detail {
// [batch, heads, tokens, head_dim] with their strides, named as the fields.
template <class T>
[[nodiscard]] footprint footprint_of(const kv_view<T>& v) noexcept {
  return {reinterpret_cast<std::uintptr_t>(v.data),
          static_cast<std::int64_t>(sizeof(T)),
          4,
          {{v.batch, v.stride_batch, "batch", "stride_batch"},
           {v.heads, v.stride_head, "heads", "stride_head"},
           {v.tokens, v.stride_token, "tokens", "stride_token"},
           {v.head_dim, v.stride_dim, "head_dim", "stride_dim"}}};
}
}  // namespace detail

// Checks that a view describes addressable memory: positive extents, non-negative strides, no two
// (head, token, dim) elements of one batch entry aliasing each other (so an in-place move cannot corrupt), and
// a span whose every offset is computable: the engine's fields are not trusted, so nothing here can overflow and
// a view that would reach past the address space is rejected with the field at fault.
template <class T>
[[nodiscard]] result validate(const kv_view<T>& v, const char* name) noexcept {
  if (v.data == nullptr) return result::error(status::null_pointer, "%s.data is null", name);
  if (v.batch <= 0 || v.heads <= 0 || v.head_dim <= 0 || v.tokens < 0)
    return result::error(status::invalid_shape,
                         "%s has extents [batch %lld, heads %lld, tokens %lld, head_dim %lld]; batch, heads and "
                         "head_dim must be positive and tokens non-negative",
                         name, static_cast<long long>(v.batch), static_cast<long long>(v.heads),
                         static_cast<long long>(v.tokens), static_cast<long long>(v.head_dim));
  if (v.stride_batch < 0 || v.stride_head < 0 || v.stride_token < 0 || v.stride_dim <= 0)
    return result::error(status::invalid_shape, "%s has a negative or zero stride", name);
  const detail::footprint f = detail::footprint_of(v);
  std::int64_t span = 0;
  FAIRKV_TRY(detail::nested_span(f.dims + 1, 3, name, span));  // heads, tokens, head_dim of one batch entry
  if (v.batch > 1) {
    if (v.stride_batch < span)
      return result::error(status::invalid_shape, "%s.stride_batch overlaps the previous batch entry", name);
    std::int64_t step = 0;
    if (!detail::checked_mul(v.stride_batch, v.batch - 1, step) || !detail::checked_add(step, span, span))
      return result::error(status::invalid_shape,
                           "%s.stride_batch = %lld times (batch - 1) = %lld overflows a 64-bit element offset", name,
                           static_cast<long long>(v.stride_batch), static_cast<long long>(v.batch - 1));
  }
  return detail::check_address_range(f, span, name);
}

// A padded view's lengths, read on the host (the CPU backend; the CUDA planner checks its host copy the same way
// and the device array against that copy): each in [0, tokens], so no row past the view is addressed. validate()
// cannot read them, as it also checks views of device memory.
template <class T>
[[nodiscard]] result validate_host_lengths(const kv_view<T>& v, const char* name) noexcept {
  if (v.lengths == nullptr) return {};
  for (std::int64_t b = 0; b < v.batch; ++b)
    if (v.lengths[b] < 0 || v.lengths[b] > v.tokens)
      return result::error(status::invalid_shape, "%s.lengths[%lld] = %d is outside [0, tokens %lld]", name,
                           static_cast<long long>(b), v.lengths[b], static_cast<long long>(v.tokens));
  return {};
}

}  // namespace fairkv
