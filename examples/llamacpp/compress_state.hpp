// fairkv-llamacpp's request (the runner's compress_request: names from the command line) on the library's llama.cpp
// adapter (fairkv/llamacpp/compress_state.hpp): the policy as a fairkv::policy_spec, the statistic each layer's
// attention scorer reads from what the system turn's prefill captured (prefill_capture.hpp), and the planning of
// every policy compiled once (plan_layer_f16.cpp, plan_layer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compress.hpp"  // llama::compress_request, policy_spec_of, attention_input_of, compress_result
#include "fairkv/llamacpp/compress_state.hpp"
#include "plan_layer_f16.hpp"
#include "prefill_capture.hpp"

namespace llamacpp {

using fairkv::llamacpp::compression;

// The statistics of the system turn's prefill, read by the attention scorers; null for key scorers. recompute:
// score attention from the captured queries even where the prefill's own softmax statistics would do (the
// reference path; tests compare the two).
struct prefill_stats {
  const prefill_capture* capture = nullptr;
  bool recompute = false;
};

// fairkv's planning through the runner's compiled units rather than instantiated here.
struct compiled_planner {
  template <class In>
  [[nodiscard]] fairkv::result operator()(const fairkv::policy_spec& spec, const In& in,
                                          std::span<const fairkv::segment> segments,
                                          std::span<const std::int32_t> whitelist, fairkv::keep_target target,
                                          fairkv::keep_plan& out) const {
    return llama::plan_layer(spec, in, segments, whitelist, target, out);
  }
};

// Layer l's statistic for `req`, chosen as fairkv-llama chooses it (llama::attention_input_of): the configuration's
// own statistic where the prefill kept it, else the queries, else an error.
class prefill_statistics {
 public:
  prefill_statistics(const prefill_stats& st, const llama::compress_request& req) : st_(st), req_(req) {}

  std::string operator()(int l, std::int64_t cells, fairkv::llamacpp::attention_statistics& out) {
    using llama::attention_input;
    attention_input src = llama::attention_input_of(req_);
    if (src == attention_input::none) return "";  // key and position scorers read no attention
    if (st_.recompute) src = attention_input::queries;
    const int n = int(cells);
    if (!st_.capture || st_.capture->tokens() != n)
      return "--policy " + req_.policy + " needs the system turn's statistics, which were not captured for its " +
             std::to_string(n) + " cells";
    const layer_stats& ls = st_.capture->layer(l);
    const int nh = st_.capture->n_head();
    const std::size_t per_head = std::size_t(nh) * std::size_t(n);
    const int rows_needed = llama::last_rows_needed(req_, n);
    if (src == attention_input::column_sums && ls.colsum.size() != per_head) src = attention_input::queries;
    if (src == attention_input::last_rows &&
        !(ls.rows_n >= rows_needed && ls.rows.size() == per_head * std::size_t(ls.rows_n)))
      src = attention_input::queries;
    if (src == attention_input::local_column_sums &&
        !(ls.local_colsum.size() == per_head && llama::same_regions(st_.capture->what().local_regions, regions(n))))
      src = attention_input::queries;
    switch (src) {
      case attention_input::queries:
        if (!(st_.capture->what().queries && ls.q.size() == per_head * std::size_t(st_.capture->head_dim())))
          return "--policy " + req_.policy + " needs the system turn's queries, which were not captured";
        out = fairkv::llamacpp::query_rows{ls.q, nh};
        break;
      case attention_input::column_sums: out = fairkv::llamacpp::column_sums{ls.colsum, nh}; break;
      case attention_input::local_column_sums: out = fairkv::llamacpp::local_column_sums{ls.local_colsum, nh}; break;
      case attention_input::last_rows: out = fairkv::llamacpp::last_rows{ls.rows, nh, ls.rows_n}; break;
      case attention_input::none: break;
    }
    return "";
  }

 private:
  // The regions a segment-local H2O scores in (local sums serve only the regions they were accumulated over).
  const std::vector<fairkv::segment>& regions(int n) {
    if (!regions_ready_) regions_ = llama::scoring_regions_of(req_, n), regions_ready_ = true;
    return regions_;
  }

  const prefill_stats& st_;
  const llama::compress_request& req_;
  std::vector<fairkv::segment> regions_;
  bool regions_ready_ = false;
};

// No compression (--policy none): the state rewritten with every cell, through the same parse and write as a
// compressed one, so the baseline pays the same round trip.
[[nodiscard]] inline compression rewrite_state(std::vector<std::uint8_t>& bytes,
                                               const fairkv::llamacpp::state_shape& shape) {
  compression out;
  fairkv::llamacpp::seq_state st;
  if (std::string e = fairkv::llamacpp::parse_seq_state(bytes, shape.expect, st); !e.empty()) {
    out.error = "llama.cpp sequence state: " + e;
    return out;
  }
  out.cells_before = out.cells_after = st.cell_count;
  out.v_trans = st.v_trans;
  std::vector<std::int32_t> all(st.cell_count);
  for (std::uint32_t i = 0; i < st.cell_count; ++i) all[i] = std::int32_t(i);
  out.kept.assign(st.n_layer, std::vector<std::vector<std::int32_t>>(std::size_t(shape.n_head_kv), all));
  out.state = fairkv::llamacpp::write_seq_state(bytes, st, st.cell_count);
  return out;
}

// Compresses the sequence state `bytes` (modified in place) for the command line's request.
[[nodiscard]] inline compression compress_state(std::vector<std::uint8_t>& bytes,
                                                const fairkv::llamacpp::state_shape& shape,
                                                const llama::compress_request& req, const prefill_stats& stats) {
  if (req.policy == "none") return rewrite_state(bytes, shape);
  const fairkv::llamacpp::request lib{llama::policy_spec_of(req, req.window), req.segments, req.whitelist, req.ratio};
  return fairkv::llamacpp::compress_state(bytes, shape, lib, prefill_statistics(stats, req), compiled_planner{});
}

// What a compression kept as fairkv-llama's reports read it: kept[l][h][t] over the cells before.
[[nodiscard]] inline llama::compress_result kept_masks(const compression& c, int sinks) {
  llama::compress_result r;
  r.window_used = c.window_used;
  r.sinks = sinks;
  r.kept.resize(c.kept.size());
  for (std::size_t l = 0; l < c.kept.size(); ++l)
    for (const std::vector<std::int32_t>& head : c.kept[l]) {
      std::vector<std::uint8_t> m(c.cells_before, 0);
      for (std::int32_t t : head) m[std::size_t(t)] = 1;
      r.kept[l].push_back(std::move(m));
    }
  return r;
}

}  // namespace llamacpp
