// What a run is asked to do (runner_options, one compress_config per configuration of a sweep) and the checks
// that refuse an invalid request, naming the option, before the model is loaded.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "auto_segments.hpp"
#include "compress.hpp"
#include "forward.hpp"
#include "json.hpp"

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
  // Teacher-forced scoring (scoring.hpp, docs/llama-runner.md "Scoring"): continuations[u] is forced after user
  // turn u and its per-token log-probabilities reported ("" leaves that turn unscored; empty vector: none).
  std::vector<std::string> continuations;
  // The first configuration is the reference: every configuration forces its greedy answers and reports
  // KL(reference || configuration) along them.
  bool reference = false;
  // Only scoring: no greedy answer is decoded, except the reference's.
  bool score_only = false;
};

// Caps of the runner's counts (the CLI refuses values beyond them; docs/llama-runner.md, "Limits").
inline constexpr int max_token_count = 1 << 20;  // --max-new-tokens, --window
inline constexpr int max_batch_cap = 1024;       // --max-batch

namespace detail {

inline void check_range(const char* what, int v, int lo, int hi) {
  if (v < lo || v > hi)
    throw std::runtime_error(std::string(what) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             "], got " + std::to_string(v));
}

inline void check_config(const compress_config& cfg) {
  const compress_request& c = cfg.compress;
  check_names(c);
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
  if (!c.segmentation.empty()) (void)parse_segmentation(c.segmentation);
}

// Everything about the request that can be refused without the model.
inline void check_request(const runner_options& opt, const std::vector<compress_config>& configs) {
  if (opt.users.empty()) throw std::runtime_error("no user turn (--user)");
  if (configs.empty()) throw std::runtime_error("no compression configuration");
  for (const compress_config& c : configs) {
    check_config(c);
    if (c.compress.segmentation == "markers" && opt.system.find("[[seg:") == std::string::npos)
      throw std::runtime_error("--segments markers: the system prompt has no [[seg:NAME]] marker");
  }
  check_range("--max-new-tokens", opt.max_new_tokens, 0, max_token_count);
  if (!opt.continuations.empty() && opt.continuations.size() != opt.users.size())
    throw std::runtime_error("--continuation: give one per --user (" + std::to_string(opt.users.size()) +
                             "), got " + std::to_string(opt.continuations.size()) + " (\"\" leaves a turn unscored)");
  const bool any_continuation = std::any_of(opt.continuations.begin(), opt.continuations.end(),
                                            [](const std::string& c) { return !c.empty(); });
  if (!opt.continuations.empty() && !any_continuation)
    throw std::runtime_error("--continuation: every continuation is empty, nothing to score");
  if (opt.reference && opt.max_new_tokens == 0)
    throw std::runtime_error("--reference: the reference answers need --max-new-tokens >= 1");
  if (opt.score_only && !any_continuation && !opt.reference)
    throw std::runtime_error("--score-only: nothing to score (give --continuation or --reference)");
  check_range("--max-batch", opt.max_batch, 1, max_batch_cap);
}

}  // namespace detail
}  // namespace llama
