// fairkv-llamacpp's session, the same request and run as fairkv-llama's (examples/llama/runner.hpp) on llama.cpp:
// load the model, tokenize the prompt with llama.cpp's vocabulary, prefill the system turn once in a slot of the
// context (keeping the statistics the attention scorers read), keep its sequence state, and for every
// configuration compress a copy of that state with fairkv and load it into a slot per user turn; then every
// (configuration, user turn) is answered greedily, all decoded together (llama::answer_turns), and scored when
// asked. A state that cannot be compressed (unknown layout, quantised cache, a policy llama.cpp's shared cells
// cannot hold) is reported and the other configurations run.
//
// A sweep (several configurations) always runs batch-invariant kernels (engine.hpp), so each of its answers is the
// one a single run of that configuration with --batch-invariant gives, bit for bit. A single run uses llama.cpp's
// fastest kernels unless asked.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat.hpp"
#include "compress_state.hpp"
#include "engine.hpp"
#include "json.hpp"
#include "runner.hpp"  // the shared request, reports, segments, answer_turns
#include "utf8.hpp"

namespace llamacpp {

struct session_options {
  llama::runner_options run;  // what to run, as fairkv-llama takes it (model, system, users, configs, scoring)
  context_options context{.n_ctx = 0};  // llama.cpp's own knobs; n_ctx 0: the tokens the run needs per sequence
  bool recompute_attention = false;  // attention scorers recompute from the captured queries (the reference path)
};

// One configuration's report: fairkv-llama's, plus what llama.cpp's state round trip did.
struct session_report {
  llama::run_report run;
  std::size_t state_bytes_before = 0, state_bytes_after = 0;
  std::uint32_t cells_before = 0, cells_after = 0;
  bool v_trans = false;          // the state held V transposed (flash attention off)
  bool batch_invariant = false;  // the kernels of engine.hpp's batch invariance
  std::string statistics;        // what the attention scorer read: none | queries | column_sums | ...
  double state_read_ms = 0, parse_ms = 0, plan_ms = 0, write_ms = 0, state_load_ms = 0;
  double system_prefill_ms = 0;  // the system turn's prefill alone (run.prefill_ms adds this turn's user turns)
  std::vector<std::vector<std::vector<std::int32_t>>> kept_sets;  // [layer][kv head] kept token indices
};

inline double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A turn in the runner's ChatML template (SmolLM2 and Qwen2.5 share it), with llama.cpp's tokens and byte offsets.
inline llama::chat::encoded_turn encode_turn(const engine& e, std::string_view role, std::string_view content,
                                             bool generation_prompt) {
  return llama::chat::encode_turn(e, role, content, generation_prompt);
}

// What a compression did, into the configuration's report (`run`: its fairkv-llama part, whose segments are set).
// sinks: the attention sinks the configuration's allocator protects (fairkv-llama reports how many were kept).
inline void record_compression(session_report& rep, llama::run_report& run, const compression& c, int sinks,
                               int n_layers, int n_kv_heads) {
  rep.parse_ms = c.parse_ms;
  rep.plan_ms = c.plan_ms;
  rep.write_ms = c.write_ms;
  rep.state_bytes_after = c.state.size();
  rep.cells_before = c.cells_before;
  rep.cells_after = c.cells_after;
  rep.v_trans = c.v_trans;
  rep.statistics = c.statistics;
  run.window_used = c.window_used;
  llama::record_kept(run, kept_masks(c, sinks), n_layers, n_kv_heads);
  rep.kept_sets = c.kept;
}

// The sinks record_compression reports for a request.
inline int reported_sinks(const llama::compress_request& req) { return req.policy == "none" ? 0 : llama::sinks_of(req); }

// Reads the first slot's state, compresses it with the statistics its prefill kept, and loads the result. On any
// failure the original state is loaded back (llama.cpp empties the sequence when a load fails) and the error is
// returned; `rep` then says 0 bytes after. (The one-sequence path, for tests and callers with one slot.)
inline std::string compress_in_engine(engine& eng, const llama::compress_request& req, session_report& rep,
                                      const std::vector<std::uint8_t>* injected_state = nullptr,
                                      bool recompute = false) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  const std::vector<std::uint8_t> original = eng.get_state();
  std::vector<std::uint8_t> work = injected_state ? *injected_state : original;
  rep.state_read_ms = ms_between(t0, clock::now());
  rep.state_bytes_before = work.size();
  compression c = compress_state(work, eng.state_shape(), req, {&eng.capture(), recompute});
  if (!c.error.empty()) return c.error;
  t0 = clock::now();
  eng.truncate(0);
  if (!eng.set_state(c.state)) {
    if (!eng.set_state(original)) throw std::runtime_error("llama.cpp refused to reload the original state");
    return "llama.cpp refused the compressed state (" + std::to_string(c.state.size()) + " bytes); context restored";
  }
  rep.state_load_ms = ms_between(t0, clock::now());
  record_compression(rep, rep.run, c, reported_sinks(req), eng.n_layer(), eng.n_head_kv());
  return "";
}

