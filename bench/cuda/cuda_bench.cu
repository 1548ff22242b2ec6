// CUDA benchmark of one layer: 8 KV heads, head_dim 128, bf16, ratio 0.5, K-Norm + per_head + uniform.
// Times score + select + compact (fairkv::cuda::plan + fairkv::cuda::compact) with CUDA events and reports:
//  - achieved GB/s against the bandwidth floor (K read once + kept K and V read and written once),
//  - the device-to-device cudaMemcpy bandwidth measured in the same run (the goal: >= 70% of it),
//  - a Thrust baseline in the same run (torch-style: scores, a full sort per head, then gather K and V into new
//    buffers), and the speed-up over it.
// Without a device it prints "SKIPPED: no CUDA device" and exits 0.
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/gather.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fairkv/allocators/uniform.hpp"
#include "fairkv/cuda/cuda.cuh"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/selectors/per_head.hpp"

namespace {

#define BENCH_CHECK(expr)                                                                               \
  do {                                                                                                  \
    const cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));       \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

#define BENCH_TRY(expr)                                                                                 \
  do {                                                                                                  \
    const fairkv::result r_ = (expr);                                                                   \
    if (!r_.ok()) {                                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, r_.message());                 \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

constexpr std::int64_t heads = 8, head_dim = 128;
constexpr double ratio = 0.5;
constexpr int warmup = 3, iterations = 20;

// Deterministic pseudo-random bf16 keys/values in [-2, 2).
__global__ void fill_kernel(std::uint16_t* x, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float f = (static_cast<float>(h & 0xFFFFFF) / 16777216.f) * 4.f - 2.f;
    x[i] = static_cast<std::uint16_t>(__float_as_uint(f) >> 16);
  }
}

// Baseline scorer: K-Norm of one [tokens, head_dim] head, one thread per token (what a naive torch-style
// vector_norm + topk pipeline does, minus the framework overhead). Negated so a descending sort keeps small norms.
struct knorm_of_row {
  const std::uint16_t* k;  // [tokens, head_dim] of one head
  __device__ float operator()(std::int64_t t) const {
    float s = 0.f;
    for (int i = 0; i < head_dim; ++i) {
      const float x = __uint_as_float(static_cast<std::uint32_t>(k[t * head_dim + i]) << 16);
      s += x * x;
    }
    return -sqrtf(s);
  }
};

// out unit u = in unit (idx[u / units] * units + u % units): gathers whole rows as 16-byte units.
struct row_unit_index {
  const std::int32_t* idx;
  std::int64_t units;
  __device__ std::int64_t operator()(std::int64_t u) const { return idx[u / units] * units + u % units; }
};

// A bump allocator over one preallocated buffer, so Thrust's temporary storage costs no cudaMalloc per call.
struct bump_allocator {
  using value_type = char;
  char* base = nullptr;
  std::size_t size = 0, used = 0;
  char* allocate(std::ptrdiff_t n) {
    const std::size_t aligned = (static_cast<std::size_t>(n) + 255) / 256 * 256;
    if (used + aligned > size) {
      std::fprintf(stderr, "bump allocator exhausted\n");
      std::exit(1);
    }
    char* p = base + used;
    used += aligned;
    return p;
  }
  void deallocate(char*, std::size_t) {}
};

