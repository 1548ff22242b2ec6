// The report of one configuration: the answers, what its compression kept of every segment (per layer, and of
// the leading attention-sink tokens), the timings and the warnings; to_json writes it as --json does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "compress.hpp"
#include "json.hpp"
#include "options.hpp"
#include "scores.hpp"
#include "system_prompt.hpp"

namespace llama {

struct turn_result {
  std::string user;
  std::string answer;
  int new_tokens = 0;
  turn_scores scores;  // teacher-forced scoring, when asked (scores.hpp)
};

struct run_report {
  std::string engine = "fairkv-llama";  // which engine ran: fairkv-llama | llama.cpp
  std::string model;
  runner_options options;
  int system_tokens = 0;
  int n_layers = 0, n_kv_heads = 0;
  int window_used = 0;
  std::vector<segment_info> segments;             // measured: the [[seg:]] markers, else the allocation's
  std::vector<segment_info> allocation_segments;  // --segments MODE over a marked prompt: what fair allocated over
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

// extra: more members of the engine's own (each line "  \"name\": value,\n"), written after the engine's name.
inline std::string to_json(const run_report& r, const std::string& extra = "") {
  using json::number;
  using json::quote;
  const runner_options& o = r.options;
  std::string s = "{\n";
  s += "  \"engine\": " + quote(r.engine) + ",\n";
  s += extra;
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
  s += "  \"segmentation\": " + quote(o.compress.segmentation.empty() ? "default" : o.compress.segmentation) + ",\n";
  s += "  \"allocation_segments\": [";
  for (size_t i = 0; i < r.allocation_segments.size(); ++i) {
    const segment_info& g = r.allocation_segments[i];
    s += std::string(i ? ", " : "") + "{\"name\": " + quote(g.name) + ", \"begin\": " + std::to_string(g.begin) +
         ", \"end\": " + std::to_string(g.end) + "}";
  }
  s += "],\n";
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
         quote(r.turns[i].answer) + ", \"new_tokens\": " + std::to_string(r.turns[i].new_tokens) +
         scores_json(r.turns[i].scores) + "}";
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

// The console output of both CLIs (fairkv-llama, fairkv-llamacpp).
// A single run: what ran and what each segment kept (stderr).
inline void print_run_summary(const run_report& r) {
  const compress_request& c = r.options.compress;
  std::fprintf(stderr, "%s, model %s: %d system tokens, policy %s ratio %s%s, selector %s\n", r.engine.c_str(),
               r.model.c_str(), r.system_tokens, c.policy.c_str(), json::number(c.ratio).c_str(),
               c.fair ? " (fair)" : "", c.selector.c_str());
  for (const auto& s : r.segments)
    std::fprintf(stderr, "  segment %-12s tokens [%d, %d)  kept %.1f (%.1f%%)\n", s.name.c_str(), s.begin, s.end,
                 s.kept, 100.0 * s.kept_fraction);
  std::fprintf(stderr, "timings: load %.0f ms, prefill %.0f ms (%d tokens), compress %.1f ms, decode %.0f ms (%d tokens)\n",
               r.load_ms, r.prefill_ms, r.prefill_tokens, r.compress_ms, r.decode_ms, r.decode_tokens);
}

// The answers (stdout), each after its user turn unless quiet with one turn.
inline void print_answers(const run_report& r, bool quiet) {
  for (const auto& t : r.turns) {
    if (r.turns.size() > 1 || !quiet) std::printf("> %s\n", t.user.c_str());
    std::printf("%s\n", t.answer.c_str());
  }
}

// A sweep: per configuration its kept fractions (unless quiet) and answers, or its error. Returns how many could
// not run (all of them: an error on stderr; some: a warning).
inline size_t print_sweep(const std::vector<const run_report*>& reps, bool quiet, const char* program) {
  size_t failed = 0;
  for (size_t i = 0; i < reps.size(); ++i) {
    const run_report& r = *reps[i];
    const compress_request& c = r.options.compress;
    std::printf("== config %zu: %s ratio %s%s%s\n", i + 1, c.policy.c_str(), json::number(c.ratio).c_str(),
                c.fair ? " fair" : "", r.options.whitelist.empty() ? "" : " whitelist");
    if (!r.error.empty()) {
      std::printf("error: %s\n", r.error.c_str());
      std::fprintf(stderr, "%s: configuration %zu: error: %s\n", program, i + 1, r.error.c_str());
      ++failed;
      continue;
    }
    if (!quiet)
      for (const auto& s : r.segments)
        std::printf("  segment %-12s kept %.1f of %d (%.1f%%)\n", s.name.c_str(), s.kept, s.tokens(),
                    100.0 * s.kept_fraction);
    for (const auto& t : r.turns) std::printf("> %s\n%s\n", t.user.c_str(), t.answer.c_str());
  }
  if (failed == reps.size() && failed > 0)
    std::fprintf(stderr, "%s: error: none of the %zu configurations could run\n", program, reps.size());
  else if (failed > 0)
    std::fprintf(stderr, "warning: %zu of %zu configurations could not run\n", failed, reps.size());
  return failed;
}

}  // namespace llama