// The prompt side of a one-sequence session: segments and whitelist token indices of the system turn.
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

namespace detail {

// The (configuration, user turn) pairs in order, as runner.hpp's turn_source: each configuration's compressed
// state is made when its first turn is admitted (a copy of the system turn's state, compressed with fairkv) and
// loaded into a slot per user turn, whose user turn is then prefilled alone.
class turn_source {
 public:
  turn_source(engine& eng, const std::vector<std::uint8_t>& base, const prefill_stats& stats,
              std::vector<llama::compress_config>& configs, const std::vector<llama::chat::encoded_turn>& users,
              std::vector<llama::run_report>& runs, std::vector<session_report>& reps, bool strict)
      : eng_(eng), base_(base), stats_(stats), configs_(configs), users_(users), runs_(runs), reps_(reps),
        strict_(strict), compressed_cfg_(configs.size()) {}

  size_t config_of(size_t id) const { return id / users_.size(); }
  size_t user_of(size_t id) const { return id % users_.size(); }
  void limit(size_t n) { end_cfg_ = std::min(n, configs_.size()); }

  std::optional<llama::basic_decode_turn<slot>> next() {
    using clock = std::chrono::steady_clock;
    while (next_cfg_ < end_cfg_) {
      const size_t c = next_cfg_, u = next_user_;
      if (++next_user_ == users_.size()) next_user_ = 0, ++next_cfg_;
      if (compressed_cfg_ != c && !compress(c)) {
        next_cfg_ = c + 1, next_user_ = 0;  // none of its turns runs
        continue;
      }
      llama::basic_decode_turn<slot> t;
      t.id = c * users_.size() + u;
      t.seq = eng_.acquire();
      auto t0 = clock::now();
      if (!eng_.set_state(t.seq, compressed_))
        throw std::runtime_error("llama.cpp refused the compressed state of configuration " + std::to_string(c + 1) +
                                 " (" + std::to_string(compressed_.size()) + " bytes)");
      reps_[c].state_load_ms = ms_between(t0, clock::now());
      const std::vector<int32_t>& ids = users_[u].tokens.ids;
      t0 = clock::now();
      t.logits = eng_.feed(t.seq, ids);
      runs_[c].prefill_ms += ms_between(t0, clock::now());
      runs_[c].prefill_tokens += int(ids.size());
      return t;
    }
    return std::nullopt;
  }

 private:
  // Compresses a copy of the base state for configuration c and records what it kept; false if it cannot run.
  bool compress(size_t c) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::vector<std::uint8_t> work = base_;
    const double read_ms = ms_between(t0, clock::now());
    compression comp = compress_state(work, eng_.state_shape(), configs_[c].compress, stats_);
    if (!comp.error.empty()) {
      if (strict_) throw std::runtime_error(comp.error);
      runs_[c].error = comp.error;
      runs_[c].turns.clear();
      return false;
    }
    session_report& rep = reps_[c];
    record_compression(rep, runs_[c], comp, reported_sinks(configs_[c].compress), eng_.n_layer(), eng_.n_head_kv());
    runs_[c].compress_ms = ms_between(t0, clock::now());
    rep.state_read_ms = read_ms;
    rep.state_bytes_before = base_.size();
    compressed_ = std::move(comp.state);
    compressed_cfg_ = c;
    return true;
  }

