// CUDA benchmark of one layer: 8 KV heads, head_dim 128, bf16, ratio 0.5, K-Norm + per_head + uniform.
// Times score + select + compact (fairkv::cuda::plan + fairkv::cuda::compact) with CUDA events and reports:
//  - achieved GB/s against the bandwidth floor (K read once + kept K and V read and written once),
//  - the device-to-device cudaMemcpy bandwidth measured in the same run (the goal: >= 70% of it),
//  - a Thrust baseline in the same run (torch-style: scores, a full sort per head, then gather K and V into new
//    buffers), and the speed-up over it.
// Then a vLLM-shaped batch of 64 paged requests with their own lists, against a plain gather (run_paged_requests).
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
#include <numeric>
#include <random>
#include <vector>

#include "fairkv/allocators/fair.hpp"
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

// A vLLM-shaped batch: 64 requests of 1k-8k tokens in 16-token pages of one NHD pool (bf16, 8 KV heads, head_dim
// 128), each request with its own three instruction segments and a 4-token whitelist, planned in one
// cuda::plan call (fair_with_whitelist, K-Norm, ratio 0.5, host seq_lens) and compacted in place. Against the same
// run's plain gather: one kernel copying every kept K and V row (the plan's own indices) out of the pages into a
// dense buffer, i.e. the data movement alone, with no scoring or selection.
__global__ void gather_kept_kernel(const std::uint16_t* k_pool, const std::uint16_t* v_pool, const std::int32_t* indptr,
                                   const std::int32_t* pages, fairkv::const_keep_plan_view plan, std::int64_t page_size,
                                   const std::int64_t* row_offset, std::uint16_t* k_out, std::uint16_t* v_out) {
  const std::int64_t row = blockIdx.y, b = row / plan.heads, h = row % plan.heads;
  const std::int32_t n = plan.counts[row];
  const std::int64_t units = head_dim * 2 / 16;  // uint4 per row
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n * units;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i / units, u = i % units, t = plan.row(b, h)[j];
    const std::int64_t page = pages[indptr[b] + t / page_size];
    const std::int64_t src = ((page * page_size + t % page_size) * heads + h) * head_dim;
    const std::int64_t dst = (row_offset[row] + j) * head_dim;
    reinterpret_cast<uint4*>(k_out + dst)[u] = reinterpret_cast<const uint4*>(k_pool + src)[u];
    reinterpret_cast<uint4*>(v_out + dst)[u] = reinterpret_cast<const uint4*>(v_pool + src)[u];
  }
}

