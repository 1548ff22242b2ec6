// The paged engine loop (engine.hpp) on the CUDA backend: the pool and the block tables in device memory, every
// request planned in one cuda::plan call (per-request lists, the host's copy of the sequence lengths, as an engine
// keeps seq_lens on the host), the device's verdict on the tables read back, the pool compacted in place; the
// engine then takes its freed blocks back and decodes on the host. Without a device it prints SKIPPED.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "engine.hpp"
#include "fairkv/cuda/cuda.cuh"

namespace {

// A device copy of a host vector, freed on scope exit.
template <class T>
struct device_vector {
  T* ptr = nullptr;
  std::size_t n = 0;
  fairkv::result upload(const std::vector<T>& v) {
    n = v.size();
    FAIRKV_CUDA_TRY(cudaMalloc(&ptr, (n == 0 ? 1 : n) * sizeof(T)));
    return fairkv::cuda::from_cuda(cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  fairkv::result download(std::vector<T>& v) const {
    v.resize(n);
    return fairkv::cuda::from_cuda(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  ~device_vector() { cudaFree(ptr); }
};

fairkv::result compress_on_device(paged_engine::engine& e, const std::vector<paged_engine::request>& reqs,
                                  std::vector<std::int32_t>& counts) {
  using namespace paged_engine;
  const std::int64_t B = e.batch();
  std::int32_t longest = 0;
  std::vector<std::int32_t> lengths;  // the engine's host seq_lens
  for (std::int64_t b = 0; b < B; ++b) {
    lengths.push_back(static_cast<std::int32_t>(e.view().tokens_of(b)));
    longest = std::max(longest, lengths.back());
  }
  device_vector<float> k, v;
  device_vector<std::int32_t> indptr, blocks, last, indices, dcounts, dlengths;
  FAIRKV_TRY(k.upload(e.k_pool));
  FAIRKV_TRY(v.upload(e.v_pool));
  FAIRKV_TRY(indptr.upload(e.indptr));
  FAIRKV_TRY(blocks.upload(e.blocks));
  FAIRKV_TRY(last.upload(e.last_block_len));
  FAIRKV_TRY(indices.upload(std::vector<std::int32_t>(static_cast<std::size_t>(B * kv_heads * longest))));
  FAIRKV_TRY(dcounts.upload(std::vector<std::int32_t>(static_cast<std::size_t>(B * kv_heads))));
  FAIRKV_TRY(dlengths.upload(std::vector<std::int32_t>(static_cast<std::size_t>(B))));
  const auto view = fairkv::make_paged_view(fairkv::page_layout::nhd, k.ptr, v.ptr, e.num_blocks, block_size, kv_heads,
                                            head_dim, B, indptr.ptr, blocks.ptr, last.ptr);
  const fairkv::keep_plan_view plan{indices.ptr, dcounts.ptr, dlengths.ptr, B, kv_heads, longest};
  const request_lists lists(reqs);
  const fairkv::request_batch batch = lists.batch();
  fairkv::cuda::plan_arguments<policy, fairkv::layer_inputs<fairkv::paged_side<const float>>> args{
      policy{}, {view.as_const().keys()}, {}, {}, {}, plan, &batch};
  args.lengths = lengths;
  std::size_t plan_bytes = 0, compact_bytes = 0;
  FAIRKV_TRY(fairkv::cuda::plan(nullptr, plan_bytes, args));
  FAIRKV_TRY(fairkv::cuda::compact(nullptr, compact_bytes, plan, view));
  device_vector<unsigned char> plan_temp, compact_temp;
  FAIRKV_TRY(plan_temp.upload(std::vector<unsigned char>(plan_bytes)));
  FAIRKV_TRY(compact_temp.upload(std::vector<unsigned char>(compact_bytes)));
  FAIRKV_TRY(fairkv::cuda::plan(plan_temp.ptr, plan_bytes, args));
  FAIRKV_TRY(fairkv::cuda::read_plan_status(plan_temp.ptr));
  FAIRKV_TRY(fairkv::cuda::compact(compact_temp.ptr, compact_bytes, plan, view));
  FAIRKV_TRY(fairkv::cuda::read_compact_status(compact_temp.ptr));
  FAIRKV_TRY(k.download(e.k_pool));
  FAIRKV_TRY(v.download(e.v_pool));
  return dcounts.download(counts);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device; the paged engine loop did not run on the CUDA backend\n");
    return 0;
  }
  return paged_engine::run("cuda", compress_on_device);
}
