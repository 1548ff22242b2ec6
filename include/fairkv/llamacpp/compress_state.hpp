// fairkv over llama.cpp's own KV cache, reached through a sequence state (llama_state_seq_get_data): views over the
// state's K rows and V rows (or V^T), one fairkv plan per layer, compaction in place in the state buffer, then a
// state of the kept cells only, ready for llama_state_seq_set_data. Nothing here includes llama.h
// (fairkv/llamacpp/sequence.hpp does the round trip on a llama_context).
//
// llama.cpp's cells are shared by every layer and head: a cell is one row index in all of them. So every (layer,
// head) must keep the same number of tokens m; which tokens may differ per layer and per head (per_head selector),
// because a cell's position only feeds the attention mask, and every kept token is visible to every later one.
// The kept cells get positions last - m + 1 .. last (last = the original last position): llama.cpp requires the
// next token at last + 1, and RoPE of the cached keys is inside K already, so nothing else moves.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fairkv/budget.hpp"
#include "fairkv/cpu/compact.hpp"
#include "fairkv/cpu/executor.hpp"
#include "fairkv/cpu/plan.hpp"
#include "fairkv/dispatch.hpp"
#include "fairkv/dtype.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/llamacpp/attention_statistics.hpp"
#include "fairkv/llamacpp/state_format.hpp"
#include "fairkv/policy_spec.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/views/kv_view.hpp"

namespace fairkv::llamacpp {

// What to compress a sequence to. Token indices (segments, whitelist) are cell ranks in the state, which are the
// positions of a sequence prefilled from position 0. The spans must outlive the call.
struct request {
  policy_spec policy;
  std::span<const segment> segments;
  std::span<const std::int32_t> whitelist;
  keep_target target;
  float scale = 0.0f;  // softmax scale where attention is recomputed from queries; 0: 1 / sqrt(head_dim)
  // compress_sequence*: hold the original state during the round trip, to load it back if llama.cpp refuses the
  // compressed one (two states at the peak). false: one state at the peak (the compressed state is written over
  // the original), and a refused load leaves the sequence empty (the error says so). A sequence alone in its own KV
  // stream (llama_context_params::kv_unified false) always finds room for fewer cells than it held.
  bool keep_original = true;
};

// One (layer, KV head)'s own segments and whitelist, in the cell ranks of the state (compress_state_per_head), and
// for the prioritized allocator its own priorities (one per segment; empty: the request's policy as it is).
struct head_request {
  std::span<const segment> segments;
  std::span<const std::int32_t> whitelist;
  std::span<const segment_priority> priorities{};
};

struct compression {
  std::string error;                // empty on success; else nothing below is meaningful
  std::vector<std::uint8_t> state;  // the state to load: only the kept cells
  std::uint32_t cells_before = 0, cells_after = 0;
  std::size_t state_bytes_before = 0;  // the state that was compressed
  bool v_trans = false;  // the state holds V transposed (llama.cpp without flash attention)
  int window_used = 0;   // the policy's window after clamping to the sequence (kvpress needs L > window)
  const char* statistics = no_statistics::name;  // what the attention scorer read (attention_statistics' names)
  std::vector<std::vector<std::vector<std::int32_t>>> kept;  // [layer][kv head]: kept token indices, ascending
  double parse_ms = 0, plan_ms = 0, write_ms = 0;
  std::int32_t plan_count = 0, plan_length = 0;  // cells after and before, as head_plan's view reads them

  // What (layer, head) kept, as the one-sequence, one-head plan fairkv::remap_segments and remap_whitelist take
  // (sequence 0, head 0): how a caller carries that head's segments and whitelist over to the compressed state.
  // Valid while this compression lives unchanged; layer and head must be in range (kept's extents).
  [[nodiscard]] const_keep_plan_view head_plan(int layer, int head) const noexcept {
    const std::vector<std::int32_t>& k = kept[std::size_t(layer)][std::size_t(head)];
    return {k.data(), &plan_count, &plan_length, 1, 1, plan_length, nullptr};
  }
};

using f16_layer_inputs = layer_inputs<kv_view<const half_t>>;
using f32_layer_inputs = layer_inputs<kv_view<const float>>;

// Plans one layer for the policy a spec names: fairkv::dispatch over fairkv::cpu::plan on `executor`,
// instantiated (every policy dispatch can name) in the caller's translation unit. An application that compresses
// from several units can instantiate it in one and pass a planner forwarding there, as fairkv-llamacpp does
// (examples/llamacpp/plan_layer_f16.cpp).
template <class Executor = cpu::serial_executor>
struct inline_planner {
  Executor executor{};

