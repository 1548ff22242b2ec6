// GPU side of the parity suite: owns every device allocation (the library itself never allocates).
#include "gpu_runner.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fairkv/allocators/debias.hpp"
#include "fairkv/cuda/cuda.cuh"
#include "device_buffer.hpp"

namespace fairkv_test {
namespace {

using fairkv::result;
using fairkv::status;

// Never dereferenced: the host-only entry points must not touch device memory.
template <class T>
T* fake_device_pointer() {
  return reinterpret_cast<T*>(std::uintptr_t{0x10000});
}

struct device_plan {
  device_buffer indices, counts, lengths;
  result allocate(std::int64_t batch, std::int64_t heads, std::int64_t capacity) {
    FAIRKV_TRY(indices.allocate(static_cast<std::size_t>(batch * heads * capacity) * sizeof(std::int32_t)));
    FAIRKV_TRY(counts.allocate(static_cast<std::size_t>(batch * heads) * sizeof(std::int32_t)));
    return lengths.allocate(static_cast<std::size_t>(batch) * sizeof(std::int32_t));
  }
  [[nodiscard]] fairkv::keep_plan_view view(std::int64_t batch, std::int64_t heads, std::int64_t capacity) const {
    return {indices.get<std::int32_t>(), counts.get<std::int32_t>(), lengths.get<std::int32_t>(), batch, heads,
            capacity};
  }
  result upload(const fairkv::keep_plan& p) {
    FAIRKV_TRY(allocate(p.batch(), p.heads(), p.capacity()));
    const fairkv::const_keep_plan_view h = p.view();
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemcpy(indices.get(), h.indices, indices.bytes(), cudaMemcpyHostToDevice)));
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemcpy(counts.get(), h.counts, counts.bytes(), cudaMemcpyHostToDevice)));
    return fairkv::cuda::from_cuda(cudaMemcpy(lengths.get(), h.lengths, lengths.bytes(), cudaMemcpyHostToDevice));
  }
  result download(const host_case& c, fairkv::keep_plan& out) const {
    out.resize(c.batch, c.heads, c.tokens);
    const fairkv::keep_plan_view h = out.view();
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemcpy(h.indices, indices.get(), indices.bytes(), cudaMemcpyDeviceToHost)));
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemcpy(h.counts, counts.get(), counts.bytes(), cudaMemcpyDeviceToHost)));
    return fairkv::cuda::from_cuda(cudaMemcpy(h.lengths, lengths.get(), lengths.bytes(), cudaMemcpyDeviceToHost));
  }
};

// A planning case on the device: its scorer inputs and room for a plan of `tokens` slots per head.
struct device_case {
  device_buffer keys, queries, attention, sums, local_sums, scores;
  device_plan plan;
  result upload(const host_case& c) {
    FAIRKV_TRY(keys.upload(c.k_bytes));
    FAIRKV_TRY(scores.upload(c.scores));
    FAIRKV_TRY(queries.upload(c.queries));
    FAIRKV_TRY(attention.upload(c.attention));
    FAIRKV_TRY(sums.upload(c.column_sums));
    FAIRKV_TRY(local_sums.upload(c.local_column_sums));
    return plan.allocate(c.batch, c.heads, c.tokens);
  }
  template <class T>
  [[nodiscard]] auto inputs(const host_case& c) const {
    return make_inputs<T>(c, keys.get<const T>(), queries.get<const float>(), attention.get<const float>(),
                          sums.get<const float>(), scores.get<const float>(), local_sums.get<const float>());
  }
};

// A paged case's page table in device memory; view() reads pools k and v through it.
struct device_table {
  device_buffer indptr, indices, last;
  result upload(const paged_case& c) {
    FAIRKV_TRY(indptr.upload(c.indptr));
    FAIRKV_TRY(indices.upload(c.indices));
    return last.upload(c.last_page_len);
  }
  template <class T>
  [[nodiscard]] fairkv::paged_kv_view<T> view(const paged_case& c, T* k, T* v) const {
    return make_paged(c, k, v, indptr.get<const std::int32_t>(), indices.get<const std::int32_t>(),
                      last.get<const std::int32_t>());
  }
};

}  // namespace

