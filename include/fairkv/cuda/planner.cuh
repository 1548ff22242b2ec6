// The CUDA planner as a handle in CUTLASS's shape, for engines that plan the same layer shape again and again
// (every decode step, or a captured CUDA graph):
//
//   using planner = fairkv::cuda::planner<my_policy, fairkv::layer_inputs<fairkv::kv_view<const half>, half>>;
//   const planner::arguments args{policy, inputs, segments, whitelist, ratio, plan_view};  // or a keep_target
//   FAIRKV_TRY(planner::can_implement(args));            // host checks only, the CPU oracle's messages
//   std::size_t bytes = 0;
//   FAIRKV_TRY(planner::get_workspace_size(args, bytes));
//   planner p;
//   FAIRKV_TRY(p.initialize(args, d_workspace, bytes));  // the host front end, once: kernel parameters
//   FAIRKV_TRY(p.run(stream));                           // launches only; run again for the same arguments
//
// initialize() runs the library's host front end (detail/plan_front.hpp) and builds every kernel parameter;
// run() only launches, so it can be called once per step or captured into a graph, and replays redo no host
// work. The handle keeps copies of the views and the parameters (about 11 KiB), not of the host segments and
// whitelist: they are read only by initialize(). The free functions of cuda/plan.cuh are this handle, used once.
//
// A batch of requests, each with its own segments, whitelist and target (fairkv/request_batch.hpp, in
// `arguments::requests`), plans in the same one launch sequence: the parameters of each sequence (about 11 KiB)
// go into the workspace with one host-to-device copy that initialize() enqueues on its stream (the handle keeps
// the host copy alive); run on that stream, or order yours after it. The workspace then holds those tables: it
// belongs to this handle until the next initialize().
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "fairkv/budget.hpp"
#include "fairkv/cuda/detail/launch.cuh"
#include "fairkv/cuda/detail/launch_scores.cuh"
#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/plan_kernels.cuh"
#include "fairkv/cuda/detail/plan_setup.cuh"
#include "fairkv/cuda/detail/plan_workspace.cuh"
#include "fairkv/cuda/detail/score_attention.cuh"
#include "fairkv/cuda/detail/select_split.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/cuda/detail/workspace.cuh"
#include "fairkv/cuda/error.cuh"
#include "fairkv/detail/plan_front.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/request_batch.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"

namespace fairkv::cuda {

// One plan request. `inputs` and `out` describe device memory; `segments` and `whitelist` are small host
// arrays (detail/params.cuh states the limits). `target` is a ratio or a token budget (fairkv/budget.hpp); a
// double in its place is a ratio, so `{policy, inputs, segments, whitelist, 0.5, out}` means what it always did.
// `requests` (host, optional): each sequence's own segments, whitelist and target instead of the three above,
// which must then be left empty (the target is ignored). `lengths` (host): for paged keys and padded
// kv_views (inputs.keys.lengths set), every sequence's token count as the device's arrays say; empty for a
// kv_view whose sequences all have its tokens.
template <class Policy, class Inputs>
struct plan_arguments {
  Policy policy;
  Inputs inputs;
  std::span<const segment> segments{};
  std::span<const std::int32_t> whitelist{};
  keep_target target{};
  keep_plan_view out{};
  const request_batch* requests = nullptr;
  std::span<const std::int32_t> lengths{};
};

template <class Policy, class Inputs>
class planner {
  static_assert(dependent_false<Policy>,
                "fairkv::cuda::planner<Policy, Inputs>: Policy must be a fairkv::policy<S, Sel, A> and Inputs a "
                "fairkv::layer_inputs<KeySource, Q>");
};

template <class S, class Sel, class A, class KeySource, class Q>
class planner<policy<S, Sel, A>, layer_inputs<KeySource, Q>> {
 public:
  using arguments = plan_arguments<policy<S, Sel, A>, layer_inputs<KeySource, Q>>;

  // Every check a plan makes before its first launch, with the CPU oracle's statuses and messages: the request,
  // this backend's limits, the output plan, and (for key rows above 48 KiB of shared memory) the device's
  // opt-in limit. A success means run() will launch, device errors aside. Touches no device memory.
  [[nodiscard]] static result can_implement(const arguments& args) noexcept {
    detail::batch_params bp;
    FAIRKV_TRY(build(args, true, bp, [](std::int64_t, const detail::plan_params&, const detail::attention_params&) {
      return result{};
    }));
    FAIRKV_TRY(check_output(args, bp));
    return check_key_smem(args.inputs);
  }

  // The temp storage initialize() needs. Like the CPU's size query, it does not look at the whitelist budget.
  [[nodiscard]] static result get_workspace_size(const arguments& args, std::size_t& bytes) noexcept {
    detail::batch_params bp;
    detail::plan_workspace w;
    FAIRKV_TRY(build(args, false, bp, [](std::int64_t, const detail::plan_params&, const detail::attention_params&) {
      return result{};
    }));
    bytes = detail::layout<S, Sel>(nullptr, w, bp);
    return {};
  }

