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
#include "seq_state.hpp"

namespace llamacpp {

struct compression {
  std::string error;                // empty on success; else nothing usable below
  std::vector<std::uint8_t> state;  // the state to load: only the kept cells
  std::uint32_t cells_before = 0, cells_after = 0;
  bool v_trans = false;             // the state holds V transposed (llama.cpp without flash attention)
  llama::compress_result kept;      // kept[l][h][t]: 1 if token t is kept in (layer l, KV head h)
  int window_used = 0;
  double parse_ms = 0, plan_ms = 0, write_ms = 0;
};

// Post-RoPE queries of every position of the state, [layer][token][q_head][head_dim]; empty for key scorers.
struct query_rows {
  const std::vector<std::vector<float>>* q = nullptr;
  int n_head = 0;
};

// Compresses the parsed-and-checked copy `bytes` of a sequence state (modified in place). The token index of a
// cell is its rank in the state, which is its position when the sequence was prefilled from position 0.
[[nodiscard]] inline compression compress_state(std::vector<std::uint8_t>& bytes, const state_expectations& want,
                                                int n_head_kv, int head_dim, const llama::compress_request& req,
                                                const query_rows& queries) {
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
    const bool with_q = llama::policy_needs_queries(req.policy);
    if (with_q) {
      if (!queries.q || int(queries.q->size()) != n_layers) {
        out.error = "--policy " + req.policy + " needs the system turn's queries, which were not captured";
        return out;
      }
      for (int l = 0; l < n_layers; ++l)
        if ((*queries.q)[size_t(l)].size() != size_t(n) * size_t(queries.n_head) * size_t(head_dim)) {
          out.error = "layer " + std::to_string(l) + ": " +
                      std::to_string((*queries.q)[size_t(l)].size() / (size_t(queries.n_head) * size_t(head_dim))) +
                      " query rows captured for " + std::to_string(n) + " cells (queries of the prefill only)";
          return out;
        }
    }
    out.window_used = int(std::max<std::int64_t>(1, std::min<std::int64_t>(req.window, n - 1)));
    const fairkv::policy_spec spec = llama::policy_spec_of(req, out.window_used);
    out.kept.sinks = llama::sinks_of(req);
    out.kept.window_used = out.window_used;
    auto* base = reinterpret_cast<fairkv::half_t*>(bytes.data());
    const std::int64_t hd = head_dim, kvh = n_head_kv, row = kvh * hd;
    // Plan every layer before compacting any: a count that differs between layers is refused with the state
    // untouched (it cannot happen with the shipped allocators, which give every head floor(n (1 - ratio)) tokens).
    std::vector<fairkv::keep_plan> plans(static_cast<size_t>(n_layers));
    for (int l = 0; l < n_layers; ++l) {
      const layer_block& lb = st.layers[size_t(l)];
      // K rows [cells][kv_heads * hd]; the offsets are even (every field before them is 4 or 8 bytes), so the
      // f16 data is 2-byte aligned inside the vector's storage.
      const fairkv::kv_view<fairkv::half_t> keys{base + lb.k_offset / 2, 1, kvh, n, hd, 0, hd, row, 1};
      auto inputs = fairkv::keys_only(keys);
      if (with_q) {  // [1, n_head, n, hd] over rows [n][n_head * hd]
        const float* q = (*queries.q)[size_t(l)].data();
        inputs.queries = fairkv::kv_view<const float>{q, 1, queries.n_head, n, hd, 0, hd, queries.n_head * hd, 1};
      }
      const fairkv::result r = fairkv::dispatch(spec, [&](const auto& pol) {
        return fairkv::cpu::plan(pol, inputs, std::span<const fairkv::segment>(req.segments),
                                 std::span<const std::int32_t>(req.whitelist), req.ratio, plans[size_t(l)]);
      });
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