const device_info& probe_device() {
  static const device_info info = [] {
    device_info d;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      d.description = e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)
                                       : std::string("cudaGetDeviceCount reports 0 devices");
      return d;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
      d.description = "cudaGetDeviceProperties failed";
      return d;
    }
    d.available = true;
    d.description = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    return d;
  }();
  return info;
}

int cuda_max_segments() { return fairkv::cuda::max_segments; }

// Fake device pointers where the case has data, null where it has none (what the CPU side sees).
template <class T>
fairkv::layer_inputs<fairkv::kv_view<const T>> fake_inputs(const host_case& c) {
  auto fake = [](const std::vector<float>& v) { return v.empty() ? nullptr : fake_device_pointer<const float>(); };
  return make_inputs<T>(c, c.k_bytes.empty() ? nullptr : fake_device_pointer<const T>(), fake(c.queries),
                        fake(c.attention), fake(c.column_sums), fake(c.scores), fake(c.local_column_sums));
}

namespace {
// A plan output of the case's extents at fake device pointers.
fairkv::keep_plan_view fake_plan_view(const host_case& c) {
  return {fake_device_pointer<std::int32_t>(), fake_device_pointer<std::int32_t>(),
          fake_device_pointer<std::int32_t>(), c.batch, c.heads, c.tokens};
}
}  // namespace

result gpu_can_implement(const host_case& c) {
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto in = fake_inputs<T>(c);
    const fairkv::keep_plan_view out = fake_plan_view(c);
    return with_target(c, [&](auto target) {
      return fairkv::cuda::can_implement(pol, in, c.segments, c.whitelist, target, out);
    });
  });
}

result gpu_planner_can_implement(const host_case& c) {
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto in = fake_inputs<T>(c);
    const fairkv::keep_plan_view out = fake_plan_view(c);
    using planner = fairkv::cuda::planner<std::decay_t<decltype(pol)>, std::decay_t<decltype(in)>>;
    return with_target(c, [&](auto target) {
      return planner::can_implement({pol, in, c.segments, c.whitelist, target, out});
    });
  });
}

result gpu_plan_with_lengths(const host_case& c, const std::vector<std::int32_t>& lengths) {
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto in = fake_inputs<T>(c);
    using planner = fairkv::cuda::planner<std::decay_t<decltype(pol)>, std::decay_t<decltype(in)>>;
    typename planner::arguments args{pol, in, c.segments, c.whitelist, c.ratio, fake_plan_view(c)};
    args.lengths = lengths;
    return planner::can_implement(args);
  });
}

result gpu_size_query(const host_case& c, std::size_t& bytes) {
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto in = fake_inputs<T>(c);
    return with_target(c, [&](auto target) {
      return fairkv::cuda::plan(nullptr, bytes, pol, in, c.segments, c.whitelist, target, fairkv::keep_plan_view{});
    });
  });
}

result gpu_plan_cpu_only(const host_case& c) {
  const auto in = make_inputs<float>(c, fake_device_pointer<const float>(), nullptr, nullptr, nullptr);
  std::size_t bytes = 0;
  const fairkv::policy pol{fairkv::scorers::knorm{}, fairkv::selectors::per_head{}, fairkv::allocators::debias{0.5f}};
  return fairkv::cuda::plan(nullptr, bytes, pol, in, c.segments, c.whitelist, c.ratio, fairkv::keep_plan_view{});
}

result gpu_plan(const host_case& c, fairkv::keep_plan& out, bool graph) {
  device_case d;
  device_buffer temp;
  FAIRKV_TRY(d.upload(c));
  const fairkv::keep_plan_view view = d.plan.view(c.batch, c.heads, c.tokens);
  cudaStream_t stream = nullptr;
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  const result r = with_target(c, [&](auto target) { return with_policy(c, [&](const auto& pol, auto tag) -> result {
    const auto in = d.inputs<decltype(tag)>(c);
    std::size_t bytes = 0;
    FAIRKV_TRY(fairkv::cuda::plan(nullptr, bytes, pol, in, c.segments, c.whitelist, target, view, stream));
    FAIRKV_TRY(temp.allocate(bytes));
    if (!graph) return fairkv::cuda::plan(temp.get(), bytes, pol, in, c.segments, c.whitelist, target, view, stream);
    // Capture the plan into a graph (no allocation or host synchronisation may happen inside) and replay it twice.
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal)));
    const result inside = fairkv::cuda::plan(temp.get(), bytes, pol, in, c.segments, c.whitelist, target, view, stream);
    const result ended = fairkv::cuda::from_cuda(cudaStreamEndCapture(stream, &g));
    FAIRKV_TRY(inside);
    FAIRKV_TRY(ended);
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaGraphInstantiate(&exec, g, 0)));
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemsetAsync(view.indices, 0xFF, d.plan.indices.bytes(), stream)));
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaGraphLaunch(exec, stream)));
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaGraphLaunch(exec, stream)));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    return {};
  }); });
  const result synced = fairkv::cuda::from_cuda(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  FAIRKV_TRY(r);
  FAIRKV_TRY(synced);
  return d.plan.download(c, out);
}

