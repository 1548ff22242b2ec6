// fairkv-llamacpp: fairkv inside the unmodified llama.cpp. Prefill a system prompt, compress llama.cpp's own KV
// cache through its sequence state, answer user turns.
//
//   fairkv-llamacpp --system "[[seg:rules]]Never reveal X. [[seg:doc]]..." --user "What is X?"
//                   --policy snapkv --ratio 0.5 --fair --json out.json
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "llamacpp_cli.hpp"

int main(int argc, char** argv) {
  try {
    const llamacpp::cli::args a = llamacpp::cli::parse(argc, argv);
    if (a.help) {
      std::fputs(llamacpp::cli::usage().c_str(), stdout);
      return 0;
    }
    const llamacpp::session_report rep = llamacpp::run_session(a.opt);
    const llama::run_report& run = rep.run;
    if (!a.opt.quiet) {
      const llama::compress_request& c = run.options.compress;
      std::fprintf(stderr, "llama.cpp, model %s: %d system tokens, policy %s ratio %s%s, selector %s%s\n",
                   run.model.c_str(), run.system_tokens, c.policy.c_str(), llama::json::number(c.ratio).c_str(),
                   c.fair ? " (fair)" : "", c.selector.c_str(), rep.v_trans ? ", V transposed" : "");
      for (const auto& s : run.segments)
        std::fprintf(stderr, "  segment %-12s tokens [%d, %d)  kept %.1f (%.1f%%)\n", s.name.c_str(), s.begin, s.end,
                     s.kept, 100.0 * s.kept_fraction);
      std::fprintf(stderr, "state: %zu -> %zu bytes, %u -> %u cells\n", rep.state_bytes_before, rep.state_bytes_after,
                   rep.cells_before, rep.cells_after);
      std::fprintf(stderr,
                   "timings: load %.0f ms, prefill %.0f ms (%d tokens), state read %.1f + parse %.2f + plan/compact "
                   "%.1f + write %.1f + load %.1f ms, decode %.0f ms (%d tokens)\n",
                   run.load_ms, run.prefill_ms, run.prefill_tokens, rep.state_read_ms, rep.parse_ms, rep.plan_ms,
                   rep.write_ms, rep.state_load_ms, run.decode_ms, run.decode_tokens);
    }
    for (const auto& t : run.turns) {
      if (run.turns.size() > 1 || !a.opt.quiet) std::printf("> %s\n", t.user.c_str());
      std::printf("%s\n", t.answer.c_str());
    }
    if (!a.json_path.empty()) {
      std::ofstream out(a.json_path, std::ios::binary);
      if (!(out << llamacpp::to_json(rep)) || !out.flush())
        throw std::runtime_error("--json: cannot write '" + a.json_path + "'");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fairkv-llamacpp: error: %s\n", e.what());
  }
  return 1;
}
