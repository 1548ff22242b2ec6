// fairkv-llamacpp's command line: fairkv-llama's (examples/llama/cli.hpp: the same options, sweeps with --config,
// scoring, the same strict parsing, all validated before the model loads), plus llama.cpp's own context knobs,
// which are taken out of the arguments first. --q8 (fairkv-llama's own kernels) is refused.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"  // examples/llama: the shared option table and parser
#include "session.hpp"

namespace llamacpp::cli {

using llama::cli::fail;

struct args {
  session_options opt;
  std::string json_path;
  bool sweep = false;
  bool help = false;
};

struct option {
  const char* name;
  const char* arg;  // "" for a flag
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

// llama.cpp's knobs, on top of fairkv-llama's options (whose --threads and --batch set llama.cpp's).
inline const std::vector<option>& options() {
  using llama::cli::parse_int;
  static const std::vector<option> table = {
      {"--ctx", "N", "tokens per sequence, in [16, 1048576] (default: what the run needs, at least system turn +\n"
                     "longest user turn + --max-new-tokens + 1, rounded up to 256)",
       [](args& a, std::string_view n, const std::string& v) { a.opt.context.n_ctx = parse_int(n, v, 16, 1 << 20); }},
      {"--flash-attn", "MODE", "auto | on | off   (default auto: off when a configuration reads attention statistics\n"
                               "from the prefill, or in a sweep; off stores V transposed)",
       [](args& a, std::string_view n, const std::string& v) {
         const std::string m = parse_choice(n, v, {"auto", "on", "off"});
         a.opt.context.flash_attn = m == "auto" ? -1 : m == "on" ? 1 : 0;
       }},
      {"--cache-type", "TYPE", "f16 | q8_0 | q4_0 K and V cache (default f16; quantised ones are refused by the\n"
                               "compressor; a quantised V cache needs --flash-attn on)",
       [](args& a, std::string_view n, const std::string& v) {
         a.opt.context.type_k = a.opt.context.type_v = parse_cache_type(n, v);
       }},
      {"--batch-invariant", "", "a single run with the kernels of a sweep (each row computed as if alone): its\n"
                                "answers equal the sweep's; sweeps always use them (docs/llamacpp.md)",
       [](args& a, std::string_view, const std::string&) { a.opt.context.batch_invariant = true; }},
  };
  return table;
}

inline std::string usage() {
  std::string u = llama::cli::format_usage(
      "usage: fairkv-llamacpp [options]   (fairkv over the unmodified llama.cpp's KV cache)\n\n"
      "fairkv-llama's options (--q8 excepted; --threads and --batch set llama.cpp's):\n",
      llama::cli::options());
  u.resize(u.rfind("  -h, --help"));  // format_usage's last line, printed once below
  return llama::cli::format_usage(u + "\nllama.cpp's context:\n", options());
}

inline args parse(int argc, const char* const* argv) {
  args a;
  std::vector<const char*> rest{argc > 0 ? argv[0] : "fairkv-llamacpp"};
  std::vector<std::string_view> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string_view s = argv[i];
    if (s == "-h" || s == "--help") {
      a.help = true;
      return a;
    }
    const auto own = std::find_if(options().begin(), options().end(), [&](const option& o) { return s == o.name; });
    if (own == options().end()) {
      if (s == "--q8") fail(s, "fairkv-llama's own activation kernels; llama.cpp chooses its own");
      rest.push_back(argv[i]);
      continue;
    }
    if (std::find(seen.begin(), seen.end(), s) != seen.end()) fail(s, "given twice");
    seen.push_back(s);
    std::string value;
    if (*own->arg) {
      if (i + 1 >= argc) fail(s, "needs a value (" + std::string(own->arg) + ")");
      value = argv[++i];
    }
    own->apply(a, s, value);
  }
  llama::cli::args r = llama::cli::parse(int(rest.size()), rest.data());
  a.help = r.help;
  a.sweep = r.sweep;
  a.json_path = std::move(r.json_path);
  a.opt.run = std::move(r.opt);
  // fairkv-llama's prefill chunk defaults to 128; llama.cpp keeps its own (context_options::n_batch) unless asked.
  if (std::none_of(rest.begin(), rest.end(), [](const char* x) { return std::string_view(x) == "--batch"; }))
    a.opt.run.forward.batch = 0;
  if (a.sweep && a.opt.context.flash_attn == 1)
    fail("--flash-attn", "a sweep decodes batch-invariantly, with flash attention off");
  if (a.opt.context.batch_invariant && a.opt.context.flash_attn == 1)
    fail("--batch-invariant", "needs flash attention off");
  // llama.cpp stores V transposed without flash attention, and a transposed V cannot be quantised: refuse here,
  // by name, rather than let the context fail to come up after the model has loaded.
  if (a.opt.context.type_v != GGML_TYPE_F16 && a.opt.context.flash_attn != 1)
    fail("--cache-type", std::string("a quantised V cache needs flash attention on (--flash-attn on)") +
                             (a.sweep || a.opt.context.batch_invariant
                                  ? ", which sweeps and --batch-invariant turn off: use f16"
                                  : ""));
  if (a.opt.run.max_batch > max_slots - 2)
    fail("--max-batch", "llama.cpp decodes at most " + std::to_string(max_slots - 2) + " sequences together");
  return a;
}

}  // namespace llamacpp::cli