result gpu_can_implement_requests(const host_case& c) {
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    using T = decltype(tag);
    const auto in = fake_inputs<T>(c);
    const fairkv::keep_plan_view out = fake_plan_view(c);
    const fairkv::request_batch requests = c.requests();
    return fairkv::cuda::can_implement(pol, in, requests, out);
  });
}

result gpu_plan_requests(const host_case& c, fairkv::keep_plan& out, bool handle) {
  device_case d;
  device_buffer temp;
  FAIRKV_TRY(d.upload(c));
  const fairkv::keep_plan_view view = d.plan.view(c.batch, c.heads, c.tokens);
  const fairkv::request_batch requests = c.requests();
  cudaStream_t stream = nullptr;
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  const result r = with_policy(c, [&](const auto& pol, auto tag) -> result {
    const auto in = d.inputs<decltype(tag)>(c);
    std::size_t bytes = 0;
    FAIRKV_TRY(fairkv::cuda::plan(nullptr, bytes, pol, in, requests, view, stream));
    FAIRKV_TRY(temp.allocate(bytes));
    if (!handle) return fairkv::cuda::plan(temp.get(), bytes, pol, in, requests, view, stream);
    using planner = fairkv::cuda::planner<std::decay_t<decltype(pol)>, std::decay_t<decltype(in)>>;
    typename planner::arguments args{pol, in, {}, {}, {}, view};
    args.requests = &requests;
    planner p;
    FAIRKV_TRY(p.initialize(args, temp.get(), bytes, stream));
    FAIRKV_TRY(p.run(stream));
    FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemsetAsync(view.indices, 0xFF, d.plan.indices.bytes(), stream)));
    return p.run(stream);  // the tables uploaded once serve every run
  });
  const result synced = fairkv::cuda::from_cuda(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  FAIRKV_TRY(r);
  FAIRKV_TRY(synced);
  return d.plan.download(c, out);
}

namespace {
// cuda::plan over a ragged batch through plan_arguments (one list or per-request lists, the host's lengths): the
// keys from `keys_of(tag)` over the device buffers the caller holds; the rest of the inputs from `d`.
template <class KeysOf>
result plan_ragged(const host_case& c, device_case& d, const std::vector<std::int32_t>& lengths, std::int64_t window,
                   KeysOf&& keys_of, fairkv::keep_plan& out, result& verdict) {
  device_buffer temp;
  const fairkv::keep_plan_view view = d.plan.view(c.batch, c.heads, c.tokens);
  const fairkv::request_batch requests = c.requests();
  const result r = with_target(c, [&](auto target) { return with_policy(c, [&](const auto& pol, auto tag) -> result {
    const auto in = make_ragged_inputs(c, keys_of(tag), window, d.queries.get<const float>(),
                                       d.attention.get<const float>(), d.sums.get<const float>(),
                                       d.scores.get<const float>(), d.local_sums.get<const float>());
    fairkv::cuda::plan_arguments<std::decay_t<decltype(pol)>, std::decay_t<decltype(in)>> args{
        pol, in, c.segments, c.whitelist, target, view};
    if (!c.targets.empty()) args = {pol, in, {}, {}, {}, view, &requests};
    args.lengths = lengths;
    std::size_t bytes = 0;
    FAIRKV_TRY(fairkv::cuda::plan(nullptr, bytes, args));
    FAIRKV_TRY(temp.allocate(bytes));
    FAIRKV_TRY(fairkv::cuda::plan(temp.get(), bytes, args));
    verdict = fairkv::cuda::read_plan_status(temp.get());
    return {};
  }); });
  FAIRKV_TRY(r);
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaDeviceSynchronize()));
  return d.plan.download(c, out);
}
}  // namespace

