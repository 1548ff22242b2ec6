// What one compaction of a llama.cpp sequence costs through its state (fairkv::llamacpp::compress_sequence), in
// memory and in time, against the sequence's own state size and one decode step at the same length: a sequence of
// TOKENS tokens is compressed to half (knorm), R interleaved rounds of each round-trip mode, the sequence restored
// between them. Peak memory: the process's peak RSS (VmHWM, reset through /proc/self/clear_refs before every
// compaction) above its RSS just before it.
//
//   fairkv_llamacpp_round_trip_bench MODEL TOKENS [ROUNDS] [THREADS]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_setup.hpp"
#include "chat_session.hpp"  // llama::resident_bytes, llama::peak_resident_bytes
#include "compress_state.hpp"
#include "fairkv/llamacpp/sequence.hpp"

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Resets the peak RSS to the current one (Linux >= 4.0); false where the kernel does not allow it.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  return static_cast<bool>(f << "5" << std::flush);
}

}  // namespace

int main(int argc, char** argv) {
  using fairkv_bench::median;
  const fairkv_bench::llamacpp_args a = fairkv_bench::parse_llamacpp_args(argc, argv);
  const int tokens = a.tokens, rounds = a.rounds;
  llamacpp::engine eng(a.path, a.context);
  const std::vector<llama_token> ids = fairkv_bench::bench_tokens(tokens);
  llamacpp::slot& s = eng.main();
  eng.feed(s, ids);
  const std::vector<std::uint8_t> full = eng.get_state(s);
  const fairkv::llamacpp::state_shape shape = eng.state_shape();
  fairkv::policy_spec spec;
  spec.scorer = fairkv::scorer_kind::knorm;
  auto no_attention = [](int, std::int64_t, fairkv::llamacpp::attention_statistics&) { return std::string(); };

  struct mode {
    const char* name;
    bool keep_original;
    std::vector<double> ms, peak;
  };
  std::vector<mode> modes = {{"in place (keep_original false)", false, {}, {}},
                             {"keep_original (the default)", true, {}, {}}};
  std::vector<double> step_ms;
  bool peak_ok = true;
  for (int r = 0; r < rounds; ++r) {
    for (mode& m : modes) {
      eng.truncate(s, 0);
      if (!eng.set_state(s, full)) throw std::runtime_error("llama.cpp refused the saved state");
      peak_ok = reset_peak() && peak_ok;
      const std::int64_t before = llama::resident_bytes();
      fairkv::llamacpp::request req{spec, {}, {}, fairkv::keep_target(0.5)};
      req.keep_original = m.keep_original;
      const auto t0 = std::chrono::steady_clock::now();
      const fairkv::llamacpp::compression c = fairkv::llamacpp::compress_sequence(
          eng.ctx(), s.id(), shape, req, no_attention, llamacpp::compiled_planner{});
      m.ms.push_back(ms_since(t0));
      m.peak.push_back(double(llama::peak_resident_bytes() - before));
      if (!c.error.empty()) throw std::runtime_error(c.error);
    }
    // One decode step at the full length (the cost a compaction is weighed against): the second after the state
    // is loaded (the first after a load also re-plans llama.cpp's compute graph, seconds on this machine).
    eng.truncate(s, 0);
    if (!eng.set_state(s, full)) throw std::runtime_error("llama.cpp refused the saved state");
    eng.feed(s, std::vector<llama_token>{1234});
    const auto t0 = std::chrono::steady_clock::now();
    eng.feed(s, std::vector<llama_token>{1235});
    step_ms.push_back(ms_since(t0));
  }
  const double mib = 1024.0 * 1024.0, state = double(full.size());
  std::printf("model %s, %d tokens, %d rounds, %d threads: state %.1f MiB; one decode step %.1f ms (median)\n",
              a.model.c_str(), tokens, rounds, a.context.threads, state / mib, median(step_ms));
  if (!peak_ok) std::printf("(the kernel refused to reset the peak RSS: peaks are upper bounds)\n");
  std::printf(
      "| round trip | median ms | / decode step | peak RSS above before (MiB) | / state size "
      "|\n|---|---|---|---|---|\n");
  for (const mode& m : modes)
    std::printf("| %s | %.1f | %.2f | %.1f | %.2f |\n", m.name, median(m.ms), median(m.ms) / median(step_ms),
                median(m.peak) / mib, median(m.peak) / state);
  return 0;
}
