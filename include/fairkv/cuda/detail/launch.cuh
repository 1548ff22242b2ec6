// Every kernel launch of the backend goes through launch(), and every kernel's dynamic shared memory through
// dynamic_shared<T>(), so that the same kernels also run under tests/cuda/emu: a host emulator (enabled by
// FAIRKV_CUDA_EMULATION, never in a real CUDA build) that executes them on CPU threads, so their logic is
// checked against the CPU oracle on machines without a GPU. With nvcc these are a plain <<<>>> launch and one
// extern __shared__ array (one name and one type for every kernel, so their declarations never conflict).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/cuda/error.cuh"
#include "fairkv/status.hpp"

namespace fairkv::cuda::detail {

// Launches and checks the launch at once (CUB checks each of its launches the same way): a configuration the
// device refuses stops the caller at that launch with a status, before it enqueues the next kernel, and the
// error is consumed so that it is not reported again by an unrelated call later.
template <class... Params, class... Args>
[[nodiscard]] result launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_smem,
                            cudaStream_t stream, Args&&... args) noexcept {
#if defined(FAIRKV_CUDA_EMULATION)
  ::fairkv_emu::launch(kernel, grid, block, dynamic_smem, stream, std::forward<Args>(args)...);
#else
  kernel<<<grid, block, dynamic_smem, stream>>>(std::forward<Args>(args)...);
#endif
  return from_cuda(cudaGetLastError());
}

// Whether a kernel with `static_bytes` of its own may launch with `bytes` of dynamic shared memory on the current
// device: up to 48 KiB every launch may; beyond, up to what the device allows one block after opting in
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 163 KiB on A100, 227 KiB on H100).
[[nodiscard]] inline result check_dynamic_smem(std::size_t bytes, std::size_t static_bytes, const char* what) noexcept {
  if (bytes + static_bytes <= default_dynamic_smem_bytes) return {};
  int device = 0, optin = 0;
  FAIRKV_CUDA_TRY(cudaGetDevice(&device));
  FAIRKV_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes + static_bytes > static_cast<std::size_t>(optin))
    return result::error(status::not_supported,
                         "%s needs %zu bytes of shared memory per block; device %d allows at most %d", what,
                         bytes + static_bytes, device, optin);
  return {};
}

// Checks, then lets `kernel` launch with `bytes` of dynamic shared memory: above 48 KiB the kernel opts in
// (cudaFuncAttributeMaxDynamicSharedMemorySize). Host only and stream-free: call it before the launches (or the
// graph capture), as planner::initialize does, not between the launches of a capture.
template <class... Params>
[[nodiscard]] result reserve_dynamic_smem(void (*kernel)(Params...), std::size_t bytes, std::size_t static_bytes,
                                          const char* what) noexcept {
  if (bytes + static_bytes <= default_dynamic_smem_bytes) return {};
  FAIRKV_TRY(check_dynamic_smem(bytes, static_bytes, what));
  return from_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The block's dynamic shared memory, 16-byte aligned (the vector paths read and write it as uint4).
template <class T>
__device__ inline T* dynamic_shared() {
#if defined(FAIRKV_CUDA_EMULATION)
  return static_cast<T*>(::fairkv_emu::dynamic_shared_memory());
#else
  extern __shared__ __align__(16) unsigned char fairkv_dynamic_smem[];
  return reinterpret_cast<T*>(fairkv_dynamic_smem);
#endif
}

}  // namespace fairkv::cuda::detail