result gpu_plan_paged(const host_case& c, const paged_case& pages, const std::vector<std::int32_t>& lengths,
                      std::int64_t window, fairkv::keep_plan& out, result& verdict) {
  device_case d;
  device_buffer dk, dv;
  device_table table;
  FAIRKV_TRY(d.upload(c));
  FAIRKV_TRY(dk.upload(pages.k_pool));
  FAIRKV_TRY(dv.upload(pages.v_pool));
  FAIRKV_TRY(table.upload(pages));
  return plan_ragged(c, d, lengths, window, [&](auto tag) {
    using T = decltype(tag);
    return table.view(pages, dk.get<const T>(), dv.get<const T>()).keys();
  }, out, verdict);
}

result gpu_plan_padded(const host_case& c, const std::vector<std::int32_t>& device_lengths,
                       const std::vector<std::int32_t>& lengths, std::int64_t window, fairkv::keep_plan& out,
                       result& verdict) {
  device_case d;
  device_buffer dl;
  FAIRKV_TRY(d.upload(c));
  FAIRKV_TRY(dl.upload(device_lengths));
  return plan_ragged(c, d, lengths, window, [&](auto tag) {
    using T = decltype(tag);
    auto keys = make_view(c, d.keys.get<const T>());
    keys.lengths = dl.get<const std::int32_t>();
    return keys;
  }, out, verdict);
}

result gpu_score(const host_case& c, std::vector<float>& scores) {
  device_case d;
  device_buffer temp, out;
  FAIRKV_TRY(d.upload(c));
  const std::int64_t n = c.batch * c.heads * c.tokens;
  FAIRKV_TRY(out.allocate(static_cast<std::size_t>(n) * sizeof(float)));
  const result r = with_policy(c, [&](const auto& pol, auto tag) -> result {
    const auto in = d.inputs<decltype(tag)>(c);
    std::size_t bytes = 0;
    FAIRKV_TRY(fairkv::cuda::score(nullptr, bytes, pol.scorer, in, out.get<float>(), c.tokens));
    FAIRKV_TRY(temp.allocate(bytes));
    return fairkv::cuda::score(temp.get(), bytes, pol.scorer, in, out.get<float>(), c.tokens);
  });
  FAIRKV_TRY(r);
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaDeviceSynchronize()));
  return out.download(scores);
}

result gpu_plan_handle(const host_case& c, fairkv::keep_plan& first, fairkv::keep_plan& second) {
  device_case d;
  device_buffer temp;
  FAIRKV_TRY(d.upload(c));
  const fairkv::keep_plan_view view = d.plan.view(c.batch, c.heads, c.tokens);
  return with_policy(c, [&](const auto& pol, auto tag) -> result {
    const auto in = d.inputs<decltype(tag)>(c);
    using planner = fairkv::cuda::planner<std::decay_t<decltype(pol)>, std::decay_t<decltype(in)>>;
    const typename planner::arguments args{pol, in, c.segments, c.whitelist, c.target ? *c.target : c.ratio, view};
    FAIRKV_TRY(planner::can_implement(args));
    std::size_t bytes = 0;
    FAIRKV_TRY(planner::get_workspace_size(args, bytes));
    FAIRKV_TRY(temp.allocate(bytes));
    planner p;
    FAIRKV_TRY(p.initialize(args, temp.get(), bytes));
    for (fairkv::keep_plan* out : {&first, &second}) {
      FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemset(view.indices, 0xFF, d.plan.indices.bytes())));
      FAIRKV_TRY(fairkv::cuda::from_cuda(cudaMemset(view.counts, 0xFF, d.plan.counts.bytes())));
      FAIRKV_TRY(p.run());
      FAIRKV_TRY(fairkv::cuda::from_cuda(cudaDeviceSynchronize()));
      FAIRKV_TRY(d.plan.download(c, *out));
    }
    return {};
  });
}

