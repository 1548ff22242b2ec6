// The CUDA emulator's own checks: the parity suite trusts it to run kernels as CUDA specifies, so its collectives,
// launch checks and capture rules are tested here against hand-worked results.
#include <doctest/doctest.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "../device_buffer.hpp"

namespace {

using fairkv_test::device_buffer;

template <class T>
T* device_array(device_buffer& buffer, std::size_t count) {
  REQUIRE(buffer.allocate(count * sizeof(T)).ok());
  return buffer.get<T>();
}
template <class T>
std::vector<T> download(const device_buffer& buffer) {
  std::vector<T> host;
  REQUIRE(buffer.download(host).ok());
  return host;
}

constexpr int threads = 128;

// out[i] = exclusive prefix of (i % 3) over the block, then the aggregate, then thread 0's sum of i.
void scan_reduce_kernel(int* out) {
  using scan_t = cub::BlockScan<int, threads>;
  using reduce_t = cub::BlockReduce<int, threads>;
  __shared__ typename scan_t::TempStorage scan;
  __shared__ typename reduce_t::TempStorage reduce;
  int prefix = 0, aggregate = 0;
  scan_t(scan).ExclusiveSum(static_cast<int>(threadIdx.x % 3), prefix, aggregate);
  const int sum = reduce_t(reduce).Sum(static_cast<int>(threadIdx.x));
  out[threadIdx.x] = prefix;
  out[threads + threadIdx.x] = aggregate;
  if (threadIdx.x == 0) out[2 * threads] = sum;
}

// Warp collectives of a 64-thread block: shuffle from lane 5, shuffle up by 1, match on lane / 4.
void warp_kernel(unsigned* out) {
  const unsigned lane = threadIdx.x & 31u;
  out[threadIdx.x] = __shfl_sync(0xFFFFFFFFu, threadIdx.x * 10u, 5);
  out[64 + threadIdx.x] = __shfl_up_sync(0xFFFFFFFFu, threadIdx.x, 1);
  out[128 + threadIdx.x] = __match_any_sync(0xFFFFFFFFu, lane / 4u);
}

// Thread 0 writes a shared value that the others read after (with) or without a barrier.
void barrier_kernel(int* out, bool sync) {
  __shared__ int value;
  if (threadIdx.x == 0) value = static_cast<int>(blockIdx.x) + 1;
  if (sync) __syncthreads();
  out[blockIdx.x * threads + threadIdx.x] = value;
  __syncthreads();
  if (threadIdx.x == 0) value = -1;  // what the next block on this worker would see without its own write
}

void noop_kernel(int*) {}

// Block b waits for block b - 1's flag: needs the blocks to run concurrently or in order, as on hardware.
void chain_kernel(int* flags, int* order, int* ticket) {
  __shared__ int mine;
  if (threadIdx.x == 0) {
    mine = atomicAdd(ticket, 1);
    if (mine > 0)
      while (::cuda::atomic_ref<int, ::cuda::thread_scope_device>(flags[mine - 1]).load(::cuda::memory_order_acquire) == 0) {
      }
    order[mine] = static_cast<int>(blockIdx.x);
    ::cuda::atomic_ref<int, ::cuda::thread_scope_device>(flags[mine]).store(1, ::cuda::memory_order_release);
  }
  __syncthreads();
}

}  // namespace

