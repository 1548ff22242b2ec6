// fairkv over llama.cpp's own KV cache, reached through its sequence state: views over the state's K rows and V
// rows (or V^T), one fairkv plan per layer, compaction in place in the state buffer, then a state of the kept
// cells only.
//
// llama.cpp's cells are shared by every layer and head: a cell is one row index in all of them. So every (layer,
// head) must keep the same number of tokens m; which tokens may differ per layer and per head (per_head selector),
// because a cell's position only feeds the attention mask, and every kept token is visible to every later one.
// The kept cells get positions last - m + 1 .. last (last = the original last position): llama.cpp requires the
// next token at last + 1, and RoPE of the cached keys is inside K already, so nothing else moves.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compress.hpp"  // llama::compress_request, policy_spec_of, policy_needs_queries, compress_result
#include "fairkv/fairkv.hpp"
#include "plan_layer_f16.hpp"
#include "prefill_capture.hpp"
#include "seq_state.hpp"

namespace llamacpp {

struct compression {
  std::string error;                // empty on success; else nothing usable below
  std::vector<std::uint8_t> state;  // the state to load: only the kept cells
  std::uint32_t cells_before = 0, cells_after = 0;
  bool v_trans = false;             // the state holds V transposed (llama.cpp without flash attention)
  llama::compress_result kept;      // kept[l][h][t]: 1 if token t is kept in (layer l, KV head h)
  llama::attention_input statistics = llama::attention_input::none;  // what the attention scorer read
  int window_used = 0;
  double parse_ms = 0, plan_ms = 0, write_ms = 0;
};

// The statistics of the system turn's prefill (prefill_capture.hpp), read by the attention scorers; null for key
// scorers. recompute: score attention from the captured queries even where the prefill's own softmax statistics
// would do (the reference path; tests compare the two).
struct prefill_stats {
  const prefill_capture* capture = nullptr;
  bool recompute = false;
};

namespace detail {

// Layer l's attention inputs for `req` from what the prefill kept, chosen as fairkv-llama chooses them
// (llama::attention_input_of): the statistic of the configuration, else the queries, else an error.
inline std::string attention_inputs(const prefill_stats& st, int l, int n, int head_dim, const llama::compress_request& req,
                                    const std::vector<fairkv::segment>& regions,
                                    fairkv::layer_inputs<fairkv::kv_view<const fairkv::half_t>>& in,
                                    llama::attention_input& used) {
  llama::attention_input src = llama::attention_input_of(req);
  if (src == llama::attention_input::none) return "";  // key and position scorers read no attention
  if (st.recompute) src = llama::attention_input::queries;
  if (!st.capture || st.capture->tokens() != n)
    return "--policy " + req.policy + " needs the system turn's statistics, which were not captured for its " +
           std::to_string(n) + " cells";
  const layer_stats& ls = st.capture->layer(l);
  const int nh = st.capture->n_head();
  const size_t cells = size_t(nh) * size_t(n);
  const bool have_q = ls.q.size() == cells * size_t(head_dim) && st.capture->what().queries;
  const int rows_needed = llama::last_rows_needed(req, n);
  if (src == llama::attention_input::column_sums && ls.colsum.size() != cells) src = llama::attention_input::queries;
  if (src == llama::attention_input::last_rows && !(ls.rows_n >= rows_needed && ls.rows.size() == cells * size_t(ls.rows_n)))
    src = llama::attention_input::queries;
  if (src == llama::attention_input::local_column_sums &&
      !(ls.local_colsum.size() == cells && llama::same_regions(st.capture->what().local_regions, regions)))
    src = llama::attention_input::queries;
  used = src;
  switch (src) {
    case llama::attention_input::queries:
      if (!have_q) return "--policy " + req.policy + " needs the system turn's queries, which were not captured";
      // [1, n_head, n, hd] over rows [n][n_head * hd]
      in.queries = fairkv::kv_view<const float>{ls.q.data(), 1, nh, n, head_dim, 0, head_dim, nh * head_dim, 1};
      break;
    case llama::attention_input::column_sums:
      in.attention_column_sums = ls.colsum.data();  // [1, n_head, n]
      in.attention_q_heads = nh;
      break;
    case llama::attention_input::local_column_sums:
      in.attention_local_column_sums = ls.local_colsum.data();  // [1, n_head, n]
      in.attention_q_heads = nh;
      break;
    case llama::attention_input::last_rows:
      in.attention = ls.rows.data();  // [1, n_head, rows_n, n]: the scorer reads the last rows it needs
      in.attention_rows = ls.rows_n;
      in.attention_ld = n;
      in.attention_q_heads = nh;
      break;
    case llama::attention_input::none: break;
  }
  return "";
}

}  // namespace detail

// Compresses the parsed-and-checked copy `bytes` of a sequence state (modified in place). The token index of a
// cell is its rank in the state, which is its position when the sequence was prefilled from position 0.
[[nodiscard]] inline compression compress_state(std::vector<std::uint8_t>& bytes, const state_expectations& want,
                                                int n_head_kv, int head_dim, const llama::compress_request& req,
                                                const prefill_stats& stats) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point t0) { return std::chrono::duration<double, std::milli>(clock::now() - t0).count(); };
  compression out;
  auto t0 = clock::now();
  seq_state st;
  if (std::string e = parse_seq_state(bytes, want, st); !e.empty()) {
    out.error = "llama.cpp sequence state: " + e;
    return out;
  }
  out.parse_ms = ms(t0);
  if (std::int64_t(n_head_kv) * head_dim != std::int64_t(st.n_embd_k)) {
    out.error = "K rows of " + std::to_string(st.n_embd_k) + " values are not " + std::to_string(n_head_kv) +
                " KV heads x " + std::to_string(head_dim);
    return out;
  }
  if (req.selector == "head_adaptive") {
    out.error = "--selector head_adaptive gives every head its own count, but llama.cpp's cells are shared by all "
                "layers and heads (one count for all): use per_head or union";
    return out;
  }
  const std::int64_t n = st.cell_count;
  out.cells_before = st.cell_count;
  out.v_trans = st.v_trans;
  const int n_layers = int(st.n_layer);
  out.kept.kept.assign(size_t(n_layers), std::vector<std::vector<std::uint8_t>>(
                                             size_t(n_head_kv), std::vector<std::uint8_t>(size_t(n), 1)));
  std::uint32_t m = st.cell_count;
  t0 = clock::now();
  if (req.policy != "none") {
    out.window_used = int(std::max<std::int64_t>(1, std::min<std::int64_t>(req.window, n - 1)));
    const fairkv::policy_spec spec = llama::policy_spec_of(req, out.window_used);
    const std::vector<fairkv::segment> regions =
        llama::attention_input_of(req) == llama::attention_input::local_column_sums
            ? llama::scoring_regions_of(req, int(n))
            : std::vector<fairkv::segment>{};
    out.kept.sinks = llama::sinks_of(req);
    out.kept.window_used = out.window_used;
    auto* base = reinterpret_cast<fairkv::half_t*>(bytes.data());
    const std::int64_t hd = head_dim, kvh = n_head_kv, row = kvh * hd;
    // Plan every layer before compacting any: a count that differs between layers is refused with the state
    // untouched (it cannot happen with the shipped allocators, which give every head floor(n (1 - ratio)) tokens).
    std::vector<fairkv::keep_plan> plans(static_cast<size_t>(n_layers));
    std::vector<float> keys_f32;  // [cells][kv_heads * hd]: one layer's keys for the query path
    for (int l = 0; l < n_layers; ++l) {
      const layer_block& lb = st.layers[size_t(l)];
      // K rows [cells][kv_heads * hd]; the offsets are even (every field before them is 4 or 8 bytes), so the
      // f16 data is 2-byte aligned inside the vector's storage.
      const fairkv::kv_view<fairkv::half_t> keys{base + lb.k_offset / 2, 1, kvh, n, hd, 0, hd, row, 1};
      auto inputs = fairkv::keys_only(keys);
      if (std::string e = detail::attention_inputs(stats, l, int(n), head_dim, req, regions, inputs, out.statistics);
          !e.empty()) {
        out.error = e;
        return out;
      }
      auto plan_with = [&](const auto& in) {
        return llama::plan_layer(spec, in, req.segments, req.whitelist, req.ratio, plans[size_t(l)]);
      };
      fairkv::result r;
      if (out.statistics == llama::attention_input::queries) {
        // Attention from the queries runs fairkv's register-tiled GEMM over f32 keys: the layer's f16 keys are
        // widened once (n x kv_heads x hd conversions) rather than converted in the innermost loop.
        keys_f32.resize(size_t(n) * size_t(row));
        for (std::int64_t t = 0; t < n; ++t)
          for (std::int64_t i = 0; i < row; ++i)
            keys_f32[size_t(t * row + i)] = fairkv::to_float(keys.data[t * row + i]);
        auto wide = fairkv::keys_only(fairkv::kv_view<const float>{keys_f32.data(), 1, kvh, n, hd, 0, hd, row, 1});
        wide.queries = inputs.queries;
        r = plan_with(wide);
      } else {
        r = plan_with(inputs);
      }
      if (!r.ok()) {
        out.error = "fairkv plan (layer " + std::to_string(l) + "): " + r.message();
        return out;
      }
      for (int h = 0; h < n_head_kv; ++h) {
        const std::uint32_t c = std::uint32_t(plans[size_t(l)].count(0, h));
        if (l == 0 && h == 0) m = c;
        if (c != m) {
          out.error = "layer " + std::to_string(l) + " head " + std::to_string(h) + " keeps " + std::to_string(c) +
                      " tokens, layer 0 head 0 keeps " + std::to_string(m) +
                      ": llama.cpp's shared cells need one count for every layer and head";
          return out;
        }
      }
    }
    if (m == 0) {
      out.error = "the plan keeps no token; llama.cpp cannot hold an empty sequence state";
      return out;
    }
    for (int l = 0; l < n_layers; ++l) {
      const layer_block& lb = st.layers[size_t(l)];
      fairkv::kv_view<fairkv::half_t> keys{base + lb.k_offset / 2, 1, kvh, n, hd, 0, hd, row, 1};
      // V rows like K, or V^T [kv_heads * hd][cells] (flash attention off): element (h, t, d) at (h hd + d) n + t.
      fairkv::kv_view<fairkv::half_t> values =
          st.v_trans ? fairkv::kv_view<fairkv::half_t>{base + lb.v_offset / 2, 1, kvh, n, hd, 0, hd * n, 1, n}
                     : fairkv::kv_view<fairkv::half_t>{base + lb.v_offset / 2, 1, kvh, n, hd, 0, hd, row, 1};
      if (const fairkv::result c = fairkv::cpu::compact(plans[size_t(l)].view(), keys, values); !c.ok()) {
        out.error = "fairkv compact (layer " + std::to_string(l) + "): " + c.message();
        return out;
      }
      for (int h = 0; h < n_head_kv; ++h) {
        std::vector<std::uint8_t>& k = out.kept.kept[size_t(l)][size_t(h)];
        std::fill(k.begin(), k.end(), std::uint8_t{0});
        for (std::int32_t i : plans[size_t(l)].kept(0, h)) k[size_t(i)] = 1;
      }
    }
  }
  out.plan_ms = ms(t0);
  t0 = clock::now();
  std::vector<std::int32_t> positions(m);
  const std::int32_t last = st.pos.back();
  for (std::uint32_t i = 0; i < m; ++i) positions[i] = last - std::int32_t(m) + 1 + std::int32_t(i);
  out.state = write_seq_state(bytes, st, m, positions);
  out.cells_after = m;
  out.write_ms = ms(t0);
  return out;
}

}  // namespace llamacpp
