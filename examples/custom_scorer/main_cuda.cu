// The custom scorer of main.cpp through the CUDA backend: the scorer's operator() runs in fairkv's scoring kernel,
// which is why probe_alignment marks it FAIRKV_HOST_DEVICE. Plans and compacts on the device and checks the same
// kept set as the CPU. Built by nvcc (sm_80 / sm_90) when FAIRKV_ENABLE_CUDA is on, and by the host compiler
// against the test suite's CUDA emulator (main_cuda_emulated.cpp), which runs it in every test build.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "fairkv/cuda/cuda.cuh"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/views/kv_view.hpp"
#include "probe_alignment.hpp"

namespace {

// Device memory owned by the example (the library never allocates).
struct device_array {
  void* ptr = nullptr;
  device_array() = default;
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  fairkv::result allocate(std::size_t bytes) { return fairkv::cuda::from_cuda(cudaMalloc(&ptr, bytes)); }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(ptr);
  }
};

fairkv::result run(std::vector<int>& kept, std::vector<float>& compacted) {
  using probe_example::head_dim;
  using probe_example::tokens;
  const std::vector<float> k = probe_example::keys();
  const std::size_t kv_bytes = k.size() * sizeof(float);
  device_array d_k, d_v, d_indices, d_counts, d_lengths, d_temp;
  FAIRKV_TRY(d_k.allocate(kv_bytes));
  FAIRKV_TRY(d_v.allocate(kv_bytes));
  FAIRKV_TRY(d_indices.allocate(tokens * sizeof(std::int32_t)));  // [batch * heads, capacity]
  FAIRKV_TRY(d_counts.allocate(sizeof(std::int32_t)));            // [batch * heads]
  FAIRKV_TRY(d_lengths.allocate(sizeof(std::int32_t)));           // [batch]
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemcpy(d_k.ptr, k.data(), kv_bytes, cudaMemcpyHostToDevice)));
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemset(d_v.ptr, 0, kv_bytes)));

  const auto keys = fairkv::make_contiguous_view(d_k.as<float>(), 1, 1, tokens, head_dim);
  const auto values = fairkv::make_contiguous_view(d_v.as<float>(), 1, 1, tokens, head_dim);
  const fairkv::keep_plan_view plan{d_indices.as<std::int32_t>(), d_counts.as<std::int32_t>(),
                                    d_lengths.as<std::int32_t>(), 1, 1, tokens};
  const auto pol = probe_example::make_policy();
  const auto in = fairkv::keys_only(keys);

  // Two-phase, CUB style: ask the size, allocate, run.
  std::size_t plan_bytes = 0;
  FAIRKV_TRY(fairkv::cuda::plan(nullptr, plan_bytes, pol, in, probe_example::segments, {}, probe_example::ratio, plan));
  FAIRKV_TRY(d_temp.allocate(plan_bytes));
  FAIRKV_TRY(fairkv::cuda::plan(d_temp.ptr, plan_bytes, pol, in, probe_example::segments, {}, probe_example::ratio, plan));

  std::int32_t count = 0;
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemcpy(&count, d_counts.ptr, sizeof count, cudaMemcpyDeviceToHost)));
  kept.resize(static_cast<std::size_t>(count));
  FAIRKV_TRY(fairkv::cuda::from_cuda(
      cudaMemcpy(kept.data(), d_indices.ptr, kept.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost)));

  std::size_t compact_bytes = 0;
  FAIRKV_TRY(fairkv::cuda::compact(nullptr, compact_bytes, plan, keys, values));
  device_array d_compact_temp;
  FAIRKV_TRY(d_compact_temp.allocate(compact_bytes));
  FAIRKV_TRY(fairkv::cuda::compact(d_compact_temp.ptr, compact_bytes, plan, keys, values));
  FAIRKV_TRY(fairkv::cuda::read_compact_status(d_compact_temp.ptr));
  compacted.resize(k.size());
  return fairkv::cuda::from_cuda(cudaMemcpy(compacted.data(), d_k.ptr, kv_bytes, cudaMemcpyDeviceToHost));
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device; the custom scorer was compiled for the device but did not run\n");
    return 0;
  }
  std::vector<int> kept;
  std::vector<float> compacted;
  if (const fairkv::result r = run(kept, compacted); !r) {
    std::fprintf(stderr, "fairkv: %s\n", r.message());
    return 1;
  }
  std::printf("kept on the device (probe = +y, fair over two halves):");
  for (int t : kept) std::printf(" %d", t);
  std::printf("\n");
  if (kept != probe_example::expected_kept) {
    std::fprintf(stderr, "unexpected kept set (the CPU keeps 3 4 5 6 7 8)\n");
    return 1;
  }
  if (!probe_example::compacted_as_expected(probe_example::keys(), compacted)) {
    std::fprintf(stderr, "compaction did not move the kept keys to the front\n");
    return 1;
  }
  return 0;
}