void run_paged_requests(cudaStream_t stream) {
  using bf16 = fairkv::bfloat16_t;
  constexpr std::int64_t batch = 64, page_size = 16;
  std::vector<std::int32_t> lengths, indptr{0}, last;
  std::vector<fairkv::segment> segments;
  std::vector<std::int32_t> seg_indptr{0}, whitelist, wl_indptr{0};
  std::int64_t pages = 0, tokens = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto L = static_cast<std::int32_t>(1024 + (b * 7919) % 7169);  // 1024 .. 8192, scattered
    lengths.push_back(L);
    tokens += L;
    const std::int64_t np = (L + page_size - 1) / page_size;
    pages += np;
    indptr.push_back(static_cast<std::int32_t>(pages));
    last.push_back(static_cast<std::int32_t>(L - (np - 1) * page_size));
    const std::int32_t s = static_cast<std::int32_t>(32 + b % 64);  // a system prompt of three lines
    segments.insert(segments.end(), {{0, s}, {s, 2 * s}, {2 * s, 3 * s}});
    seg_indptr.push_back(static_cast<std::int32_t>(segments.size()));
    for (std::int32_t t = 0; t < 4; ++t) whitelist.push_back(t);
    wl_indptr.push_back(static_cast<std::int32_t>(whitelist.size()));
  }
  const std::int64_t num_pages = pages + 64;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages));  // scattered pages, as a long-running server's
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<std::size_t>(pages));

  const std::int64_t elems = num_pages * page_size * heads * head_dim;
  const std::size_t bytes = static_cast<std::size_t>(elems) * 2;
  std::uint16_t *k0, *v0, *k, *v, *k_out, *v_out;
  for (std::uint16_t** p : {&k0, &v0, &k, &v, &k_out, &v_out}) BENCH_CHECK(cudaMalloc(p, bytes));
  fill_kernel<<<1024, 256, 0, stream>>>(k0, elems, 3u);
  fill_kernel<<<1024, 256, 0, stream>>>(v0, elems, 4u);
  std::int32_t *d_indptr, *d_ids, *d_last, *indices, *counts, *d_lengths;
  BENCH_CHECK(cudaMalloc(&d_indptr, indptr.size() * 4));
  BENCH_CHECK(cudaMalloc(&d_ids, ids.size() * 4));
  BENCH_CHECK(cudaMalloc(&d_last, last.size() * 4));
  BENCH_CHECK(cudaMemcpy(d_indptr, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_last, last.data(), last.size() * 4, cudaMemcpyHostToDevice));
  const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  BENCH_CHECK(cudaMalloc(&indices, static_cast<std::size_t>(batch * heads * longest) * 4));
  BENCH_CHECK(cudaMalloc(&counts, static_cast<std::size_t>(batch * heads) * 4));
  BENCH_CHECK(cudaMalloc(&d_lengths, static_cast<std::size_t>(batch) * 4));
  const fairkv::keep_plan_view plan{indices, counts, d_lengths, batch, heads, longest};
  const auto view = fairkv::make_paged_view(fairkv::page_layout::nhd, reinterpret_cast<bf16*>(k),
                                            reinterpret_cast<bf16*>(v), num_pages, page_size, heads, head_dim, batch,
                                            d_indptr, d_ids, d_last);
  using policy =
      fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, fairkv::allocators::fair_with_whitelist>;
  const std::vector<fairkv::keep_target> targets{fairkv::keep_target::of_ratio(ratio)};
  const fairkv::request_batch requests{seg_indptr, segments, wl_indptr, whitelist, targets};
  fairkv::cuda::plan_arguments<policy, fairkv::layer_inputs<fairkv::paged_side<const bf16>>> args{
      policy{}, {view.as_const().keys()}, {}, {}, {}, plan, &requests};
  args.lengths = lengths;
  std::size_t plan_bytes = 0, compact_bytes = 0;
  BENCH_TRY(fairkv::cuda::plan(nullptr, plan_bytes, args));
  BENCH_TRY(fairkv::cuda::compact(nullptr, compact_bytes, plan, view, stream));
  void *plan_temp, *compact_temp;
  BENCH_CHECK(cudaMalloc(&plan_temp, plan_bytes));
  BENCH_CHECK(cudaMalloc(&compact_temp, compact_bytes));
  fairkv::cuda::planner<policy, fairkv::layer_inputs<fairkv::paged_side<const bf16>>> planner;
  BENCH_TRY(planner.initialize(args, plan_temp, plan_bytes, stream));  // the per-request parameters, uploaded once

  timer tm, tm_plan;
  std::vector<float> t_total, t_plan, t_gather;
  for (int it = 0; it < warmup + iterations; ++it) {
    BENCH_CHECK(cudaMemcpyAsync(k, k0, bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CHECK(cudaMemcpyAsync(v, v0, bytes, cudaMemcpyDeviceToDevice, stream));
    tm.start(stream);
    BENCH_TRY(planner.run(stream));
    BENCH_TRY(fairkv::cuda::compact(compact_temp, compact_bytes, plan, view, stream));
    const float total = tm.stop_ms(stream);
    tm_plan.start(stream);
    BENCH_TRY(planner.run(stream));
    const float p = tm_plan.stop_ms(stream);
    if (it >= warmup) {
      t_total.push_back(total);
      t_plan.push_back(p);
    }
  }
  BENCH_TRY(fairkv::cuda::read_plan_status(plan_temp, stream));
  BENCH_TRY(fairkv::cuda::read_compact_status(compact_temp, stream));
  // The plan's kept rows, for the gather baseline's output offsets and the floor bytes.
  std::vector<std::int32_t> host_counts(static_cast<std::size_t>(batch * heads));
  BENCH_CHECK(cudaMemcpy(host_counts.data(), counts, host_counts.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<std::int64_t> offsets(host_counts.size());
  std::int64_t kept = 0;
  for (std::size_t i = 0; i < host_counts.size(); ++i) {
    offsets[i] = kept;
    kept += host_counts[i];
  }
  std::int64_t* d_offsets;
  BENCH_CHECK(cudaMalloc(&d_offsets, offsets.size() * 8));
  BENCH_CHECK(cudaMemcpy(d_offsets, offsets.data(), offsets.size() * 8, cudaMemcpyHostToDevice));
  for (int it = 0; it < warmup + iterations; ++it) {
    tm.start(stream);
    gather_kept_kernel<<<dim3(64, static_cast<unsigned>(batch * heads)), 256, 0, stream>>>(
        k0, v0, d_indptr, d_ids, plan, page_size, d_offsets, k_out, v_out);
    BENCH_CHECK(cudaGetLastError());
    const float ms = tm.stop_ms(stream);
    if (it >= warmup) t_gather.push_back(ms);
  }
  const double row_bytes = static_cast<double>(head_dim * 2);
  const double floor_bytes =
      static_cast<double>(tokens * heads) * row_bytes + 4.0 * static_cast<double>(kept) * row_bytes;
  const double gather_bytes = 4.0 * static_cast<double>(kept) * row_bytes;  // kept K and V read and written
  const float total = median(t_total), plan_ms = median(t_plan), gather_ms = median(t_gather);
  std::printf(
      "paged: %lld requests, %lld tokens (1k-8k), page %lld, per-request lists, fair_with_whitelist | fairkv %.4f ms "
      "(plan %.4f, compact %.4f) %7.1f GB/s of floor bytes | plain gather of the kept rows %.4f ms %7.1f GB/s | "
      "fairkv / gather time %.2f\n",
      static_cast<long long>(batch), static_cast<long long>(tokens), static_cast<long long>(page_size), total, plan_ms,
      total - plan_ms, floor_bytes / (total * 1e-3) / 1e9, gather_ms, gather_bytes / (gather_ms * 1e-3) / 1e9,
      total / gather_ms);
  std::fflush(stdout);
  for (void* p : {static_cast<void*>(d_offsets), plan_temp, compact_temp, static_cast<void*>(indices),
                  static_cast<void*>(counts), static_cast<void*>(d_lengths), static_cast<void*>(d_indptr),
                  static_cast<void*>(d_ids), static_cast<void*>(d_last)})
    cudaFree(p);
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
  if (argc <= 1) run_paged_requests(stream);
  cudaStreamDestroy(stream);
  return 0;
}
