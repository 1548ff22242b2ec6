// The CUDA backend's planner, in CUB's shape:
//
//   size_t bytes = 0;
//   fairkv::cuda::plan(nullptr, bytes, policy, inputs, segments, whitelist, ratio, plan_view, stream);  // size
//   fairkv::cuda::plan(d_temp, bytes, policy, inputs, segments, whitelist, ratio, plan_view, stream);   // run
//   (ratio: a double, or a fairkv::keep_target: a ratio or a token budget per KV head, fairkv/budget.hpp)
//
// `inputs` and `plan_view` point at device memory; `segments` and `whitelist` are small HOST arrays that are
// validated on the host and passed to the kernels by value (detail/params.cuh states the limits). Every check
// that the CPU oracle makes is made on the host by the shared front end (detail/plan_front.hpp), with the CPU's
// messages, before the first launch; every launch is checked as it is made. Nothing is
// allocated and the host never waits for the device, so a plan can be captured in a CUDA graph.
// A batch of requests (per-sequence lists) or of paged keys of different lengths plans in the same one launch
// sequence, its sequences' parameters uploaded once into the temp storage (plan_arguments, cuda/planner.cuh).
//
// Both are planner (cuda/planner.cuh) used once: can_implement / get_workspace_size / initialize / run. Engines
// that plan the same shape every step keep a planner and call run() alone.
//
// Pipeline (all on `stream`): score -> [head mean for union] -> select: radix select of each (row, group)
// threshold + stable scan-based marking (per_head / union: many blocks per problem, detail/select_split.cuh;
// head_adaptive: one block per (sequence, group), detail/select.cuh) -> emit (count + scan of the keep mask into
// ascending indices, many blocks per row). Budgets per (head, group) are computed on the host by the policy's allocator: they
// depend only on the sizes and whitelist counts, which the host knows. debias needs the plain policy's
// per-group counts (a device result) and is not supported here (status::not_supported). fair_paper (the paper's
// two-span mode) widens its spans to the groups [0, split) and [split, L) on the host (one group for its
// StreamingLLM) and scores with the same kernels in the paper's way (detail/score_attention.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "fairkv/budget.hpp"
#include "fairkv/cuda/planner.cuh"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/request_batch.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cuda {

// Everything in one plan_arguments (cuda/planner.cuh): one list or per-request lists, and for paged keys the host
// copy of the sequences' lengths. Paged keys: the device checks their page tables against those lengths before
// any kernel reads through them; read_plan_status reports a mismatch (the plan is then unspecified).
template <class Policy, class Inputs>
[[nodiscard]] result plan(void* d_temp_storage, std::size_t& temp_storage_bytes,
                          const plan_arguments<Policy, Inputs>& args, cudaStream_t stream = nullptr) noexcept {
  using handle = planner<Policy, Inputs>;
  if (d_temp_storage == nullptr) return handle::get_workspace_size(args, temp_storage_bytes);
  handle h;
  FAIRKV_TRY(h.initialize(args, d_temp_storage, temp_storage_bytes, stream));
  return h.run(stream);
}

// Checks everything plan() checks on the host, without touching device memory. `out` must describe device
// memory of the right extents. A success means plan() will launch (device errors aside). `target` is a ratio or a
// token budget (fairkv/budget.hpp); a double is a ratio.
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result can_implement(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                   std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                   const keep_target& target, const keep_plan_view& out) noexcept {
  using handle = planner<policy<S, Sel, A>, layer_inputs<KeySource, Q>>;
  return handle::can_implement({pol, in, segments, whitelist, target, out});
}

// Plans one layer on the device. With d_temp_storage == nullptr only temp_storage_bytes is written.
// On error nothing has been launched, except for device_error results from the launches themselves (a launch
// that fails stops the plan there).
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(void* d_temp_storage, std::size_t& temp_storage_bytes, const policy<S, Sel, A>& pol,
                          const layer_inputs<KeySource, Q>& in, std::span<const segment> segments,
                          std::span<const std::int32_t> whitelist, const keep_target& target, keep_plan_view out,
                          cudaStream_t stream = nullptr) noexcept {
  const plan_arguments<policy<S, Sel, A>, layer_inputs<KeySource, Q>> args{pol, in, segments, whitelist, target, out};
  return plan(d_temp_storage, temp_storage_bytes, args, stream);
}

// A batch of requests, each sequence with its own segments, whitelist and target (fairkv/request_batch.hpp, host
// arrays), in one launch sequence; sequence b's plan is the one a single-list call gives for that sequence alone,
// and errors in one sequence's lists name it (as cpu::plan's request overload). The sequences' parameters are
// copied into the temp storage on `stream` before the launches (one host-to-device copy from pageable memory,
// which the driver stages before the call returns): to capture the plan into a graph, keep a planner and capture
// its run().
template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result can_implement(const policy<S, Sel, A>& pol, const layer_inputs<KeySource, Q>& in,
                                   const request_batch& requests, const keep_plan_view& out) noexcept {
  using handle = planner<policy<S, Sel, A>, layer_inputs<KeySource, Q>>;
  return handle::can_implement({pol, in, {}, {}, {}, out, &requests});
}

template <class S, class Sel, class A, class KeySource, class Q>
[[nodiscard]] result plan(void* d_temp_storage, std::size_t& temp_storage_bytes, const policy<S, Sel, A>& pol,
                          const layer_inputs<KeySource, Q>& in, const request_batch& requests, keep_plan_view out,
                          cudaStream_t stream = nullptr) noexcept {
  const plan_arguments<policy<S, Sel, A>, layer_inputs<KeySource, Q>> args{pol, in, {}, {}, {}, out, &requests};
  return plan(d_temp_storage, temp_storage_bytes, args, stream);
}

}  // namespace fairkv::cuda