struct timer {
  cudaEvent_t a, b;
  timer() {
    BENCH_CHECK(cudaEventCreate(&a));
    BENCH_CHECK(cudaEventCreate(&b));
  }
  ~timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  void start(cudaStream_t s) { BENCH_CHECK(cudaEventRecord(a, s)); }
  float stop_ms(cudaStream_t s) {
    BENCH_CHECK(cudaEventRecord(b, s));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0.f;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(std::int64_t tokens, cudaStream_t stream) {
  using bf16 = fairkv::bfloat16_t;
  const std::int64_t elems = heads * tokens * head_dim;  // [1, heads, tokens, head_dim]
  const std::size_t bytes = static_cast<std::size_t>(elems) * 2;
  const std::int64_t n_keep = fairkv::keep_budget(tokens, ratio);
  std::uint16_t *k0, *v0, *k, *v, *k_out, *v_out;
  BENCH_CHECK(cudaMalloc(&k0, bytes));
  BENCH_CHECK(cudaMalloc(&v0, bytes));
  BENCH_CHECK(cudaMalloc(&k, bytes));
  BENCH_CHECK(cudaMalloc(&v, bytes));
  BENCH_CHECK(cudaMalloc(&k_out, bytes));
  BENCH_CHECK(cudaMalloc(&v_out, bytes));
  fill_kernel<<<1024, 256, 0, stream>>>(k0, elems, 1u);
  fill_kernel<<<1024, 256, 0, stream>>>(v0, elems, 2u);
  std::int32_t *indices, *counts, *lengths;
  BENCH_CHECK(cudaMalloc(&indices, static_cast<std::size_t>(heads * tokens) * 4));
  BENCH_CHECK(cudaMalloc(&counts, static_cast<std::size_t>(heads) * 4));
  BENCH_CHECK(cudaMalloc(&lengths, 4));
  const fairkv::keep_plan_view plan{indices, counts, lengths, 1, heads, tokens};

  const auto kv = fairkv::make_contiguous_view(reinterpret_cast<bf16*>(k), 1, heads, tokens, head_dim);
  const auto vv = fairkv::make_contiguous_view(reinterpret_cast<bf16*>(v), 1, heads, tokens, head_dim);
  const fairkv::policy pol{fairkv::scorers::knorm{}, fairkv::selectors::per_head{}, fairkv::allocators::uniform{}};
  const auto in = fairkv::keys_only(kv);
  std::size_t plan_bytes = 0, compact_bytes = 0;
  BENCH_TRY(fairkv::cuda::plan(nullptr, plan_bytes, pol, in, {}, {}, ratio, plan, stream));
  BENCH_TRY(fairkv::cuda::compact(nullptr, compact_bytes, plan, kv, vv, stream));
  void *plan_temp, *compact_temp;
  BENCH_CHECK(cudaMalloc(&plan_temp, plan_bytes));
  BENCH_CHECK(cudaMalloc(&compact_temp, compact_bytes));

  timer tm, tm_plan;
  std::vector<float> t_total, t_plan, t_copy, t_base;
  for (int it = 0; it < warmup + iterations; ++it) {
    BENCH_CHECK(cudaMemcpyAsync(k, k0, bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CHECK(cudaMemcpyAsync(v, v0, bytes, cudaMemcpyDeviceToDevice, stream));
    tm.start(stream);
    BENCH_TRY(fairkv::cuda::plan(plan_temp, plan_bytes, pol, in, {}, {}, ratio, plan, stream));
    BENCH_TRY(fairkv::cuda::compact(compact_temp, compact_bytes, plan, kv, vv, stream));
    const float total = tm.stop_ms(stream);
    tm_plan.start(stream);
    BENCH_TRY(fairkv::cuda::plan(plan_temp, plan_bytes, pol, in, {}, {}, ratio, plan, stream));
    const float p = tm_plan.stop_ms(stream);
    if (it >= warmup) {
      t_total.push_back(total);
      t_plan.push_back(p);
    }
  }
  BENCH_TRY(fairkv::cuda::read_compact_status(compact_temp, stream));

  // The same work captured once in a CUDA graph and replayed: no host launch overhead between the kernels.
  std::vector<float> t_graph;
  {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    BENCH_TRY(fairkv::cuda::plan(plan_temp, plan_bytes, pol, in, {}, {}, ratio, plan, stream));
    BENCH_TRY(fairkv::cuda::compact(compact_temp, compact_bytes, plan, kv, vv, stream));
    BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int it = 0; it < warmup + iterations; ++it) {
      BENCH_CHECK(cudaMemcpyAsync(k, k0, bytes, cudaMemcpyDeviceToDevice, stream));
      BENCH_CHECK(cudaMemcpyAsync(v, v0, bytes, cudaMemcpyDeviceToDevice, stream));
      tm.start(stream);
      BENCH_CHECK(cudaGraphLaunch(exec, stream));
      const float ms = tm.stop_ms(stream);
      if (it >= warmup) t_graph.push_back(ms);
    }
    BENCH_TRY(fairkv::cuda::read_compact_status(compact_temp, stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  // Sanity: every head kept exactly n_keep tokens.
  std::vector<std::int32_t> host_counts(static_cast<std::size_t>(heads));
  BENCH_CHECK(cudaMemcpy(host_counts.data(), counts, host_counts.size() * 4, cudaMemcpyDeviceToHost));
  for (const std::int32_t c : host_counts)
    if (c != n_keep) {
      std::fprintf(stderr, "unexpected count %d (want %lld)\n", c, static_cast<long long>(n_keep));
      std::exit(1);
    }

  // Copy bandwidth in the same run: K and V copied device to device (each byte read once and written once).
  for (int it = 0; it < warmup + iterations; ++it) {
    tm.start(stream);
    BENCH_CHECK(cudaMemcpyAsync(k_out, k0, bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CHECK(cudaMemcpyAsync(v_out, v0, bytes, cudaMemcpyDeviceToDevice, stream));
    const float ms = tm.stop_ms(stream);
    if (it >= warmup) t_copy.push_back(ms);
  }

  // Thrust baseline: per head, scores -> full sort (descending, by key) -> the first n_keep indices sorted
  // ascending -> gather K and V rows into new buffers.
  float* scores;
  std::int32_t* order;
  BENCH_CHECK(cudaMalloc(&scores, static_cast<std::size_t>(heads * tokens) * 4));
  BENCH_CHECK(cudaMalloc(&order, static_cast<std::size_t>(heads * tokens) * 4));
  bump_allocator pool;
  pool.size = static_cast<std::size_t>(tokens) * 64 + (64u << 20);
  BENCH_CHECK(cudaMalloc(&pool.base, pool.size));
  const std::int64_t units = head_dim * 2 / 16;
  for (int it = 0; it < warmup + iterations; ++it) {
    tm.start(stream);
    for (std::int64_t h = 0; h < heads; ++h) {
      pool.used = 0;
      auto exec = thrust::cuda::par_nosync(pool).on(stream);
      float* s = scores + h * tokens;
      std::int32_t* o = order + h * tokens;
      thrust::transform(exec, thrust::counting_iterator<std::int64_t>(0), thrust::counting_iterator<std::int64_t>(tokens),
                        s, knorm_of_row{k0 + h * tokens * head_dim});
      thrust::sequence(exec, o, o + tokens);
      thrust::sort_by_key(exec, s, s + tokens, o, thrust::greater<float>());
      thrust::sort(exec, o, o + n_keep);
      const auto* src_k = reinterpret_cast<const uint4*>(k0 + h * tokens * head_dim);
      const auto* src_v = reinterpret_cast<const uint4*>(v0 + h * tokens * head_dim);
      auto map = thrust::make_transform_iterator(thrust::counting_iterator<std::int64_t>(0), row_unit_index{o, units});
      thrust::gather(exec, map, map + n_keep * units, src_k, reinterpret_cast<uint4*>(k_out + h * tokens * head_dim));
      thrust::gather(exec, map, map + n_keep * units, src_v, reinterpret_cast<uint4*>(v_out + h * tokens * head_dim));
    }
    const float ms = tm.stop_ms(stream);
    if (it >= warmup) t_base.push_back(ms);
  }

  const double floor_bytes = static_cast<double>(bytes) + 4.0 * static_cast<double>(n_keep * heads * head_dim * 2);
  const double copy_bytes = 4.0 * static_cast<double>(bytes);
  const float total = median(t_total), plan_ms = median(t_plan), copy_ms = median(t_copy), base_ms = median(t_base);
  const float graph_ms = median(t_graph);
  const double gbps = floor_bytes / (total * 1e-3) / 1e9;
  const double copy_gbps = copy_bytes / (copy_ms * 1e-3) / 1e9;
  const double base_gbps = floor_bytes / (base_ms * 1e-3) / 1e9;
  const double graph_gbps = floor_bytes / (graph_ms * 1e-3) / 1e9;
  std::printf(
      "tokens %7lld | fairkv %.4f ms (plan %.4f, compact %.4f) %7.1f GB/s | as a CUDA graph %.4f ms %7.1f GB/s | "
      "memcpy %7.1f GB/s | fairkv/memcpy %5.1f%% (graph %5.1f%%) | thrust baseline %.4f ms %7.1f GB/s | "
      "speed-up %.2fx (graph %.2fx)\n",
      static_cast<long long>(tokens), total, plan_ms, total - plan_ms, gbps, graph_ms, graph_gbps, copy_gbps,
      100.0 * gbps / copy_gbps, 100.0 * graph_gbps / copy_gbps, base_ms, base_gbps, base_ms / total,
      base_ms / graph_ms);
  std::fflush(stdout);

  cudaFree(pool.base);
  cudaFree(scores);
  cudaFree(order);
  cudaFree(plan_temp);
  cudaFree(compact_temp);
  cudaFree(indices);
  cudaFree(counts);
  cudaFree(lengths);
  for (std::uint16_t* p : {k0, v0, k, v, k_out, v_out}) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::printf("layer: 1 sequence, %lld KV heads, head_dim %lld, bf16, ratio %.2f, knorm + per_head + uniform; "
              "median of %d runs\n",
              static_cast<long long>(heads), static_cast<long long>(head_dim), ratio, iterations);
  std::printf("floor bytes = K read once + kept K,V read and written once; memcpy = K,V copied D2D (read + write)\n");
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::int64_t> sizes = {4096, 32768, 131072};
  if (argc > 1) sizes = {std::atoll(argv[1])};
  for (const std::int64_t L : sizes) run(L, stream);
  cudaStreamDestroy(stream);
  return 0;
}