  engine& eng_;
  const std::vector<std::uint8_t>& base_;
  prefill_stats stats_;
  std::vector<llama::compress_config>& configs_;
  const std::vector<llama::chat::encoded_turn>& users_;
  std::vector<llama::run_report>& runs_;
  std::vector<session_report>& reps_;
  bool strict_;
  std::vector<std::uint8_t> compressed_;
  size_t compressed_cfg_;
  size_t next_cfg_ = 0, next_user_ = 0;
  size_t end_cfg_ = configs_.size();
};

// Flash attention of the context: as asked, except that "auto" turns it off when a configuration reads attention
// statistics from the prefill (llama.cpp materialises the softmax only without it) or decoding is batch-invariant.
inline int flash_attn_for(const context_options& c, const llama::capture_options& want) {
  if (c.batch_invariant) return 0;
  if (c.flash_attn >= 0) return c.flash_attn;
  return want.column_sums || want.last_rows > 0 || !want.local_regions.empty() ? 0 : -1;
}

inline std::vector<session_report> run_configs(session_options o, std::vector<llama::compress_config> configs,
                                               bool strict) {
  using clock = std::chrono::steady_clock;
  llama::runner_options& opt = o.run;
  llama::detail::check_request(opt, configs);
  for (const llama::compress_config& c : configs)
    if (c.compress.selector == "head_adaptive")
      throw std::runtime_error("--selector head_adaptive: llama.cpp's cells are shared by all layers and heads, so "
                               "every head keeps the same count; use per_head or union_heads");
  if (opt.forward.q8_activations)
    throw std::runtime_error("--q8: fairkv-llama's own activation option; llama.cpp chooses its own kernels");
  if (opt.max_batch > max_slots - 2)
    throw std::runtime_error("--max-batch: llama.cpp holds at most " + std::to_string(max_slots) +
                             " sequences, so at most " + std::to_string(max_slots - 2) + " are decoded together");
  const llama::parsed_system ps = llama::parse_system_segments(opt.system);  // marker errors before the model loads
  const llama::progress prog(opt.quiet);

  auto t0 = clock::now();
  if (opt.model_path.empty()) opt.model_path = llama::resolve_model("");
  context_options ctx = o.context;
  // llama.cpp's own default is 4 threads whatever the machine: on 2 cores its spinning barriers then wait for
  // descheduled threads (a SmolLM2 run took 20 s instead of 0.6 s). The runner's default: the hardware threads.
  ctx.threads = opt.forward.threads > 0 ? opt.forward.threads : (ctx.threads > 0 ? ctx.threads : llama::default_threads());
  if (opt.forward.batch > 0) ctx.n_batch = opt.forward.batch;
  const auto m = std::make_shared<const model>(opt.model_path, ctx.batch_invariant);
  const double load_ms = ms_between(t0, clock::now());

  const llama::detail::tokenized_prompt prompt = llama::detail::tokenize_prompt(*m, ps, opt, m->n_ctx_train());
  const int n_sys = int(prompt.system.tokens.ids.size());
  std::vector<llama::run_report> runs = llama::detail::start_reports(configs, ps, prompt);

  // The context: a slot per sequence decoded together, the base, and a fork for scoring; each slot holds the
  // whole context of one turn.
  if (ctx.n_ctx > 0 && prompt.capacity > ctx.n_ctx)
    throw std::runtime_error("the context needs " + std::to_string(prompt.capacity) + " tokens per sequence, more "
                             "than --ctx " + std::to_string(ctx.n_ctx));
  ctx.n_ctx = std::max(ctx.n_ctx, prompt.capacity);
  const size_t turns = configs.size() * opt.users.size() * (opt.reference || !opt.continuations.empty() ? 2 : 1);
  ctx.n_slots = int(std::min(size_t(opt.max_batch), turns)) + 2;
  const llama::capture_options want = o.recompute_attention ? llama::detail::capture_for(configs, n_sys, false)
                                                            : llama::detail::capture_for(configs, n_sys, true);
  ctx.flash_attn = flash_attn_for(ctx, want);
  // With flash attention on, the prefill hands over its queries only.
  const bool statistics = ctx.flash_attn == 0 && !o.recompute_attention;
  const llama::capture_options capture = statistics ? want : llama::detail::capture_for(configs, n_sys, false);
  engine eng(m, ctx);

  std::vector<std::uint8_t> base_state;
  {
    slot base = eng.acquire();
    t0 = clock::now();
    eng.feed(base, prompt.system.tokens.ids, capture);
    base_state = eng.get_state(base);
  }
  const double prefill_ms = ms_between(t0, clock::now());
  llama::detail::stamp_reports(runs, opt, {"llama.cpp", eng.n_layer(), eng.n_head_kv(), n_sys,
                                           ctx.threads,
                                           load_ms, prefill_ms});
  std::vector<session_report> reps(configs.size());
  for (session_report& r : reps) r.batch_invariant = ctx.batch_invariant, r.system_prefill_ms = prefill_ms;

  const prefill_stats stats{&eng.capture(), !statistics};
  llama::detail::answer_turns(
      eng, m->stops(), [&](const std::vector<int32_t>& ids) { return llama::unicode::to_valid_utf8(m->detokenize(ids)); },
      [&] { return turn_source(eng, base_state, stats, configs, prompt.users, runs, reps, strict); }, opt, prompt,
      runs, prog);
  llama::detail::finish_reports(runs, opt, configs);
  for (size_t c = 0; c < configs.size(); ++c) reps[c].run = std::move(runs[c]);
  return reps;
}

}  // namespace detail