  // Builds the kernel parameters and carves d_workspace (device memory of at least get_workspace_size bytes,
  // which must outlive every run). Host work only, plus the key kernel's shared-memory opt-in when it needs one
  // and, for per-sequence parameters (requests), their copy into the workspace on `stream`.
  [[nodiscard]] result initialize(const arguments& args, void* d_workspace, std::size_t workspace_bytes,
                                  cudaStream_t stream = nullptr) noexcept {
    ready_ = false;
    max_slices_ = 0;
    tables_.clear();
    attention_tables_.clear();
    FAIRKV_TRY(build(args, true, bp_, [&](std::int64_t, const detail::plan_params& p,
                                          const detail::attention_params& a) -> result {
      for (std::int32_t g = 0; g < p.groups; ++g) max_slices_ = std::max(max_slices_, detail::slices_of(p.sizes[g]));
      if (!bp_.per_sequence) {
        bp_.one = p;
        bp_.one_attention = a;
        return {};
      }
      try {
        tables_.push_back(p);
        if constexpr (is_attention_source(S::source)) attention_tables_.push_back(a);
      } catch (...) {
        return result::error(status::out_of_memory, "the per-sequence parameters could not be allocated on the host");
      }
      return {};
    }));
    FAIRKV_TRY(fairkv::detail::check_workspace("temp_storage_bytes", workspace_bytes,
                                               detail::layout<S, Sel>(nullptr, w_, bp_)));
    FAIRKV_TRY(check_output(args, bp_));
    if constexpr (S::source == score_source::keys)
      FAIRKV_TRY((detail::prepare_key_launch<S, KeySource>(args.inputs.keys, keys_)));
    if (d_workspace == nullptr) return result::error(status::null_pointer, "the temp storage is null");
    detail::layout<S, Sel>(detail::align_base(d_workspace), w_, bp_);
    if constexpr (!detail::is_dense_view_v<KeySource>) bp_.table_verdict = &w_.verdict->code;
    if (bp_.per_sequence) {
      bp_.seq = w_.params;
      bp_.attn = w_.attention;
      FAIRKV_CUDA_TRY(cudaMemcpyAsync(w_.params, tables_.data(), tables_.size() * sizeof(detail::plan_params),
                                      cudaMemcpyHostToDevice, stream));
      if (!attention_tables_.empty())
        FAIRKV_CUDA_TRY(cudaMemcpyAsync(w_.attention, attention_tables_.data(),
                                        attention_tables_.size() * sizeof(detail::attention_params),
                                        cudaMemcpyHostToDevice, stream));
    }
    scorer_.emplace(args.policy.scorer);
    inputs_ = args.inputs;
    out_ = args.out;
    ready_ = true;
    return {};
  }

  // Plans the layer on `stream`: launches only, each checked as it is made. No allocation, no host wait.
  [[nodiscard]] result run(cudaStream_t stream = nullptr) const noexcept {
    using namespace detail;
    if (!ready_)
      return result::error(status::invalid_argument, "fairkv::cuda::planner::run() before a successful initialize()");
    const batch_params& bp = bp_;
    const plan_workspace& w = w_;
    FAIRKV_CUDA_TRY(cudaMemsetAsync(w.verdict, 0, sizeof(device_verdict), stream));
    if constexpr (!is_dense_view_v<KeySource>) {  // the page tables, before any kernel reads through them
      FAIRKV_TRY(launch(validate_pages_kernel<const T>, 64, 256, 0, stream, inputs_.keys, w.verdict,
                        static_cast<int*>(nullptr)));
      FAIRKV_TRY(launch(check_lengths_kernel<KeySource>, grid_for(bp.batch, 256), 256, 0, stream, inputs_.keys, bp,
                        w.verdict));
    } else if (inputs_.keys.lengths != nullptr) {
      FAIRKV_TRY(launch(check_lengths_kernel<KeySource>, grid_for(bp.batch, 256), 256, 0, stream, inputs_.keys, bp,
                        w.verdict));
    }
    FAIRKV_TRY((launch_scores<S, A, KeySource, Q>(*scorer_, inputs_, bp, keys_, w, stream)));
    const std::int64_t rows = static_cast<std::int64_t>(bp.batch) * bp.heads;
    constexpr bool uni = Sel::kind == selection_kind::union_heads;
    if constexpr (Sel::kind == selection_kind::per_head || uni) {
      const float* sel_scores = w.scores;
      if constexpr (uni) {
        FAIRKV_TRY(launch(head_mean_kernel<>, grid_for(std::int64_t{bp.batch} * bp.pitch, elementwise_threads),
                          elementwise_threads, 0, stream, w.scores, bp, w.mean));
        sel_scores = w.mean;
      }
      const std::int64_t problems = (uni ? bp.batch : rows) * bp.groups;
      FAIRKV_CUDA_TRY(cudaMemsetAsync(w.states, 0, static_cast<std::size_t>(problems) * sizeof(split_state), stream));
      if (max_slices_ > 0) {
        const dim3 grid(static_cast<unsigned>(max_slices_), static_cast<unsigned>(problems));
        for (int pass = 0; pass < 4; ++pass)
          FAIRKV_TRY(launch(split_hist_kernel<Sel::kind>, grid, split_threads, 0, stream, bp, sel_scores, w.states,
                            w.slice_hist, pass));
        FAIRKV_TRY(launch(split_mark_kernel<Sel::kind>, grid, split_threads, 0, stream, bp, sel_scores, w.states,
                          w.slice_hist, w.keep));
      }
    } else if constexpr (Sel::kind == selection_kind::head_adaptive) {
      FAIRKV_TRY(launch(head_adaptive_select_kernel<>,
                        dim3(static_cast<unsigned>(bp.batch), static_cast<unsigned>(bp.groups)), select_threads, 0,
                        stream, bp, w.scores, w.keep));
    } else {
      static_assert(dependent_false<Sel>, "fairkv::cuda::planner: unknown selection_kind");
    }
    const dim3 emit_grid(static_cast<unsigned>((std::int64_t{bp.pitch} + emit_chunk - 1) / emit_chunk),
                         static_cast<unsigned>(rows));
    FAIRKV_TRY(launch(emit_count_kernel<>, emit_grid, emit_threads, 0, stream, w.keep, bp, uni, w.chunk_counts));
    return launch(emit_write_kernel<>, emit_grid, emit_threads, 0, stream, w.keep, bp, uni, w.chunk_counts, out_);
  }

