// What the CUDA planner does when a launch fails, and the emulator's model of opt-in shared memory, both of
// which only the emulator can provoke on demand (suite cuda_emulator): every launch is checked as it is made, so
// a refused launch stops the plan there with status::device_error, and nothing after it is enqueued.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../device_buffer.hpp"
#include "fairkv/allocators/fair.hpp"
#include "fairkv/cuda/plan.cuh"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/selectors/per_head.hpp"
#include "fairkv/views/kv_view.hpp"

using namespace fairkv;
using fairkv_test::device_buffer;

namespace {

constexpr std::int64_t B = 2, H = 2, L = 300, D = 8;

// A K-Norm plan of a [B, H, L, D] float cache in two segments, with everything on the emulated device.
struct planned_layer {
  device_buffer keys, indices, counts, lengths, temp;
  policy<scorers::knorm, selectors::per_head, allocators::fair> pol{};
  std::vector<segment> segments{{10, 120}, {150, 290}};
  layer_inputs<kv_view<const float>> in{};
  keep_plan_view out{};

  planned_layer() {
    std::vector<float> k(static_cast<std::size_t>(B * H * L * D));
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>((i * 37) % 101) / 50.f - 1.f;
    REQUIRE(keys.upload(k).ok());
    REQUIRE(indices.allocate(static_cast<std::size_t>(B * H * L) * 4).ok());
    REQUIRE(counts.allocate(static_cast<std::size_t>(B * H) * 4).ok());
    REQUIRE(lengths.allocate(static_cast<std::size_t>(B) * 4).ok());
    in.keys = make_contiguous_view(keys.get<const float>(), B, H, L, D);
    out = {indices.get<std::int32_t>(), counts.get<std::int32_t>(), lengths.get<std::int32_t>(), B, H, L};
    std::size_t bytes = 0;
    REQUIRE(cuda::plan(nullptr, bytes, pol, in, segments, {}, 0.5, out).ok());
    REQUIRE(temp.allocate(bytes).ok());
  }
  result plan() {
    std::size_t bytes = temp.bytes();
    return cuda::plan(temp.get(), bytes, pol, in, segments, {}, 0.5, out);
  }
};

std::vector<std::int32_t> download(const device_buffer& b) {
  std::vector<std::int32_t> v;
  REQUIRE(b.download(v).ok());
  return v;
}

__global__ void fill_shared_kernel(int* out, int n) {
  int* s = fairkv::cuda::detail::dynamic_shared<int>();
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[n - 1];
}

}  // namespace

TEST_SUITE("cuda_emulator") {
  TEST_CASE("cuda planner: a failed launch stops the plan at that launch with device_error") {
    planned_layer layer;
    const std::uint64_t before = fairkv_emu::launches_submitted();
    REQUIRE(layer.plan().ok());
    const std::uint64_t launches = fairkv_emu::launches_submitted() - before;
    REQUIRE(launches >= 4);  // scores, radix passes, marking, emit
    const std::vector<std::int32_t> want = download(layer.indices);
    for (std::uint64_t nth = 1; nth <= launches; ++nth) {
      CAPTURE(nth);
      const std::uint64_t start = fairkv_emu::launches_submitted();
      fairkv_emu::fail_launch(nth);
      const result r = layer.plan();
      CHECK(r.code() == status::device_error);
      CHECK(std::string(r.message()).find("cudaErrorLaunchOutOfResources") != std::string::npos);
      CHECK(fairkv_emu::launches_submitted() - start == nth);  // nothing was launched after the failure
      CHECK(cudaGetLastError() == cudaSuccess);                // consumed: not reported again by someone else
    }
    // The planner is still usable: a clean run gives the same plan again.
    REQUIRE(layer.plan().ok());
    CHECK(download(layer.indices) == want);
  }

  TEST_CASE("cuda planner handle: run() before initialize() and a failed initialize() are refused") {
    planned_layer layer;
    using planner = cuda::planner<decltype(layer.pol), decltype(layer.in)>;
    planner p;
    const result early = p.run();
    CHECK(early.code() == status::invalid_argument);
    CHECK(std::string(early.message()).find("initialize") != std::string::npos);
    const planner::arguments args{layer.pol, layer.in, layer.segments, {}, 0.5, layer.out};
    REQUIRE(p.initialize(args, layer.temp.get(), layer.temp.bytes()).ok());
    const std::uint64_t start = fairkv_emu::launches_submitted();
    REQUIRE(p.run().ok());
    const std::uint64_t per_run = fairkv_emu::launches_submitted() - start;
    REQUIRE(p.run().ok());
    CHECK(fairkv_emu::launches_submitted() - start == 2 * per_run);  // run() only launches
    // A too small workspace: initialize fails with the free function's message and leaves the handle unusable.
    const result small = p.initialize(args, layer.temp.get(), 16);
    CHECK(small.code() == status::insufficient_workspace);
    CHECK(std::string(small.message()).find("temp_storage_bytes = 16") != std::string::npos);
    CHECK(p.run().code() == status::invalid_argument);
  }

  TEST_CASE("emulator: dynamic shared memory above 48 KiB needs the kernel's opt-in, up to the device limit") {
    device_buffer out;
    REQUIRE(out.allocate(sizeof(int)).ok());
    int optin = 0;
    REQUIRE(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
    CHECK(optin == 227 * 1024);
    const int n = 64 * 1024 / 4;  // 64 KiB of ints
    const std::size_t bytes = static_cast<std::size_t>(n) * 4;
    (void)cudaGetLastError();
    fairkv_emu::launch(fill_shared_kernel, dim3(1), dim3(128), bytes, nullptr, out.get<int>(), n);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // no opt-in yet
    CHECK(cudaFuncSetAttribute(fill_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1) ==
          cudaErrorInvalidValue);
    (void)cudaGetLastError();
    REQUIRE(cudaFuncSetAttribute(fill_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)) == cudaSuccess);
    fairkv_emu::launch(fill_shared_kernel, dim3(1), dim3(128), bytes, nullptr, out.get<int>(), n);
    CHECK(cudaGetLastError() == cudaSuccess);
    std::vector<int> got;
    REQUIRE(out.download(got).ok());
    CHECK(got[0] == n - 1);
    // The opt-in is the kernel's own: it allows no more than was set.
    fairkv_emu::launch(fill_shared_kernel, dim3(1), dim3(128), bytes + 4, nullptr, out.get<int>(), n);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  }
}
