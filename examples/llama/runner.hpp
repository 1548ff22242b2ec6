// The runner's session, top to bottom: check the request, load the model, tokenize the prompt, prefill the
// system turn once, then for every configuration compress a copy of that cache with its fairkv policy and answer
// every user turn greedily from it, and report (--json) what was kept of each segment of the system prompt.
//
// A single run is a sweep of one configuration. The answers of all (configuration, user turn) pairs are decoded
// together (scheduler.hpp), each bit-identical to what a run of that configuration alone produces.
//
//   options.hpp        what a run is asked to do, and its checks
//   system_prompt.hpp  segments and whitelisted phrases, from bytes to tokens
//   compress.hpp       runtime names -> one fairkv::policy, plan + compact per layer
//   scheduler.hpp      greedy decoding of many turns in lockstep
//   report.hpp         run_report and to_json
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chat.hpp"
#include "compress.hpp"
#include "console.hpp"
#include "forward.hpp"
#include "model.hpp"
#include "model_path.hpp"
#include "options.hpp"
#include "report.hpp"
#include "scheduler.hpp"
#include "scoring.hpp"
#include "system_prompt.hpp"
#include "tokenizer.hpp"
#include "utf8.hpp"

namespace llama {
namespace detail {

// Tokens per sequence: the system turn, the longest user turn, the answer and the last token fed; computed in
// 64 bits and compared with the training context (n_ctx_train, 0: unknown) before any cache is made. Beyond it:
// refused, or a warning when allowed.
inline int context_capacity(int n_sys, int max_user, int max_new_tokens, int n_ctx_train, bool allow_long,
                            std::vector<std::string>& warnings) {
  const int64_t capacity = int64_t(n_sys) + max_user + max_new_tokens + 1;
  const std::string need = std::to_string(capacity) + " tokens (system turn " + std::to_string(n_sys) +
                           " + longest user turn " + std::to_string(max_user) + " + --max-new-tokens " +
                           std::to_string(max_new_tokens) + " + 1)";
  if (n_ctx_train > 0 && capacity > n_ctx_train) {
    const std::string msg = "the context needs " + need + ", more than the model's training context of " +
                            std::to_string(n_ctx_train) + " (llama.context_length)";
    if (!allow_long)
      throw std::runtime_error(msg + "; lower --max-new-tokens or shorten the prompt, or pass --allow-long-context");
    warn(warnings, msg + " (allowed by --allow-long-context)");
  }
  if (capacity > std::numeric_limits<int>::max())
    throw std::runtime_error("the context needs " + need + ", more than this runner can index");
  return int(capacity);
}

// The prompt every configuration shares, tokenized.
struct tokenized_prompt {
  chat::encoded_turn system;
  std::vector<segment_info> segments;      // token ranges of the system prompt's segments
  std::vector<chat::encoded_turn> users;
  std::vector<std::vector<int32_t>> continuations;  // [users] tokens of --continuation (empty: not scored)
  int capacity = 0;                        // tokens per sequence (context_capacity)
  std::vector<std::string> warnings;       // about the prompt and the context: every report gets them
};

// Tok: the runner's tokenizer, or llama.cpp's through examples/llamacpp/engine.hpp (chat::encode_turn).
template <class Tok>
tokenized_prompt tokenize_prompt(const Tok& tok, const parsed_system& ps, const runner_options& opt, int n_ctx_train) {
  tokenized_prompt p;
  p.system = chat::encode_system_turn(tok, ps.text);
  p.segments = map_segments(ps, p.system.text, p.system.tokens.offsets, p.system.content.begin, p.warnings);
  for (const std::string& w : p.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  int max_user = 0;
  for (const std::string& u : opt.users) {
    p.users.push_back(chat::encode_user_turn(tok, u));
    max_user = std::max(max_user, int(p.users.back().tokens.ids.size()));
  }
  // A forced continuation occupies the answer's place in the context.
  int max_answer = opt.max_new_tokens;
  for (const std::string& c : opt.continuations) {
    p.continuations.push_back(c.empty() ? std::vector<int32_t>{} : tok.encode(c));
    max_answer = std::max(max_answer, int(p.continuations.back().size()));
  }
  p.capacity = context_capacity(int(p.system.tokens.ids.size()), max_user, max_answer, n_ctx_train,
                                opt.allow_long_context, p.warnings);
  return p;
}

// Fills each configuration's token-level segments (with --fair) and whitelist, and starts its report with the
// shared warnings and its own.
inline std::vector<run_report> start_reports(std::vector<compress_config>& configs, const parsed_system& ps,
                                             const tokenized_prompt& p) {
  std::vector<run_report> reps(configs.size());
  for (size_t c = 0; c < configs.size(); ++c) {
    compress_request& cr = configs[c].compress;
    reps[c].warnings = p.warnings;
    // The marked segments are what a report measures; --segments MODE may allocate over others.
    const segmentation mode = cr.segmentation.empty() ? (ps.marked ? segmentation::markers : segmentation::lines)
                                                       : parse_segmentation(cr.segmentation);
    std::vector<segment_info> alloc = p.segments;
    if (mode != segmentation::markers && (ps.marked || mode != segmentation::lines)) {
      const parsed_system split{ps.text, split_text(ps.text, mode), false};
      alloc = map_segments(split, p.system.text, p.system.tokens.offsets, p.system.content.begin, reps[c].warnings);
    }
    reps[c].segments = ps.marked ? p.segments : alloc;
    if (ps.marked && mode != segmentation::markers) reps[c].allocation_segments = alloc;
    cr.segments.clear();
    if (cr.fair)
      for (const segment_info& s : alloc) cr.segments.push_back({s.begin, s.end});
    if (cr.fair && alloc.empty()) warn(reps[c].warnings, "--fair: the system prompt has no segment");
    cr.whitelist = whitelist_tokens(configs[c].whitelist, ps, p.system, reps[c].warnings);
  }
  return reps;
}

// The (configuration, user turn) pairs in order, each as a sequence forked from its configuration's compressed
// cache with the user turn prefilled alone (the arithmetic of a single run). A configuration's cache is
// compressed when its first turn is admitted and handed to its last one, so besides the base at most one
// compressed cache is alive. A configuration that cannot be compressed (e.g. a whitelist larger than its keep
// budget) throws when strict; otherwise its report keeps the error, and none of its turns runs.
class turn_source {
 public:
  turn_source(engine& eng, const sequence& base, int n_sys, std::vector<compress_config>& configs,
              const std::vector<chat::encoded_turn>& users, std::vector<run_report>& reps, bool strict)
      : eng_(eng), base_(base), n_sys_(n_sys), configs_(configs), users_(users), reps_(reps), strict_(strict),
        compressed_cfg_(configs.size()) {}

  // Turn `id` is user turn id % users of configuration id / users.
  size_t config_of(size_t id) const { return id / users_.size(); }
  size_t user_of(size_t id) const { return id % users_.size(); }
  // Only the first n configurations are run (score-only sweeps decode the reference's answers alone).
  void limit(size_t n) { end_cfg_ = std::min(n, configs_.size()); }

  std::optional<decode_turn> next() {
    while (next_cfg_ < end_cfg_) {
      const size_t c = next_cfg_, u = next_user_;
      if (++next_user_ == users_.size()) next_user_ = 0, ++next_cfg_;
      run_report& rep = reps_[c];
      if (compressed_cfg_ != c && !compress(c)) {
        next_cfg_ = c + 1, next_user_ = 0;  // none of its turns runs
        continue;
      }
      decode_turn t;
      t.id = c * users_.size() + u;
      t.seq = next_cfg_ != c ? std::move(*compressed_) : *compressed_;  // its last turn takes it
      const std::vector<int32_t>& ids = users_[u].tokens.ids;
      const auto t0 = std::chrono::steady_clock::now();
      t.logits = eng_.feed(t.seq, ids);
      rep.prefill_ms += ms_since(t0);
      rep.prefill_tokens += int(ids.size());
      return t;
    }
    return std::nullopt;
  }

 private:
  // Compresses a copy of the base for configuration c and records what it kept; false if it cannot run.
  bool compress(size_t c) {
    run_report& rep = reps_[c];
    compressed_.reset();
    sequence comp = base_;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const compress_request& req = configs_[c].compress;
      const compress_result cr = compress_layers_on(eng_.pool(), comp.cache, n_sys_, req);
      rep.compress_ms = ms_since(t0);
      rep.window_used = cr.window_used;
      record_kept(rep, cr, eng_.hp().n_layers, eng_.hp().n_kv_heads);
    } catch (const std::exception& e) {
      if (strict_) throw;
      rep.error = e.what();
      rep.turns.clear();
      return false;
    }
    comp.cache.drop_queries();
    compressed_ = std::move(comp);
    compressed_cfg_ = c;
    return true;
  }

  engine& eng_;
  const sequence& base_;
  int n_sys_;
  std::vector<compress_config>& configs_;
  const std::vector<chat::encoded_turn>& users_;
  std::vector<run_report>& reps_;
  bool strict_;
  std::optional<sequence> compressed_;
  size_t compressed_cfg_;
  size_t next_cfg_ = 0, next_user_ = 0;
  size_t end_cfg_ = configs_.size();
};

// The reference configuration's greedy answers and the distributions it picked them from, per user turn.
struct reference_answers {
  explicit reference_answers(size_t users) : picks(users), dists(users) {}
  std::vector<std::vector<int32_t>> picks;              // [users][picks]: the answer, + its stop token if any
  std::vector<std::vector<std::vector<float>>> dists;   // [users][picks][n_vocab] log-probs (stop pick included)
};

// Teacher-forced scoring of every (configuration, user turn) from a fresh turn source (each configuration's cache
// compressed again and each user turn prefilled again: the arithmetic of the greedy pass), then its continuation
// and/or the reference's answer forced, all in lockstep (scoring.hpp). Forced sequence 2·turn is the
// continuation, 2·turn + 1 the reference's answer (on a fork of the turn's sequence). Engine: as score_forced's,
// plus fork(seq) -> a copy; Turns: next() -> std::optional<basic_decode_turn<Seq>>, config_of(id), user_of(id).
template <class Engine, class Turns>
void score_turns(Engine& eng, Turns& turns, const tokenized_prompt& prompt, const reference_answers& refs,
                 std::vector<run_report>& reps, int max_batch, const progress& prog) {
  using seq_t = decltype(turns.next()->seq);
  using forced_t = basic_forced_turn<seq_t>;
  const bool reference = !refs.picks.empty();
  std::vector<forced_t> pending;
  score_forced(
      eng, max_batch, prog,
      [&]() -> std::optional<forced_t> {
        while (pending.empty()) {
          auto t = turns.next();
          if (!t) return std::nullopt;
          const size_t u = turns.user_of(t->id);
          const bool continuation = !prompt.continuations.empty() && !prompt.continuations[u].empty();
          if (reference) {
            forced_t f;
            f.id = 2 * t->id + 1;
            f.targets = refs.picks[u];  // the stop pick is scored, never fed
            f.n_dists = int(f.targets.size());
            f.reference = &refs.dists[u];
            f.seq = continuation ? eng.fork(t->seq) : std::move(t->seq);
            f.logits = t->logits;
            pending.push_back(std::move(f));
          }
          if (continuation) {
            forced_t f;
            f.id = 2 * t->id;
            f.targets = prompt.continuations[u];
            f.n_dists = int(f.targets.size());
            f.seq = std::move(t->seq);
            f.logits = std::move(t->logits);
            pending.push_back(std::move(f));
          }
        }
        forced_t f = std::move(pending.back());
        pending.pop_back();
        return f;
      },
      [&](forced_result&& r) {
        const size_t id = r.id / 2;
        turn_scores& sc = reps[turns.config_of(id)].turns[turns.user_of(id)].scores;
        double sum = 0;
        for (const double lp : r.logprobs) sum += lp;
        if (r.id % 2 == 0) {
          sc.continuation_scored = true;
          sc.continuation_logprob = sum;
          sc.continuation_logprobs = std::move(r.logprobs);
        } else {
          double kl = 0;
          for (const double k : r.kl) kl += k;
          sc.reference_scored = true;
          sc.reference_logprob = sum;
          sc.kl_mean = r.kl.empty() ? 0.0 : kl / double(r.kl.size());
          sc.kl_per_token = std::move(r.kl);
        }
      });
}

// Every (configuration, user turn) answered from a fresh turn source of make_turns(), all decoded together (with
// --score-only, the reference's only), each pick's log-probability summed and the reference's distributions kept
// for KL; then, when asked, the teacher-forced scores from a second source. The part of a run after the system
// turn's prefill that every engine shares (fairkv-llama's here, llama.cpp's in examples/llamacpp/session.hpp).
// text(tokens) -> the answer's text.
template <class Engine, class Stops, class Text, class MakeTurns>
void answer_turns(Engine& eng, const Stops& stops, Text&& text, MakeTurns&& make_turns, const runner_options& opt,
                  const tokenized_prompt& prompt, std::vector<run_report>& reps, const progress& prog) {
  const size_t n_users = opt.users.size();
  reference_answers refs(opt.reference ? n_users : 0);
  {
    auto turns = make_turns();
    if (opt.score_only) turns.limit(opt.reference ? 1 : 0);
    decode_greedy(
        eng, stops, {opt.max_new_tokens, opt.max_batch}, prog, [&] { return turns.next(); },
        [&](decoded_turn&& d) {
          run_report& rep = reps[turns.config_of(d.id)];
          turn_result& t = rep.turns[turns.user_of(d.id)];
          t.answer = text(d.tokens);
          t.new_tokens = int(d.tokens.size());
          t.scores.answered = true;
          rep.decode_ms += d.decode_ms;
          rep.decode_tokens += d.fed;
        },
        [&](size_t id, std::span<const float> logits) {
          turn_scores& sc = reps[turns.config_of(id)].turns[turns.user_of(id)].scores;
          const int32_t pick = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
          sc.answer_logprob += log_softmax_at(logits, pick);
          ++sc.answer_picks;
          if (opt.reference && turns.config_of(id) == 0) {
            refs.picks[turns.user_of(id)].push_back(pick);
            log_softmax(logits, refs.dists[turns.user_of(id)].emplace_back());
          }
        });
  }
  if (opt.reference && !reps[0].error.empty())
    throw std::runtime_error("--reference: the reference (first) configuration could not run: " + reps[0].error);
  if (opt.reference || !prompt.continuations.empty()) {
    auto turns = make_turns();
    score_turns(eng, turns, prompt, refs, reps, opt.max_batch, prog);
  }
}

// The capture a prefill needs for these configurations (attention_input_of): the post-RoPE queries for
// segment-local attention scoring, H2O's column sums and the last attention rows (SnapKV's widest window, TOVA's
// last row) accumulated by the prefill's own softmax for the others. One set of local regions is captured; a
// configuration with other regions recomputes from the queries. statistics = false: queries only (an engine whose
// prefill cannot hand over its softmax).
inline capture_options capture_for(const std::vector<compress_config>& configs, int n_sys, bool statistics = true) {
  capture_options capture;
  for (const compress_config& c : configs) {
    attention_input src = attention_input_of(c.compress);
    if (!statistics && src != attention_input::none) src = attention_input::queries;
    if (src == attention_input::local_column_sums) {
      std::vector<fairkv::segment> regions;
      try {
        regions = scoring_regions_of(c.compress, n_sys);
      } catch (const std::runtime_error&) {
        continue;  // invalid segments: the configuration's compression reports it
      }
      if (capture.local_regions.empty()) capture.local_regions = std::move(regions);
      else if (!same_regions(capture.local_regions, regions)) src = attention_input::queries;
    }
    capture.queries = capture.queries || src == attention_input::queries;
    capture.column_sums = capture.column_sums || src == attention_input::column_sums;
    if (src == attention_input::last_rows) capture.last_rows = std::max(capture.last_rows, last_rows_needed(c.compress, n_sys));
  }
  return capture;
}

// What every report of a run shares, known once the system turn is prefilled.
struct run_facts {
  const char* engine;  // "fairkv-llama" | "llama.cpp"
  int n_layers = 0, n_kv_heads = 0, n_sys = 0, threads = 0;
  double load_ms = 0, prefill_ms = 0;  // the model's load and the system turn's prefill, shared by every report
};

inline void stamp_reports(std::vector<run_report>& reps, const runner_options& opt, const run_facts& f) {
  for (run_report& rep : reps) {
    rep.engine = f.engine;
    rep.model = opt.model_path;
    rep.n_layers = f.n_layers;
    rep.n_kv_heads = f.n_kv_heads;
    rep.system_tokens = f.n_sys;
    rep.threads = f.threads;
    rep.load_ms = f.load_ms;
    rep.prefill_ms = f.prefill_ms;
    rep.prefill_tokens = f.n_sys;
    rep.turns.resize(opt.users.size());
    for (size_t u = 0; u < opt.users.size(); ++u) rep.turns[u].user = opt.users[u];
  }
}

// Each report keeps the options of its own configuration.
inline void finish_reports(std::vector<run_report>& reps, const runner_options& opt,
                           const std::vector<compress_config>& configs) {
  for (size_t c = 0; c < configs.size(); ++c) {
    reps[c].options = opt;
    reps[c].options.compress = configs[c].compress;
    reps[c].options.whitelist = configs[c].whitelist;
    reps[c].options.configs.clear();
  }
}

// The shared body of run_session and run_sweep. strict: a configuration that cannot be compressed throws;
// otherwise its report carries the error and the others run.
inline std::vector<run_report> run_configs(runner_options opt, std::vector<compress_config> configs, bool strict) {
  check_request(opt, configs);
  const parsed_system ps = parse_system_segments(opt.system);  // marker errors before the model is loaded
  const progress prog(opt.quiet);

  auto t0 = std::chrono::steady_clock::now();
  if (opt.model_path.empty()) opt.model_path = resolve_model("");
  const model m = model::load(opt.model_path);
  const tokenizer tok = tokenizer::from_gguf(m.file());
  const double load_ms = ms_since(t0);
  const hparams& hp = m.hp();

  const tokenized_prompt prompt = tokenize_prompt(tok, ps, opt, hp.n_ctx_train);
  const int n_sys = int(prompt.system.tokens.ids.size());
  std::vector<run_report> reps = start_reports(configs, ps, prompt);

  // The system turn, prefilled once, keeping what the configurations' scorers read (capture_for).
  engine eng(m, /*capacity of its own sequence, unused here=*/0, opt.forward);
  const capture_options capture = capture_for(configs, n_sys);
  sequence base = eng.make_sequence(prompt.capacity);
  t0 = std::chrono::steady_clock::now();
  eng.feed(base, prompt.system.tokens.ids, false, capture, [&](int done, int total) {
    prog.update("prefill system", done, total, ms_since(t0) / 1000.0, done == total);
  });
  stamp_reports(reps, opt, {"fairkv-llama", hp.n_layers, hp.n_kv_heads, n_sys, eng.threads(), load_ms, ms_since(t0)});

  answer_turns(
      eng, chat::stop_tokens(tok), [&](const std::vector<int32_t>& ids) { return unicode::to_valid_utf8(tok.decode(ids)); },
      [&] { return turn_source(eng, base, n_sys, configs, prompt.users, reps, strict); }, opt, prompt, reps, prog);
  finish_reports(reps, opt, configs);
  return reps;
}

}  // namespace detail

// One configuration (opt.compress, opt.whitelist): throws if it cannot run.
inline run_report run_session(runner_options opt) {
  std::vector<compress_config> one{{opt.compress, opt.whitelist}};
  return std::move(detail::run_configs(std::move(opt), std::move(one), /*strict=*/true).front());
}

// Every configuration of opt.configs from one prefill of the system turn; a configuration that cannot be
// compressed reports its error and the others still run. Invalid options (policy names, ratios) throw first.
inline std::vector<run_report> run_sweep(runner_options opt) {
  std::vector<compress_config> configs = std::move(opt.configs);
  return detail::run_configs(std::move(opt), std::move(configs), /*strict=*/false);
}

}  // namespace llama