 private:
  using T = typename KeySource::value_type;

  template <class Each>
  [[nodiscard]] static result build(const arguments& args, bool with_budgets, detail::batch_params& bp,
                                    Each&& each) noexcept {
    return detail::build_params(args.policy, args.inputs, args.segments, args.whitelist, args.target, args.requests,
                                args.lengths, with_budgets, bp, each);
  }
  [[nodiscard]] static result check_output(const arguments& args, const detail::batch_params& bp) noexcept {
    return fairkv::detail::check_output_plan(args.out, bp.batch, bp.heads, bp.pitch);
  }
  // The key kernel's shared memory against the device's opt-in limit, without opting in.
  [[nodiscard]] static result check_key_smem(const layer_inputs<KeySource, Q>& in) noexcept {
    if constexpr (S::source == score_source::keys) {
      const std::size_t bytes = static_cast<std::size_t>(detail::staged_rows(in.keys.head_dim, sizeof(T))) * 4u *
                                static_cast<std::size_t>(detail::staged_row_words(in.keys.head_dim, sizeof(T)));
      return detail::check_dynamic_smem(bytes, 0, "the key scoring kernel");
    } else {
      return {};
    }
  }

  detail::batch_params bp_{};
  std::vector<detail::plan_params> tables_;                // per-sequence parameters: the source of their upload
  std::vector<detail::attention_params> attention_tables_;
  std::int32_t max_slices_ = 0;  // the most selection slices of any group: the split select's grid
  detail::plan_workspace w_{};
  detail::key_launch keys_{};
  std::optional<S> scorer_;  // a scorer need not be default-constructible
  layer_inputs<KeySource, Q> inputs_{};
  keep_plan_view out_{};
  bool ready_ = false;
};

// The device's verdict on the last plan made in this temp storage: for paged keys, their page tables (ids in the
// pool, indptr, last_page_len) and the host's lengths against them; where it is not ok, the kernels read no key
// and the plan's contents are unspecified. For a padded kv_view, its device lengths against the host's (a
// mismatch leaves the plan unspecified; every row read lies inside the view, as the host's lengths are within its
// tokens). Always ok for a kv_view without lengths. Synchronises `stream`: call it off the hot
// path (debug builds, tests, the first plan over a new table).
[[nodiscard]] inline result read_plan_status(const void* d_temp_storage, cudaStream_t stream = nullptr) noexcept {
  detail::device_verdict st{};
  FAIRKV_CUDA_TRY(cudaMemcpyAsync(&st, detail::align_base(const_cast<void*>(d_temp_storage)), sizeof(st),
                                  cudaMemcpyDeviceToHost, stream));
  FAIRKV_CUDA_TRY(cudaStreamSynchronize(stream));
  if (st.code == detail::verdict_ok) return {};
  if (st.code == detail::keys_length_mismatch)
    return result::error(status::invalid_argument,
                         "inputs.keys: sequence %d has %d tokens in device memory (its page table, or "
                         "inputs.keys.lengths) but lengths[%d] = %d",
                         st.a, st.c, st.a, st.b);
  const result table = detail::table_error(st, "inputs.keys");
  if (!table.ok()) return table;
  return result::error(status::internal_error, "unknown planning status %d", st.code);
}

}  // namespace fairkv::cuda