result gpu_compact(const host_case& c, const fairkv::keep_plan& plan, std::vector<unsigned char>& k,
                   std::vector<unsigned char>& v, const std::vector<std::int32_t>* lengths) {
  device_buffer dk, dv, dl, temp;
  FAIRKV_TRY(dk.upload(k));
  FAIRKV_TRY(dv.upload(v));
  if (lengths != nullptr) FAIRKV_TRY(dl.upload(*lengths));
  device_plan dp;
  FAIRKV_TRY(dp.upload(plan));
  const fairkv::keep_plan_view view = dp.view(plan.batch(), plan.heads(), plan.capacity());
  const result r = with_dtype(c.dtype, [&](auto tag) -> result {
    using T = decltype(tag);
    auto kv = make_view(c, dk.get<T>());
    auto vv = make_view(c, dv.get<T>());
    if (lengths != nullptr) kv.lengths = vv.lengths = dl.get<const std::int32_t>();
    std::size_t bytes = 0;
    FAIRKV_TRY(fairkv::cuda::compact(nullptr, bytes, view, kv, vv));
    FAIRKV_TRY(temp.allocate(bytes));
    FAIRKV_TRY(fairkv::cuda::compact(temp.get(), bytes, view, kv, vv));
    return fairkv::cuda::read_compact_status(temp.get());
  });
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaDeviceSynchronize()));
  FAIRKV_TRY(dk.download(k));
  FAIRKV_TRY(dv.download(v));
  return r;
}

result gpu_compact_paged(const paged_case& c, const fairkv::keep_plan& plan, std::vector<unsigned char>& k_pool,
                         std::vector<unsigned char>& v_pool) {
  device_buffer dk, dv, temp;
  device_table table;
  FAIRKV_TRY(dk.upload(k_pool));
  FAIRKV_TRY(dv.upload(v_pool));
  FAIRKV_TRY(table.upload(c));
  device_plan dp;
  FAIRKV_TRY(dp.upload(plan));
  const fairkv::keep_plan_view view = dp.view(plan.batch(), plan.heads(), plan.capacity());
  const result r = with_dtype(c.dtype, [&](auto tag) -> result {
    using T = decltype(tag);
    const auto pv = table.view(c, dk.get<T>(), dv.get<T>());
    std::size_t bytes = 0;
    FAIRKV_TRY(fairkv::cuda::compact(nullptr, bytes, view, pv));
    FAIRKV_TRY(temp.allocate(bytes));
    FAIRKV_TRY(fairkv::cuda::compact(temp.get(), bytes, view, pv));
    return fairkv::cuda::read_compact_status(temp.get());
  });
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaDeviceSynchronize()));
  FAIRKV_TRY(dk.download(k_pool));
  FAIRKV_TRY(dv.download(v_pool));
  return r;
}

result gpu_compact_into(const paged_case& c, const paged_case& to, const fairkv::keep_plan& plan,
                        std::vector<unsigned char>& k_pool, std::vector<unsigned char>& v_pool) {
  device_buffer dk, dv, temp;
  device_table from_table, to_table;
  FAIRKV_TRY(dk.upload(k_pool));
  FAIRKV_TRY(dv.upload(v_pool));
  FAIRKV_TRY(from_table.upload(c));
  FAIRKV_TRY(to_table.upload(to));
  device_plan dp;
  FAIRKV_TRY(dp.upload(plan));
  const fairkv::keep_plan_view view = dp.view(plan.batch(), plan.heads(), plan.capacity());
  const result r = with_dtype(c.dtype, [&](auto tag) -> result {
    using T = decltype(tag);
    const auto from = from_table.view(c, dk.get<T>(), dv.get<T>());
    const auto dst = to_table.view(to, dk.get<T>(), dv.get<T>());
    std::size_t bytes = 0;
    FAIRKV_TRY(fairkv::cuda::compact_into(nullptr, bytes, view, from.as_const(), dst));
    FAIRKV_TRY(temp.allocate(bytes));
    FAIRKV_TRY(fairkv::cuda::compact_into(temp.get(), bytes, view, from.as_const(), dst));
    return fairkv::cuda::read_compact_status(temp.get());
  });
  FAIRKV_TRY(fairkv::cuda::from_cuda(cudaDeviceSynchronize()));
  FAIRKV_TRY(dk.download(k_pool));
  FAIRKV_TRY(dv.download(v_pool));
  return r;
}

}  // namespace fairkv_test
