// Every kernel launch of the backend goes through launch(), and every kernel's dynamic shared memory through
// dynamic_shared<T>(), so that the same kernels also run under tests/cuda/emu: a host emulator (enabled by
// FAIRKV_CUDA_EMULATION, never in a real CUDA build) that executes them on CPU threads, so their logic is
// checked against the CPU oracle on machines without a GPU. With nvcc these are a plain <<<>>> launch and one
// extern __shared__ array (one name and one type for every kernel, so their declarations never conflict).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace fairkv::cuda::detail {

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream,
            Args&&... args) {
#if defined(FAIRKV_CUDA_EMULATION)
  ::fairkv_emu::launch(kernel, grid, block, dynamic_smem, stream, std::forward<Args>(args)...);
#else
  kernel<<<grid, block, dynamic_smem, stream>>>(std::forward<Args>(args)...);
#endif
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