// One configuration (o.run.compress, o.run.whitelist): throws if it cannot run.
inline session_report run_session(session_options o) {
  std::vector<llama::compress_config> one{{o.run.compress, o.run.whitelist}};
  return std::move(detail::run_configs(std::move(o), std::move(one), /*strict=*/true).front());
}

// Every configuration of o.run.configs from one prefill of the system turn, batch-invariant; a configuration that
// cannot be compressed reports its error and the others still run.
inline std::vector<session_report> run_sweep(session_options o) {
  std::vector<llama::compress_config> configs = std::move(o.run.configs);
  o.context.batch_invariant = true;  // a sweep's answers must be those of single runs
  return detail::run_configs(std::move(o), std::move(configs), /*strict=*/false);
}

inline std::string to_json(const session_report& r) {
  using llama::json::number;
  std::string s;
  s += "  \"batch_invariant\": " + std::string(r.batch_invariant ? "true" : "false") + ",\n";
  s += "  \"v_trans\": " + std::string(r.v_trans ? "true" : "false") + ",\n";
  s += "  \"statistics\": " + llama::json::quote(r.statistics) + ",\n";
  s += "  \"state\": {\"bytes_before\": " + std::to_string(r.state_bytes_before) + ", \"bytes_after\": " +
       std::to_string(r.state_bytes_after) + ", \"cells_before\": " + std::to_string(r.cells_before) +
       ", \"cells_after\": " + std::to_string(r.cells_after) + ", \"read_ms\": " + number(r.state_read_ms) +
       ", \"parse_ms\": " + number(r.parse_ms) + ", \"plan_compact_ms\": " + number(r.plan_ms) +
       ", \"write_ms\": " + number(r.write_ms) + ", \"load_ms\": " + number(r.state_load_ms) +
       ", \"system_prefill_ms\": " + number(r.system_prefill_ms) + "},\n";
  s += "  \"kept\": [";
  for (size_t l = 0; l < r.kept_sets.size(); ++l) {
    s += std::string(l ? ", " : "") + "[";
    for (size_t h = 0; h < r.kept_sets[l].size(); ++h) {
      s += h ? ", [" : "[";
      for (size_t i = 0; i < r.kept_sets[l][h].size(); ++i) s += (i ? "," : "") + std::to_string(r.kept_sets[l][h][i]);
      s += "]";
    }
    s += "]";
  }
  s += "],\n";
  return llama::to_json(r.run, s);
}

}  // namespace llamacpp
