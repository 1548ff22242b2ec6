// fairkv-llamacpp: fairkv inside the unmodified llama.cpp, with fairkv-llama's command line. Prefill a system
// prompt, compress llama.cpp's own KV cache through its sequence state, answer user turns; with --config groups,
// many configurations from one prefill, decoded together.
//
//   fairkv-llamacpp --model qwen1.5b --system "[[seg:rules]]Never reveal X. [[seg:doc]]..." --user "What is X?"
//                   --policy snapkv --ratio 0.5 --fair --json out.json
//   fairkv-llamacpp --system ... --user ... --config --policy snapkv --ratio 0.7 --config ... --fair
//   fairkv-llamacpp chat --budget 512 --fair --script turns.jsonl    (a conversation under a token budget:
//                   llamacpp_chat.hpp; --context-shift for llama.cpp's own rule)
#include <cstdio>
#include <exception>
#include <fstream>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "llamacpp_chat_cli.hpp"
#include "llamacpp_cli.hpp"

namespace {

void write_json(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!(out << text) || !out.flush()) throw std::runtime_error("--json: cannot write '" + path + "'");
}

void print_state(const llamacpp::session_report& r) {
  std::fprintf(stderr, "  state: %zu -> %zu bytes, %u -> %u cells; statistics %s; state read %.1f + parse %.2f + "
                       "plan/compact %.1f + write %.1f + load %.1f ms\n",
               r.state_bytes_before, r.state_bytes_after, r.cells_before, r.cells_after, r.statistics.c_str(),
               r.state_read_ms, r.parse_ms, r.plan_ms, r.write_ms, r.state_load_ms);
}

int run_single(llamacpp::session_options opt, const std::string& json_path) {
  const bool quiet = opt.run.quiet;
  const llamacpp::session_report rep = llamacpp::run_session(std::move(opt));
  const llama::run_report& run = rep.run;
  if (!quiet) {
    llama::print_run_summary(run);
    print_state(rep);
  }
  llama::print_answers(run, quiet);
  if (!json_path.empty()) write_json(json_path, llamacpp::to_json(rep));
  return 0;
}

int run_sweep(llamacpp::session_options opt, const std::string& json_path) {
  const bool quiet = opt.run.quiet;
  const std::vector<llamacpp::session_report> reps = llamacpp::run_sweep(std::move(opt));
  std::vector<const llama::run_report*> runs;
  for (const auto& r : reps) runs.push_back(&r.run);
  const size_t failed = llama::print_sweep(runs, quiet, "fairkv-llamacpp");
  if (!json_path.empty()) {
    std::string doc = "[\n";
    for (size_t i = 0; i < reps.size(); ++i) doc += (i ? ",\n" : "") + llamacpp::to_json(reps[i]);
    write_json(json_path, doc + "]\n");
  }
  return failed == reps.size() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string_view(argv[1]) == "chat") {
      llamacpp::chat_cli::args c = llamacpp::chat_cli::parse(argc - 1, argv + 1);
      if (c.help) {
        std::fputs(llamacpp::chat_cli::usage().c_str(), stdout);
        return 0;
      }
      return llamacpp::chat_cli::run(std::move(c));
    }
    llamacpp::cli::args a = llamacpp::cli::parse(argc, argv);
    if (a.help) {
      std::fputs(llamacpp::cli::usage().c_str(), stdout);
      return 0;
    }
    return a.sweep ? run_sweep(std::move(a.opt), a.json_path) : run_single(std::move(a.opt), a.json_path);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fairkv-llamacpp: error: out of memory (one context slot per sequence decoded together: "
                         "lower --max-batch or --max-new-tokens)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fairkv-llamacpp: error: %s\n", e.what());
  }
  return 1;
}
