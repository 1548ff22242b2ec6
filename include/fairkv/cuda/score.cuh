// Whole-sequence scores of every (batch, KV head) row as the CUDA planner computes them without segments:
// cpu::score's counterpart, d_scores[(b * heads + h) * ld + t] for t < tokens. For engines that log or inspect
// what the policy sees, and for holding the device's scores against the plain reference
// (cpu/reference/scores.hpp) directly rather than through the plans they lead to. The tokens SnapKV's window and
// TOVA's last query occupy hold the planner's pads (above every scored token, detail/order.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fairkv/allocators/uniform.hpp"
#include "fairkv/cuda/detail/launch.cuh"
#include "fairkv/cuda/detail/launch_scores.cuh"
#include "fairkv/cuda/detail/plan_setup.cuh"
#include "fairkv/cuda/detail/plan_workspace.cuh"
#include "fairkv/cuda/detail/workspace.cuh"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/selectors/head_adaptive.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cuda {
namespace detail {

// dst[r * ld + t] = src[r * tokens + t]
template <int = 0>
__global__ void copy_scores_kernel(const float* src, std::int64_t rows, std::int64_t tokens, float* dst,
                                   std::int64_t ld) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * tokens;
       i += stride)
    dst[(i / tokens) * ld + i % tokens] = src[i];
}

}  // namespace detail

// Two-phase temp storage, as plan(): with d_temp_storage == nullptr only temp_storage_bytes is written. The inputs'
// checks are plan()'s (a uniform allocator, no segments), made on the host before the first launch.
template <class S, class KeySource, class Q>
[[nodiscard]] result score(void* d_temp_storage, std::size_t& temp_storage_bytes, const S& scorer,
                           const layer_inputs<KeySource, Q>& in, float* d_scores, std::int64_t ld,
                           cudaStream_t stream = nullptr) noexcept {
  // The head-adaptive selector's workspace has no split-selection buffers: the smallest around the scores.
  const policy<S, selectors::head_adaptive, allocators::uniform> pol{scorer, {}, {}};
  detail::batch_params bp;
  detail::plan_workspace w;
  FAIRKV_TRY(detail::build_params(pol, in, {}, {}, keep_target(0.5), nullptr, {}, false, bp,
                                  [&](std::int64_t, const detail::plan_params& p, const detail::attention_params& a) {
                                    bp.one = p;
                                    bp.one_attention = a;
                                    return result{};
                                  }));
  if (d_scores == nullptr) return result::error(status::null_pointer, "d_scores is null");
  if (ld < bp.pitch)
    return result::error(status::invalid_shape, "ld = %lld is smaller than the sequence (%d tokens)",
                         static_cast<long long>(ld), bp.pitch);
  const std::size_t needed = detail::layout<S, selectors::head_adaptive>(nullptr, w, bp);
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = needed;
    return {};
  }
  FAIRKV_TRY(fairkv::detail::check_workspace("temp_storage_bytes", temp_storage_bytes, needed));
  detail::key_launch keys{};
  if constexpr (S::source == score_source::keys) FAIRKV_TRY((detail::prepare_key_launch<S, KeySource>(in.keys, keys)));
  detail::layout<S, selectors::head_adaptive>(detail::align_base(d_temp_storage), w, bp);
  FAIRKV_TRY((detail::launch_scores<S, allocators::uniform, KeySource, Q>(scorer, in, bp, keys, w, stream)));
  const std::int64_t rows = static_cast<std::int64_t>(bp.batch) * bp.heads;
  return detail::launch(detail::copy_scores_kernel<>, detail::grid_for(rows * bp.pitch, detail::elementwise_threads),
                        detail::elementwise_threads, 0, stream, static_cast<const float*>(w.scores), rows,
                        std::int64_t{bp.pitch}, d_scores, ld);
}

}  // namespace fairkv::cuda
