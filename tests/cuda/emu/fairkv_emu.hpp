// fairkv's CUDA emulator, for tests only: it runs the CUDA backend's kernels, unchanged, on CPU threads, so that
// their logic is checked against the CPU oracle on machines without a GPU (CI has none). It is NOT a GPU: it
// checks no memory model, no timing and no real warp behaviour, and a run under it is reported as "emulated".
//
// What it is:
//   * the headers the backend includes (cuda_runtime.h, cub/block/*, cooperative_groups.h, cuda/atomic), found
//     before the toolkit's because tests/cuda/emu comes first on the include path; compiled by the host C++
//     compiler with -DFAIRKV_CUDA_EMULATION (fairkv/cuda/detail/launch.cuh then launches through here);
//   * a grid runs on a pool of worker OS threads (resident blocks, really concurrent, so the cross-block
//     protocols of the compaction and the split selection run with real races); each block's threads are fibers
//     on its worker, switched only at __syncthreads and warp collectives; `__shared__` is per-worker storage;
//   * strict where CUDA says "undefined": __syncthreads after some threads of the block exited, a warp
//     collective whose lanes disagree on the mask, a deadlocked block, an invalid launch configuration, a
//     memcpy outside an allocation, an unsafe call while a stream is captured. Fresh allocations and dynamic
//     shared memory are filled with garbage, and CUB reductions give their result to thread 0 only.
//   * legal but weaker than hardware: a coalesced group is the calling thread alone (a valid outcome under
//     independent thread scheduling), and fibers of one block interleave only at barriers, alternating their
//     order from one round to the next.
#pragma once

#if !defined(FAIRKV_CUDA_EMULATION)
#error "tests/cuda/emu is fairkv's CUDA emulator: compile with -DFAIRKV_CUDA_EMULATION (and never with nvcc)"
#endif

#include <math.h>  // ::expf, ::fmaxf, ::isnan, INFINITY in the global namespace, as CUDA's math API has them

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- execution space and memory qualifiers ----------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)
// Blocks of one worker run one after the other, so per-worker (thread_local) storage is per-block storage.
#define __shared__ static thread_local

// ---- vector and launch types ------------------------------------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) noexcept : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorStreamCaptureUnmatched = 903,
};
enum cudaFuncAttribute : int {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
enum cudaDeviceAttr : int {
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode : int {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
inline constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;

struct CUstream_st;
struct CUgraph_st;
struct CUgraphExec_st;
using cudaStream_t = CUstream_st*;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;

struct cudaDeviceProp {
  char name[256];
  int major, minor;
  int multiProcessorCount;
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlock;
  int maxThreadsPerBlock;
};

// ---- runtime API (fairkv_emu.cpp) -------------------------------------------------------------------------------
const char* cudaGetErrorName(cudaError_t e) noexcept;
const char* cudaGetErrorString(cudaError_t e) noexcept;
cudaError_t cudaGetLastError() noexcept;
cudaError_t cudaGetDeviceCount(int* count) noexcept;
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) noexcept;
cudaError_t cudaGetDevice(int* device) noexcept;
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) noexcept;
namespace fairkv_emu {
cudaError_t set_function_attribute(const void* kernel, cudaFuncAttribute attr, int value) noexcept;
}
// CUDA's template overload (what a kernel name or pointer binds to).
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) noexcept {
  return ::fairkv_emu::set_function_attribute(reinterpret_cast<const void*>(kernel), attr, value);
}
cudaError_t cudaMalloc(void** ptr, std::size_t bytes) noexcept;
template <class T>
cudaError_t cudaMalloc(T** ptr, std::size_t bytes) noexcept {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr) noexcept;
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) noexcept;
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr) noexcept;
cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) noexcept;
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr) noexcept;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) noexcept;
cudaError_t cudaStreamDestroy(cudaStream_t stream) noexcept;
cudaError_t cudaStreamSynchronize(cudaStream_t stream) noexcept;
cudaError_t cudaDeviceSynchronize() noexcept;
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) noexcept;
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) noexcept;
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0) noexcept;
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) noexcept;
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) noexcept;
cudaError_t cudaGraphDestroy(cudaGraph_t graph) noexcept;

namespace fairkv_emu {

// ---- what a kernel sees of itself ---------------------------------------------------------------------------------
namespace detail {
struct block_coords {
  uint3 idx;
  dim3 dim, grid;
  unsigned char* dynamic_smem;
};
struct thread_coords {
  uint3 idx;
  const block_coords* block;
};
extern thread_local const thread_coords* current;  // the fiber running on this worker

// Block and warp collectives (fairkv_emu.cpp): they switch fibers.
void syncthreads();
void syncwarp(unsigned mask);
// Every lane of `mask` publishes one word; returns the warp's 32 words (valid for the lanes of `mask`) and the
// calling lane. warp_done(mask) must follow once the caller has read what it needs (warp_collective does both).
const std::uint64_t* warp_publish(unsigned mask, std::uint64_t word, unsigned& lane);
void warp_done(unsigned mask);
void spin_hint() noexcept;  // called by busy-wait loads: lets a waited-for block on another worker run

template <class T>
std::uint64_t to_word(T v) noexcept {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "fairkv_emu: warp values are at most 8 bytes");
  std::uint64_t w = 0;
  std::memcpy(&w, &v, sizeof(T));
  return w;
}
template <class T>
T from_word(std::uint64_t w) noexcept {
  T v;
  std::memcpy(&v, &w, sizeof(T));
  return v;
}
[[noreturn]] void fail(const char* what);

// One warp collective: read(words, lane) runs while every lane's published word is in place.
template <class Read>
auto warp_collective(unsigned mask, std::uint64_t word, Read&& read) {
  unsigned lane = 0;
  const std::uint64_t* words = warp_publish(mask, word, lane);
  auto result = read(words, lane);
  warp_done(mask);
  return result;
}
}  // namespace detail

