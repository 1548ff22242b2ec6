// Optional key re-rotation (kvpress KeyRerotationPress, SinkCache): after compaction slot j holds the key of
// token indices[j], rotated for position indices[j]; rotating it by (j - indices[j]) gives the key RoPE would
// have produced at position j, so the compacted cache looks like a contiguous one. A separate step, because
// engines that keep original positions (kvpress's default, the paper) must not do it.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fairkv/dtype.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/rope.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/kv_view.hpp"

namespace fairkv::cpu {

// `keys` is the view that was compacted (its sequences' lengths = the plan's); only slots [0, count) are touched.
template <class T>
[[nodiscard]] result rerotate_keys(const_keep_plan_view plan, kv_view<T> keys, const rope_params& rope) noexcept {
  static_assert(!std::is_const_v<T>, "fairkv::cpu::rerotate_keys writes the keys: pass a view of non-const elements");
  FAIRKV_TRY(validate(plan, "plan"));
  FAIRKV_TRY(validate(keys, "keys"));
  const std::int64_t rd = rope.rotary_dim == 0 ? keys.head_dim : rope.rotary_dim;
  if (rd < 2 || rd % 2 != 0 || rd > keys.head_dim)
    return result::error(status::invalid_argument, "rope.rotary_dim = %lld must be even and in [2, head_dim %lld]",
                         static_cast<long long>(rd), static_cast<long long>(keys.head_dim));
  if (!(rope.theta > 1.0f) || !std::isfinite(rope.theta))
    return result::error(status::invalid_argument, "rope.theta = %g must be finite and greater than 1",
                         static_cast<double>(rope.theta));
  if (keys.batch != plan.batch || keys.heads != plan.heads)
    return result::error(status::invalid_plan, "keys are [batch %lld, heads %lld] but the plan is [%lld, %lld]",
                         static_cast<long long>(keys.batch), static_cast<long long>(keys.heads),
                         static_cast<long long>(plan.batch), static_cast<long long>(plan.heads));
  FAIRKV_TRY(validate_host_lengths(keys, "keys"));
  for (std::int64_t b = 0; b < plan.batch; ++b)
    if (keys.tokens_of(b) != plan.lengths[b])
      return result::error(status::invalid_plan, "keys sequence %lld has %lld tokens but the plan was made for %d",
                           static_cast<long long>(b), static_cast<long long>(keys.tokens_of(b)), plan.lengths[b]);
  const std::int64_t half = rd / 2;
  for (std::int64_t b = 0; b < plan.batch; ++b)
    for (std::int64_t h = 0; h < plan.heads; ++h) {
      const std::int32_t* idx = plan.row(b, h);
      for (std::int32_t j = 0; j < plan.count(b, h); ++j) {
        const double delta = static_cast<double>(j) - static_cast<double>(idx[j]);
        if (delta == 0.0) continue;
        T* k = keys.row(b, h, j);
        for (std::int64_t i = 0; i < half; ++i) {
          // Angles in double: positions can be large and float would lose the phase.
          const double inv_freq = std::pow(static_cast<double>(rope.theta), -2.0 * static_cast<double>(i) / static_cast<double>(rd));
          const double angle = delta * inv_freq;
          const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
          const std::int64_t i0 = rope.style == rope_style::half ? i : 2 * i;
          const std::int64_t i1 = rope.style == rope_style::half ? i + half : 2 * i + 1;
          const float x0 = to_float(k[i0 * keys.stride_dim]), x1 = to_float(k[i1 * keys.stride_dim]);
          k[i0 * keys.stride_dim] = from_float<T>(x0 * c - x1 * s);
          k[i1 * keys.stride_dim] = from_float<T>(x1 * c + x0 * s);
        }
      }
    }
  return {};
}

}  // namespace fairkv::cpu
