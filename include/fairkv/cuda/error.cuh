// The CUDA layer's half of the library's one error channel: a cudaError_t becomes a fairkv::result
// (status::device_error with the runtime's own message), so callers see one type whichever backend failed.
#pragma once

#include <cuda_runtime.h>

#include "fairkv/status.hpp"

namespace fairkv::cuda {

[[nodiscard]] inline result from_cuda(cudaError_t e) noexcept {
  if (e == cudaSuccess) return {};
  return result::error(status::device_error, "CUDA error %d (%s): %s", static_cast<int>(e), cudaGetErrorName(e),
                       cudaGetErrorString(e));
}

}  // namespace fairkv::cuda

// Early return of a failed CUDA runtime call as a fairkv::result.
#define FAIRKV_CUDA_TRY(expr) FAIRKV_TRY(::fairkv::cuda::from_cuda(expr))
