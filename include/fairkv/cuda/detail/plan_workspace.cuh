// The CUDA planner's temp storage: one layout for the size query and the run (CUB convention), carved by the
// library's carver with 256-byte buffers (workspace.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fairkv/cuda/detail/params.cuh"
#include "fairkv/cuda/detail/score_attention.cuh"
#include "fairkv/cuda/detail/select_split.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/cuda/detail/workspace.cuh"
#include "fairkv/scorer.hpp"
#include "fairkv/selector.hpp"

namespace fairkv::cuda::detail {

struct plan_workspace {
  float* scores = nullptr;      // [batch * heads, tokens]
  float* mean = nullptr;        // [batch, tokens] head-mean scores (union)
  std::uint8_t* keep = nullptr; // [batch * heads, tokens] keep mask ([batch, tokens] for union)
  row_stat* stats = nullptr;    // [batch, q_heads, total_rows] softmax statistics of the query rows
  float* acc = nullptr;         // [batch, q_heads, tokens] accumulated attention
  split_state* states = nullptr;  // [selection rows * groups] per-problem radix state (per_head, union)
  unsigned* slice_hist = nullptr; // [selection rows, total slices, 256] last-pass histogram of every slice
  std::int32_t* chunk_counts = nullptr;  // [batch * heads, emit chunks] kept tokens per emit chunk
};

template <class S, class Sel>
std::size_t layout(void* base, plan_workspace& w, const plan_params& p, const attention_params& a) noexcept {
  workspace_carver c(base);
  const auto B = static_cast<std::size_t>(p.batch), H = static_cast<std::size_t>(p.heads),
             L = static_cast<std::size_t>(p.tokens);
  constexpr bool uni = Sel::kind == selection_kind::union_heads;
  constexpr bool attn = is_attention_source(S::source);
  c.carve(w.scores, B * H * L);
  c.carve(w.mean, uni ? B * L : 0);
  c.carve(w.keep, (uni ? B : B * H) * L);
  c.carve(w.stats, attn ? B * static_cast<std::size_t>(a.q_heads) * static_cast<std::size_t>(a.total_rows) : 0);
  c.carve(w.acc, attn ? B * static_cast<std::size_t>(a.q_heads) * L : 0);
  constexpr bool split = Sel::kind != selection_kind::head_adaptive;
  const std::size_t sel_rows = uni ? B : B * H;
  c.carve(w.states, split ? sel_rows * static_cast<std::size_t>(p.groups) : 0);
  c.carve(w.slice_hist, split ? sel_rows * static_cast<std::size_t>(p.slice_begin[p.groups]) * 256u : 0);
  const std::size_t chunks = (L + static_cast<std::size_t>(emit_chunk) - 1) / static_cast<std::size_t>(emit_chunk);
  c.carve(w.chunk_counts, B * H * chunks);
  return c.bytes();
}

}  // namespace fairkv::cuda::detail
