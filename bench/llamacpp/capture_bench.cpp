// What reading attention statistics out of llama.cpp's prefill costs the prefill itself: one process, one model,
// one context, R interleaved rounds; in every round the same system turn is prefilled into an empty slot without a
// capture (the baseline) and with each capture a fairkv scorer may ask for (fairkv-llamacpp's prefill_capture.hpp).
// Prints each capture's median prefill time and its median ratio to the same round's baseline (a process-level
// bench cannot separate a few percent from run-to-run noise; this one can).
//
//   fairkv_llamacpp_capture_bench MODEL TOKENS [ROUNDS] [THREADS]     (flash attention off, as capture needs)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_setup.hpp"

int main(int argc, char** argv) {
  using fairkv_bench::median;
  fairkv_bench::llamacpp_args a = fairkv_bench::parse_llamacpp_args(argc, argv);
  a.context.flash_attn = 0;
  const int tokens = a.tokens, rounds = a.rounds;
  llamacpp::engine eng(a.path, a.context);
  const std::vector<llama_token> ids = fairkv_bench::bench_tokens(tokens);

  // One region per 32 tokens, as segment-local H2O asks for with ~32-token instructions.
  std::vector<fairkv::segment> regions;
  for (int b = 0; b < tokens; b += 32) regions.push_back({b, std::min(tokens, b + 32)});
  struct kind {
    const char* name;
    llama::capture_options what;
  };
  const std::vector<kind> kinds = {
      {"none", {}},
      {"queries (fair SnapKV/TOVA, paper mode)", {.queries = true}},
      {"last_rows 16 (SnapKV, TOVA)", {.last_rows = 16}},
      {"column_sums (H2O)", {.column_sums = true}},
      {"local_column_sums (fair H2O)", {.local_regions = regions}},
  };
  std::vector<std::vector<double>> ms(kinds.size()), ratio(kinds.size());
  for (int r = 0; r < rounds; ++r) {
    double base = 0;
    for (size_t k = 0; k < kinds.size(); ++k) {
      llamacpp::slot s = eng.acquire();
      const auto t0 = std::chrono::steady_clock::now();
      (void)eng.feed(s, ids, kinds[k].what);
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (k == 0) base = t;
      ms[k].push_back(t);
      ratio[k].push_back(t / base);
    }
  }
  std::printf("%s, %d-token prefill, %d threads, %d interleaved rounds (flash attention off)\n", a.model.c_str(),
              tokens, a.context.threads, rounds);
  std::printf("| capture | prefill ms (median) | / no capture, same round (median) |\n|---|---|---|\n");
  for (size_t k = 0; k < kinds.size(); ++k)
    std::printf("| %s | %.0f | %.4f |\n", kinds[k].name, median(ms[k]), median(ratio[k]));
  return 0;
}