  template <class Keys>
  [[nodiscard]] result operator()(const policy_spec& spec, const layer_inputs<Keys>& in,
                                  std::span<const segment> segments, std::span<const std::int32_t> whitelist,
                                  keep_target target, keep_plan& out) const {
    return dispatch(spec,
                    [&](const auto& pol) { return cpu::plan(executor, pol, in, segments, whitelist, target, out); });
  }
};

namespace detail {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The checks that need the parsed state and no plan.
inline std::string check_request(const seq_state& st, const state_shape& shape, const request& req) {
  if (shape.n_head_kv < 1 || shape.head_dim < 1)
    return "shape: " + std::to_string(shape.n_head_kv) + " KV heads x " + std::to_string(shape.head_dim) +
           " values per head";
  if (std::int64_t(shape.n_head_kv) * shape.head_dim != std::int64_t(st.n_embd_k))
    return "K rows of " + std::to_string(st.n_embd_k) + " values are not " + std::to_string(shape.n_head_kv) +
           " KV heads x " + std::to_string(shape.head_dim);
  if (req.policy.selector == selection_kind::head_adaptive)
    return "selector head_adaptive gives every head its own count, but llama.cpp's cells are shared by all layers "
           "and heads (one count for all): use per_head or union_heads";
  return {};
}

// Heads [h0, h0 + nh) of a layer's inputs: the KV heads' keys, their query heads' statistics.
template <class K>
[[nodiscard]] layer_inputs<K> slice_heads(const layer_inputs<K>& in, std::int64_t h0, std::int64_t nh) {
  layer_inputs<K> s = in;
  const std::int64_t group = in.q_heads() / in.keys.heads, q0 = h0 * group;
  const std::int64_t ld = in.attention_ld != 0 ? in.attention_ld : in.keys.tokens;
  s.keys.data = in.keys.data + h0 * in.keys.stride_head;
  s.keys.heads = nh;
  if (in.queries.data != nullptr)
    s.queries.data = in.queries.data + q0 * in.queries.stride_head, s.queries.heads = nh * group;
  if (in.attention != nullptr) s.attention = in.attention + q0 * in.attention_rows * ld;
  if (in.attention_column_sums != nullptr) s.attention_column_sums = in.attention_column_sums + q0 * ld;
  if (in.attention_local_column_sums != nullptr)
    s.attention_local_column_sums = in.attention_local_column_sums + q0 * ld;
  if (in.attention_q_heads != 0) s.attention_q_heads = nh * group;
  return s;
}

// Plans layer l: the whole layer into plans[0] with req's segments and whitelist, or (per_head) each KV head h into
// plans[h] with head_request_of(l, h)'s (per_head under union_heads: the whole layer with head_request_of(l, 0)'s).
// Attention recomputed from the queries runs fairkv's register-tiled GEMM over f32 keys, so the layer's f16 keys
// are widened once (n x row conversions) rather than in the innermost loop.
template <class HeadRequests, class Statistics, class Planner>
std::string plan_layer(const seq_state& st, const std::uint8_t* base, int l, const state_shape& shape,
                       const request& req, const policy_spec& spec, bool per_head, HeadRequests& head_request_of,
                       Statistics& statistics_of, const Planner& planner, std::vector<float>& keys_f32,
                       std::span<keep_plan> plans, const char*& used) {
  const std::int64_t n = st.cell_count, hd = shape.head_dim, kvh = shape.n_head_kv, row = kvh * hd;
  // K rows [cells][kv_heads * hd]; the offsets are even (every field before them is 4 or 8 bytes), so the f16 data
  // is 2-byte aligned inside the buffer.
  const kv_view<const half_t> keys{
      reinterpret_cast<const half_t*>(base + st.layers[std::size_t(l)].k_offset), 1, kvh, n, hd, 0, hd, row, 1};
  attention_statistics stats;
  if (std::string e = statistics_of(l, n, stats); !e.empty()) return e;
  f16_layer_inputs in = keys_only(keys);
  in.scale = req.scale;
  if (std::string e = llamacpp::bind_statistics(stats, n, hd, in); !e.empty())
    return "layer " + std::to_string(l) + ": " + e;
  used = llamacpp::name_of(stats);
  const bool widen = std::holds_alternative<query_rows>(stats);
  f32_layer_inputs wide{};
  if (widen) {
    keys_f32.resize(std::size_t(n * row));
    for (std::int64_t i = 0; i < n * row; ++i) keys_f32[std::size_t(i)] = to_float(keys.data[i]);
    wide = keys_only(kv_view<const float>{keys_f32.data(), 1, kvh, n, hd, 0, hd, row, 1});
    wide.queries = in.queries;
    wide.scale = in.scale;
  }
  auto plan = [&](const policy_spec& s, const auto& inputs, std::span<const segment> segments,
                  std::span<const std::int32_t> whitelist, keep_plan& out) -> std::string {
    const result r = planner(s, inputs, segments, whitelist, req.target, out);
    return r.ok() ? std::string() : std::string(r.message());
  };
  if (!per_head || spec.selector == selection_kind::union_heads) {
    // One plan for the layer: its heads keep the same tokens, so their lists are equal (head 0's are read).
    const head_request hr = per_head ? head_request_of(l, 0) : head_request{req.segments, req.whitelist, {}};
    policy_spec layer_spec = spec;
    if (!hr.priorities.empty()) layer_spec.priorities = hr.priorities;
    const std::string e = widen ? plan(layer_spec, wide, hr.segments, hr.whitelist, plans[0])
                                : plan(layer_spec, in, hr.segments, hr.whitelist, plans[0]);
    return e.empty() ? e : "fairkv plan (layer " + std::to_string(l) + "): " + e;
  }
  for (std::int64_t h = 0; h < kvh; ++h) {
    const head_request hr = head_request_of(l, int(h));
    policy_spec head_spec = spec;
    if (!hr.priorities.empty()) head_spec.priorities = hr.priorities;
    keep_plan& out = plans[std::size_t(h)];
    const std::string e = widen ? plan(head_spec, slice_heads(wide, h, 1), hr.segments, hr.whitelist, out)
                                : plan(head_spec, slice_heads(in, h, 1), hr.segments, hr.whitelist, out);
    if (!e.empty()) return "fairkv plan (layer " + std::to_string(l) + " head " + std::to_string(h) + "): " + e;
  }
  return {};
}

// Every layer and head must keep layer 0 head 0's count m (llama.cpp's cells are shared). plans: the layer's one
// plan of every head, or one one-head plan per head.
inline std::string check_shared_count(std::span<const keep_plan> plans, int l, int n_head_kv, std::uint32_t& m) {
  for (int h = 0; h < n_head_kv; ++h) {
    const keep_plan& p = plans.size() == 1 ? plans[0] : plans[std::size_t(h)];
    const auto c = std::uint32_t(p.count(0, plans.size() == 1 ? h : 0));
    if (l == 0 && h == 0) m = c;
    if (c != m)
      return "layer " + std::to_string(l) + " head " + std::to_string(h) + " keeps " + std::to_string(c) +
             " tokens, layer 0 head 0 keeps " + std::to_string(m) +
             ": llama.cpp's shared cells need one count for every layer and head";
  }
  return {};
}

// compress_state and compress_state_per_head: per_head plans and compacts every (layer, KV head) on its own.
// in_place: the compressed state is written over `bytes` and moved into the result (the round trip's own copy).
template <class HeadRequests, class Statistics, class Planner>
[[nodiscard]] compression compress(std::vector<std::uint8_t>& bytes, const state_shape& shape, const request& req,
                                   bool per_head, HeadRequests& head_request_of, Statistics& statistics_of,
                                   const Planner& planner, bool in_place = false) {
  using clock = std::chrono::steady_clock;
  compression out;
  auto t0 = clock::now();
  seq_state st;
  if (std::string e = parse_seq_state(bytes, shape.expect, st); !e.empty()) {
    out.error = "llama.cpp sequence state: " + e;
    return out;
  }
  out.parse_ms = ms_since(t0);
  if (std::string e = check_request(st, shape, req); !e.empty()) {
    out.error = e;
    return out;
  }
  out.cells_before = st.cell_count;
  out.state_bytes_before = bytes.size();
  out.v_trans = st.v_trans;
  const std::int64_t n = st.cell_count, hd = shape.head_dim, kvh = shape.n_head_kv, row = kvh * hd;
  const int n_layers = int(st.n_layer);
  const bool by_head = per_head && req.policy.selector != selection_kind::union_heads;
  const std::size_t units = by_head ? std::size_t(kvh) : 1;  // plans per layer
  t0 = clock::now();
  policy_spec spec = req.policy;
  spec.window = out.window_used = int(std::max<std::int64_t>(1, std::min<std::int64_t>(spec.window, n - 1)));
  std::vector<keep_plan> plans(std::size_t(n_layers) * units);
  std::vector<float> keys_f32;
  std::uint32_t m = 0;
  for (int l = 0; l < n_layers; ++l) {
    const std::span<keep_plan> layer_plans(plans.data() + std::size_t(l) * units, units);
    std::string e = plan_layer(st, bytes.data(), l, shape, req, spec, per_head, head_request_of, statistics_of, planner,
                               keys_f32, layer_plans, out.statistics);
    if (e.empty()) e = check_shared_count(layer_plans, l, shape.n_head_kv, m);
    if (!e.empty()) {
      out.error = e;
      return out;
    }
  }
  if (m == 0) {
    out.error = "the plan keeps no token; llama.cpp cannot hold an empty sequence state";
    return out;
  }
  auto* base = reinterpret_cast<half_t*>(bytes.data());
  out.kept.assign(std::size_t(n_layers), std::vector<std::vector<std::int32_t>>(std::size_t(kvh)));
  for (int l = 0; l < n_layers; ++l)
    for (std::size_t u = 0; u < units; ++u) {
      const layer_block& lb = st.layers[std::size_t(l)];
      const std::int64_t h0 = std::int64_t(u), nh = by_head ? 1 : kvh;
      kv_view<half_t> keys{base + lb.k_offset / 2 + h0 * hd, 1, nh, n, hd, 0, hd, row, 1};
      // V rows like K, or V^T [kv_heads * hd][cells] (flash attention off): element (h, t, d) at (h hd + d) n + t.
      kv_view<half_t> values =
          st.v_trans ? kv_view<half_t>{base + lb.v_offset / 2 + h0 * hd * n, 1, nh, n, hd, 0, hd * n, 1, n}
                     : kv_view<half_t>{base + lb.v_offset / 2 + h0 * hd, 1, nh, n, hd, 0, hd, row, 1};
      const keep_plan& plan = plans[std::size_t(l) * units + u];
      if (const result c = cpu::compact(plan.view(), keys, values); !c.ok()) {
        out.error = "fairkv compact (layer " + std::to_string(l) + "): " + c.message();
        return out;
      }
      for (std::int64_t h = 0; h < nh; ++h) {
        const auto k = plan.kept(0, h);
        out.kept[std::size_t(l)][std::size_t(h0 + h)].assign(k.begin(), k.end());
      }
    }
  out.plan_ms = ms_since(t0);
  t0 = clock::now();
  if (in_place) {
    write_seq_state_in_place(bytes, st, m);
    out.state = std::move(bytes);
  } else {
    out.state = write_seq_state(bytes, st, m);
  }
  out.cells_after = m;
  out.plan_count = std::int32_t(m);
  out.plan_length = std::int32_t(n);
  out.write_ms = ms_since(t0);
  return out;
}

}  // namespace detail

// Compresses the sequence state `bytes` for `req`, in place: the K/V rows are compacted inside `bytes`, and the
// returned `state` holds the kept cells only. statistics_of(int layer, int64_t cells, attention_statistics& out)
// -> std::string sets the layer's attention statistic over the state's cells (no_statistics for key and position
// scorers) or says why there is none. Every layer is planned before any is compacted, so a refusal (an unparsable
// state, a plan error, layers that disagree on the count, an empty plan) leaves `bytes` as they were.
template <class Statistics, class Planner = inline_planner<>>
[[nodiscard]] compression compress_state(std::vector<std::uint8_t>& bytes, const state_shape& shape, const request& req,
                                         Statistics&& statistics_of, const Planner& planner = {}) {
  auto unused = [](int, int) { return head_request{}; };
  return detail::compress(bytes, shape, req, false, unused, statistics_of, planner);
}

// compress_state with every (layer, KV head) planned on its own, with the segments and whitelist
// head_request_of(int layer, int head) -> head_request gives it (req.segments and req.whitelist are not read). A
// sequence compacted more than once needs it: per-head selection keeps different tokens in every head, and every
// selector different tokens in every layer, so after a compaction each head's segments and whitelist are its own
// (fairkv::remap_segments through compression::head_plan). Every head keeps req.target's count, as llama.cpp's
// shared cells require. Under union_heads a layer's heads keep the same tokens, so their lists stay equal: each
// layer is planned whole, with head_request_of(layer, 0)'s.
template <class HeadRequests, class Statistics, class Planner = inline_planner<>>
[[nodiscard]] compression compress_state_per_head(std::vector<std::uint8_t>& bytes, const state_shape& shape,
                                                  const request& req, HeadRequests&& head_request_of,
                                                  Statistics&& statistics_of, const Planner& planner = {}) {
  return detail::compress(bytes, shape, req, true, head_request_of, statistics_of, planner);
}

}  // namespace fairkv::llamacpp
