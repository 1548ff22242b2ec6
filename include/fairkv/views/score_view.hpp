// A non-owning, read-only view of importance scores the caller computed itself (fairkv::scorers::external):
// [batch, kv_heads, tokens] floats with explicit strides in elements, higher = keep. It covers a torch/numpy tensor
// of any layout ([B, H, L], token-major [B, L, H], a slice of a wider buffer) without a copy.
#pragma once

#include <cstdint>

#include "fairkv/config.hpp"
#include "fairkv/detail/checked_math.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/footprint.hpp"

namespace fairkv {

struct score_view {
  const float* data = nullptr;  // [batch, heads, tokens] addressed through the strides below
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t tokens = 0;
  std::int64_t stride_batch = 0;  // in elements
  std::int64_t stride_head = 0;
  std::int64_t stride_token = 1;

  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr float at(std::int64_t b, std::int64_t h, std::int64_t t) const noexcept {
    return data[b * stride_batch + h * stride_head + t * stride_token];
  }
};

// [batch, heads, tokens] densely packed, tokens fastest.
[[nodiscard]] constexpr score_view make_contiguous_scores(const float* data, std::int64_t batch, std::int64_t heads,
                                                          std::int64_t tokens) noexcept {
  return {data, batch, heads, tokens, detail::saturating_mul(heads, tokens), tokens, 1};
}

namespace detail {
[[nodiscard]] inline footprint footprint_of(const score_view& v) noexcept {
  return {reinterpret_cast<std::uintptr_t>(v.data),
          static_cast<std::int64_t>(sizeof(float)),
          3,
          {{v.batch, v.stride_batch, "batch", "stride_batch"},
           {v.heads, v.stride_head, "heads", "stride_head"},
           {v.tokens, v.stride_token, "tokens", "stride_token"}}};
}
}  // namespace detail

// The rules of every view (views/kv_view.hpp): non-null, positive extents, non-negative strides, no two elements
// aliasing (a score broadcast over heads with stride 0 is refused like any aliasing view: the caller states the
// scores of every head), and every offset computable.
[[nodiscard]] inline result validate(const score_view& v, const char* name) noexcept {
  if (v.data == nullptr) return result::error(status::null_pointer, "%s.data is null", name);
  if (v.batch <= 0 || v.heads <= 0 || v.tokens <= 0)
    return result::error(status::invalid_shape,
                         "%s has extents [batch %lld, heads %lld, tokens %lld]; all must be positive", name,
                         static_cast<long long>(v.batch), static_cast<long long>(v.heads),
                         static_cast<long long>(v.tokens));
  if (v.stride_batch < 0 || v.stride_head < 0 || v.stride_token < 0)
    return result::error(status::invalid_shape, "%s has a negative stride", name);
  const detail::footprint f = detail::footprint_of(v);
  std::int64_t span = 0;
  FAIRKV_TRY(detail::nested_span(f.dims, 3, name, span));
  return detail::check_address_range(f, span, name);
}

}  // namespace fairkv