[[nodiscard]] void* dynamic_shared_memory() noexcept;

// ---- launches -----------------------------------------------------------------------------------------------------
// The device's limits on dynamic shared memory per block: without opting in, and the most a kernel may opt in
// to with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) (an H100's 227 KiB).
inline constexpr std::size_t default_dynamic_smem = 48 * 1024;
inline constexpr std::size_t optin_dynamic_smem = 227 * 1024;

// Runs the grid now (every launch is synchronous), or records it while `stream` is being captured. `kernel`
// identifies the function for its attributes (the opt-in shared memory).
void submit(const void* kernel, cudaStream_t stream, dim3 grid, dim3 block, std::size_t dynamic_smem,
            std::function<void()> body);

// Test hooks: launches submitted so far on this host thread, and a failure injected into the n-th launch from
// now (1 = the next one), which then records cudaErrorLaunchOutOfResources and runs nothing, as a launch the
// device refuses. 0 clears a pending injection.
[[nodiscard]] std::uint64_t launches_submitted() noexcept;
void fail_launch(std::uint64_t nth) noexcept;

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream,
            Args&&... args) {
  static_assert((std::size_t{0} + ... + sizeof(std::decay_t<Params>)) <= 32764,
                "fairkv_emu: kernel parameters exceed CUDA's 32764-byte limit");
  // Converted to the kernel's parameter types and copied at the launch, as CUDA does; every thread then gets its
  // own by-value copy when the body calls the kernel.
  auto params = std::make_shared<const std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  submit(reinterpret_cast<const void*>(kernel), stream, grid, block, dynamic_smem,
         [kernel, params] { std::apply(kernel, *params); });
}

}  // namespace fairkv_emu

// ---- built-in variables ---------------------------------------------------------------------------------------------
#define threadIdx (::fairkv_emu::detail::current->idx)
#define blockIdx (::fairkv_emu::detail::current->block->idx)
#define blockDim (::fairkv_emu::detail::current->block->dim)
#define gridDim (::fairkv_emu::detail::current->block->grid)

// ---- synchronisation, warp intrinsics, atomics --------------------------------------------------------------------
inline void __syncthreads() { ::fairkv_emu::detail::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { ::fairkv_emu::detail::syncwarp(mask); }
inline void __threadfence() noexcept { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  using namespace ::fairkv_emu::detail;
  if (width != 32) fail("__shfl_sync: only width 32 is emulated");
  const unsigned s = static_cast<unsigned>(src) & 31u;
  if (((mask >> s) & 1u) == 0) fail("__shfl_sync: the source lane is not in the mask");
  return warp_collective(mask, to_word(v), [&](const std::uint64_t* w, unsigned) { return from_word<T>(w[s]); });
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  using namespace ::fairkv_emu::detail;
  if (width != 32) fail("__shfl_up_sync: only width 32 is emulated");
  return warp_collective(mask, to_word(v), [&](const std::uint64_t* w, unsigned lane) {
    if (lane < delta) return v;
    if (((mask >> (lane - delta)) & 1u) == 0) fail("__shfl_up_sync: the source lane is not in the mask");
    return from_word<T>(w[lane - delta]);
  });
}
template <class T>
unsigned __match_any_sync(unsigned mask, T v) {
  using namespace ::fairkv_emu::detail;
  const std::uint64_t word = to_word(v);
  return warp_collective(mask, word, [&](const std::uint64_t* w, unsigned) {
    unsigned same = 0;
    for (unsigned l = 0; l < 32; ++l)
      if (((mask >> l) & 1u) != 0 && w[l] == word) same |= 1u << l;
    return same;
  });
}

inline int __ffs(int x) noexcept { return __builtin_ffs(x); }
inline int __popc(unsigned x) noexcept { return __builtin_popcount(x); }

// CUDA atomics are relaxed; fibers of one block and blocks on other workers both see them atomically.
inline int atomicAdd(int* p, int v) noexcept { return std::atomic_ref<int>(*p).fetch_add(v, std::memory_order_relaxed); }
inline unsigned atomicAdd(unsigned* p, unsigned v) noexcept {
  return std::atomic_ref<unsigned>(*p).fetch_add(v, std::memory_order_relaxed);
}
inline int atomicCAS(int* p, int compare, int value) noexcept {
  std::atomic_ref<int>(*p).compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;  // the old value, whether or not it was replaced
}
template <class T>
T __ldcg(const T* p) noexcept {
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(std::memory_order_relaxed);
}
