// `fairkv-llamacpp chat`: fairkv-llama chat's command line (examples/llama/chat_cli.hpp: the same options, script
// format, report and strict parsing, all validated before the model loads) on llama.cpp (llamacpp_chat.hpp), plus
// llama.cpp's own rule as the baseline: --context-shift with --keep.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "chat_cli.hpp"  // examples/llama
#include "llamacpp_chat.hpp"

namespace llamacpp::chat_cli {

struct args {
  llama::chat_cli::args chat;  // what fairkv-llama chat takes
  bool context_shift = false;
  int n_keep = 0;
  bool keep_original = false;
  int flash_attn = -1;
  bool help = false;
};

// The options fairkv's eviction reads: meaningless under --context-shift, so refused there rather than ignored.
inline constexpr std::string_view eviction_options[] = {"--policy", "--selector",     "--window",
                                                        "--fair",   "--system-floor", "--turn-decay",
                                                        "--sinks",  "--boundary",     "--whitelist"};

inline std::string usage() {
  std::string u = llama::chat_cli::usage();
  u.replace(0, u.find('\n'), "usage: fairkv-llamacpp chat --budget N [options]   (a conversation in llama.cpp)");
  u.resize(u.rfind("  -h, --help"));
  return u +
         "\nllama.cpp:\n"
         "  --context-shift       llama.cpp's own rule instead of fairkv's: when the cache would reach\n"
         "                        --budget, keep the first --keep tokens and drop the older half of the rest\n"
         "                        (its completion tool's n_keep / n_discard); fairkv's options are refused\n"
         "  --keep N              under --context-shift: tokens kept at the start, in [-1, system tokens];\n"
         "                        -1: the whole system turn (default 0, llama.cpp's default)\n"
         "  --keep-original       hold the original state through each compaction's round trip, so a state\n"
         "                        llama.cpp refused could be reloaded (twice the state at the peak; default once)\n"
         "  --flash-attn MODE     auto | on | off (default auto)\n"
         "  -h, --help            this text\n";
}

// argv[0] is "chat".
inline args parse(int argc, const char* const* argv) {
  args a;
  std::vector<const char*> rest{argc > 0 ? argv[0] : "chat"};
  bool keep_given = false;
  std::vector<std::string_view> eviction;
  std::vector<std::string_view> seen;
  auto once = [&](std::string_view s) {
    if (std::find(seen.begin(), seen.end(), s) != seen.end()) llama::cli::fail(s, "given twice");
    seen.push_back(s);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view s = argv[i];
    if (s == "-h" || s == "--help") {
      a.help = true;
      return a;
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) llama::cli::fail(s, "needs a value");
      return argv[++i];
    };
    if (s == "--context-shift") {
      once(s);
      a.context_shift = true;
    } else if (s == "--keep") {
      once(s);
      a.n_keep = llama::cli::parse_int(s, value(), -1, 1 << 20);
      keep_given = true;
    } else if (s == "--keep-original") {
      once(s);
      a.keep_original = true;
    } else if (s == "--flash-attn") {
      once(s);
      const std::string v = value();
      if (v != "auto" && v != "on" && v != "off") llama::cli::fail(s, "unknown '" + v + "' (auto, on, off)");
      a.flash_attn = v == "auto" ? -1 : v == "on" ? 1 : 0;
    } else {
      if (std::find(std::begin(eviction_options), std::end(eviction_options), s) != std::end(eviction_options))
        eviction.push_back(s);
      rest.push_back(argv[i]);
    }
  }
  if (a.context_shift && !eviction.empty())
    llama::cli::fail(eviction.front(), "an option of fairkv's eviction; --context-shift applies llama.cpp's own rule");
  if (keep_given && !a.context_shift) llama::cli::fail("--keep", "needs --context-shift");
  if (a.keep_original && a.context_shift)
    llama::cli::fail("--keep-original", "a compaction's option; not with --context-shift");
  a.chat = llama::chat_cli::parse(int(rest.size()), rest.data());
  if (a.context_shift) a.chat.req.compress.policy = "none";  // what the report says: fairkv evicts nothing
  if (a.chat.forward.q8_activations) llama::cli::fail("--q8", "fairkv-llama's own activation kernels");
  return a;
}

// Runs the conversation in llama.cpp; returns the exit status.
inline int run(args a) {
  llama::chat_cli::args& c = a.chat;
  if (c.model_path.empty()) c.model_path = llama::resolve_model("");
  chat_options o;
  o.req = c.req;
  o.context_shift = a.context_shift;
  o.n_keep = a.n_keep;
  o.keep_original = a.keep_original;
  o.context.n_ctx = c.req.budget;
  o.context.flash_attn = a.flash_attn;
  o.context.threads = c.forward.threads > 0 ? c.forward.threads : llama::default_threads();
  check_chat_options(o);
  engine eng(c.model_path, o.context);
  chat_session session(eng, o, c.system);
  if (!c.quiet)
    std::fprintf(stderr, "chat (llama.cpp): %d system tokens, budget %d, %s, %zu system segments\n",
                 session.system_tokens(), c.req.budget,
                 a.context_shift ? ("context shift, n_keep " + std::to_string(session.n_keep())).c_str()
                                 : ("policy " + c.req.compress.policy + (c.req.compress.fair ? " (fair)" : "")).c_str(),
                 session.system_segments().size());
  const std::string header =
      "\"engine\": \"llama.cpp\", \"mode\": " + std::string(a.context_shift ? "\"context_shift\"" : "\"fairkv\"") +
      ", \"n_keep\": " + std::to_string(session.n_keep()) +
      ", \"keep_original\": " + (a.keep_original ? "true" : "false") + ", ";
  return llama::chat_cli::converse(c, session, "fairkv-llamacpp chat", header);
}

}  // namespace llamacpp::chat_cli
