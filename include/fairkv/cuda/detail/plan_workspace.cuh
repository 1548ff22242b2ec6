// The CUDA planner's temp storage: one layout for the size query and the run (CUB convention), carved by the
// library's carver with 256-byte buffers (workspace.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fairkv/cuda/detail/page_table_checks.cuh"
#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/score_attention.cuh"
#include "fairkv/cuda/detail/select_split.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/cuda/detail/workspace.cuh"
#include "fairkv/scorer.hpp"
#include "fairkv/selector.hpp"

namespace fairkv::cuda::detail {

struct plan_workspace {
  device_verdict* verdict = nullptr;      // [1] the device's checks of paged keys (read_plan_status)
  plan_params* params = nullptr;          // [tables] the sequences' parameters (batch_params::seq)
  attention_params* attention = nullptr;  // [tables] their attention regions (attention scorers)
  float* scores = nullptr;      // [batch * heads, pitch]
  float* mean = nullptr;        // [batch, pitch] head-mean scores (union)
  std::uint8_t* keep = nullptr; // [batch * heads, pitch] keep mask ([batch, pitch] for union)
  row_stat* stats = nullptr;    // [batch, q_heads, stats_rows] softmax statistics of the query rows
  float* acc = nullptr;         // [batch, q_heads, pitch] accumulated attention
  split_state* states = nullptr;  // [selection rows * groups] per-problem radix state (per_head, union)
  unsigned* slice_hist = nullptr; // [selection rows, slices, 256] last-pass histogram of every slice
  std::int32_t* chunk_counts = nullptr;  // [batch * heads, emit chunks] kept tokens per emit chunk
};

// The parameter tables (per-sequence batches) come before the scratch: initialize() uploads them, run() reads them.
template <class S, class Sel>
std::size_t layout(void* base, plan_workspace& w, const batch_params& bp) noexcept {
  workspace_carver c(base);
  const auto B = static_cast<std::size_t>(bp.batch), H = static_cast<std::size_t>(bp.heads),
             L = static_cast<std::size_t>(bp.pitch), QH = static_cast<std::size_t>(bp.q_heads);
  constexpr bool uni = Sel::kind == selection_kind::union_heads;
  constexpr bool attn = is_attention_source(S::source);
  const std::size_t tables = bp.per_sequence ? B : 0;  // else the parameters travel in batch_params
  c.carve(w.verdict, 1);  // first: read_plan_status finds it at the aligned base
  c.carve(w.params, tables);
  c.carve(w.attention, attn ? tables : 0);
  c.carve(w.scores, B * H * L);
  c.carve(w.mean, uni ? B * L : 0);
  c.carve(w.keep, (uni ? B : B * H) * L);
  c.carve(w.stats, attn ? B * QH * static_cast<std::size_t>(bp.stats_rows) : 0);
  c.carve(w.acc, attn ? B * QH * L : 0);
  constexpr bool split = Sel::kind != selection_kind::head_adaptive;
  const std::size_t sel_rows = uni ? B : B * H;
  c.carve(w.states, split ? sel_rows * static_cast<std::size_t>(bp.groups) : 0);
  c.carve(w.slice_hist, split ? sel_rows * static_cast<std::size_t>(bp.slices) * 256u : 0);
  const std::size_t chunks = (L + static_cast<std::size_t>(emit_chunk) - 1) / static_cast<std::size_t>(emit_chunk);
  c.carve(w.chunk_counts, B * H * chunks);
  return c.bytes();
}

}  // namespace fairkv::cuda::detail