TEST_SUITE("cuda_emulator") {
  TEST_CASE("emulator: block scan and reduce give CUB's results, the reduction to thread 0 only") {
    device_buffer buf;
    int* out = device_array<int>(buf, 2 * threads + 1);
    fairkv_emu::launch(scan_reduce_kernel, 1, threads, 0, nullptr, out);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const auto h = download<int>(buf);
    int acc = 0;
    for (int i = 0; i < threads; ++i) {
      CHECK(h[i] == acc);
      acc += i % 3;
    }
    for (int i = 0; i < threads; ++i) CHECK(h[threads + i] == acc);
    CHECK(h[2 * threads] == threads * (threads - 1) / 2);
  }

  TEST_CASE("emulator: warp shuffles and match see every lane of their own warp") {
    device_buffer buf;
    fairkv_emu::launch(warp_kernel, 1, 64, 0, nullptr, device_array<unsigned>(buf, 192));
    const auto h = download<unsigned>(buf);
    for (unsigned t = 0; t < 64; ++t) {
      const unsigned warp = t / 32, lane = t % 32;
      CHECK(h[t] == (warp * 32 + 5) * 10);
      CHECK(h[64 + t] == (lane == 0 ? t : t - 1));
      CHECK(h[128 + t] == 0xFu << (lane / 4 * 4));
    }
  }

  TEST_CASE("emulator: a missing __syncthreads shows up as a wrong read, a present one never does") {
    constexpr int blocks = 16;
    device_buffer with, without;
    fairkv_emu::launch(barrier_kernel, blocks, threads, 0, nullptr, device_array<int>(with, blocks * threads), true);
    fairkv_emu::launch(barrier_kernel, blocks, threads, 0, nullptr, device_array<int>(without, blocks * threads), false);
    const auto a = download<int>(with), b = download<int>(without);
    int stale = 0;
    for (int i = 0; i < blocks * threads; ++i) {
      CHECK(a[i] == i / threads + 1);
      stale += b[i] != i / threads + 1;
    }
    CHECK(stale > 0);  // threads scheduled before thread 0 read the previous value
  }

  TEST_CASE("emulator: blocks that wait for earlier blocks complete, in ticket order") {
    constexpr int blocks = 64;
    device_buffer flags, order, ticket;
    int* d_flags = device_array<int>(flags, blocks);
    int* d_ticket = device_array<int>(ticket, 1);
    REQUIRE(cudaMemset(d_flags, 0, blocks * sizeof(int)) == cudaSuccess);
    REQUIRE(cudaMemset(d_ticket, 0, sizeof(int)) == cudaSuccess);
    fairkv_emu::launch(chain_kernel, blocks, 64, 0, nullptr, d_flags, device_array<int>(order, blocks), d_ticket);
    const auto f = download<int>(flags), o = download<int>(order);
    std::vector<int> seen(blocks, 0);
    for (int b = 0; b < blocks; ++b) {
      CHECK(f[b] == 1);
      REQUIRE((o[b] >= 0 && o[b] < blocks));
      ++seen[o[b]];
    }
    for (int b = 0; b < blocks; ++b) CHECK(seen[b] == 1);  // every block took exactly one ticket
  }

  TEST_CASE("emulator: invalid launch configurations fail as CUDA reports them") {
    REQUIRE(cudaGetLastError() == cudaSuccess);
    fairkv_emu::launch(noop_kernel, 1, 1025, 0, nullptr, nullptr);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);  // reading the error clears it
    fairkv_emu::launch(noop_kernel, dim3(1, 65536), 32, 0, nullptr, nullptr);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    fairkv_emu::launch(noop_kernel, 1, 32, 48 * 1024 + 1, nullptr, nullptr);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  }

  TEST_CASE("emulator: copies outside an allocation are refused") {
    device_buffer buf;
    int* d = device_array<int>(buf, 4);
    std::vector<int> h(8);
    CHECK(cudaMemcpy(d, h.data(), 4 * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(d, h.data(), 5 * sizeof(int), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(h.data(), d + 1, 4 * sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(cudaMemsetAsync(h.data(), 0, 4, nullptr) == cudaErrorInvalidValue);
    cudaGetLastError();
  }

  TEST_CASE("emulator: a captured graph replays its work; allocating or waiting inside a capture invalidates it") {
    device_buffer buf;
    int* d = device_array<int>(buf, 1);
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaMemset(d, 0, sizeof(int)) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(d, 7, 1, s) == cudaSuccess);
    cudaGraph_t g = nullptr;
    REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(download<int>(buf)[0] == 0);  // captured, not run
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    CHECK(download<int>(buf)[0] == 7);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);

    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    CHECK(g == nullptr);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    cudaStreamDestroy(s);
  }
}
