// plan + compact of one layer on the CPU backend: 8 KV heads, head_dim 128, float, 4k and 32k tokens, ratio 0.5,
// for each policy, against a baseline measured in the same run: per head a plain std::nth_element on (score, index)
// pairs + sort of the kept indices + memcpy compaction, with the same K-Norm scores computed by Eigen.
// Each iteration restores the cache from a pristine copy outside the timed region, so every run does the same work.
// Variants `@1t` / `@2t` pass a 1- / 2-thread executor (a persistent pool, cpu/executor.hpp) to plan and compact;
// the ratio of each to the serial run of the same policy, measured in the same process, is printed at the end.
// The attention scorers (SnapKV's window of 16, TOVA's last row) are also compared with a plain Eigen GEMM of the
// shape of their logits (per KV head: its query heads' rows x head_dim times the keys), measured in the same run:
// their "GFLOP/s" counts only those logits' multiply-adds, so the two rates compare like with like.
// Variants `#compiled` / `#avx2` / `#avx512` pin the attention tile (cpu/detail/cpu_isa.hpp): the compile flags'
// tile and each wider one this CPU runs, dispatched at run time. `fma_peak#<tile>` measures one core's multiply-add
// rate with each tile's ISA (fma_peak.inc); the summary prints what the logits alone would take at that rate, a floor
// under any single-thread attention scorer of that ISA.
#include <benchmark/benchmark.h>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "thread_executor.hpp"

namespace {

constexpr std::int64_t kHeads = 8, kDim = 128, kGroup = 4;  // GQA: 32 query heads
constexpr double kRatio = 0.5;

struct layer {
  std::int64_t tokens;
  std::vector<float> k0, v0, k, v, q, colsum;
  std::vector<fairkv::segment> segments;
  std::vector<std::int32_t> whitelist;
  explicit layer(std::int64_t L) : tokens(L) {
    std::mt19937 rng(1);
    std::normal_distribution<float> n(0.f, 1.f);
    k0.resize(static_cast<std::size_t>(kHeads * L * kDim));
    v0.resize(k0.size());
    for (auto& x : k0) x = n(rng);
    for (auto& x : v0) x = n(rng);
    k = k0;
    v = v0;
    q.resize(static_cast<std::size_t>(kHeads * kGroup * 64 * kDim));
    for (auto& x : q) x = n(rng);
    colsum.resize(static_cast<std::size_t>(kHeads * kGroup * L));
    for (std::int64_t i = 0; i < kHeads * kGroup * L; ++i) colsum[i] = std::abs(n(rng));
    // The paper's shape: a defense and an instruction segment, then the rest; a whitelisted phrase.
    segments = {{0, static_cast<std::int32_t>(L / 8)}, {static_cast<std::int32_t>(L / 8), static_cast<std::int32_t>(L / 2)}};
    for (std::int32_t t = 4; t < 68; ++t) whitelist.push_back(t);
  }
  void restore() {
    std::memcpy(k.data(), k0.data(), k.size() * sizeof(float));
    std::memcpy(v.data(), v0.data(), v.size() * sizeof(float));
  }
  fairkv::kv_view<float> kv() { return fairkv::make_contiguous_view(k.data(), 1, kHeads, tokens, kDim); }
  fairkv::kv_view<float> vv() { return fairkv::make_contiguous_view(v.data(), 1, kHeads, tokens, kDim); }
};

layer& get_layer(std::int64_t L) {
  static layer l4k(4096), l32k(32768);
  return L == 4096 ? l4k : l32k;
}

void set_bytes(benchmark::State& state, std::int64_t L) {
  // Bandwidth floor: K read once for scoring, kept K and V read and written once.
  const double n_keep = static_cast<double>(fairkv::keep_budget(L, kRatio));
  const double bytes = static_cast<double>(kHeads * kDim * 4) * (static_cast<double>(L) + 4.0 * n_keep);
  state.counters["floor_GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

void baseline_nth_element(benchmark::State& state) {
  const std::int64_t L = state.range(0);
  layer& l = get_layer(L);
  const std::int64_t n_keep = fairkv::keep_budget(L, kRatio);
  std::vector<std::pair<float, std::int32_t>> pairs(static_cast<std::size_t>(L));
  std::vector<std::int32_t> kept(static_cast<std::size_t>(n_keep));
  for (auto _ : state) {
    state.PauseTiming();
    l.restore();
    state.ResumeTiming();
    for (std::int64_t h = 0; h < kHeads; ++h) {
      using rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      const Eigen::Map<const rm> keys(l.k.data() + h * L * kDim, L, kDim);
      const Eigen::VectorXf norms = keys.rowwise().norm();
      for (std::int64_t t = 0; t < L; ++t) pairs[t] = {-norms[t], static_cast<std::int32_t>(t)};
      std::nth_element(pairs.begin(), pairs.begin() + (n_keep - 1), pairs.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      for (std::int64_t j = 0; j < n_keep; ++j) kept[j] = pairs[j].second;
      std::sort(kept.begin(), kept.end());
      for (std::int64_t j = 0; j < n_keep; ++j) {
        std::memcpy(l.k.data() + (h * L + j) * kDim, l.k.data() + (h * L + kept[j]) * kDim, kDim * sizeof(float));
        std::memcpy(l.v.data() + (h * L + j) * kDim, l.v.data() + (h * L + kept[j]) * kDim, kDim * sizeof(float));
      }
    }
    benchmark::DoNotOptimize(l.k.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, L);
}

// Multiply-adds x 2 of the logits an attention scorer computes: `rows` query rows per KV head over L keys.
double logit_flops(std::int64_t rows, std::int64_t L) {
  return 2.0 * static_cast<double>(kHeads * rows * L * kDim);
}
template <class S>
constexpr std::int64_t logit_rows() {
  if constexpr (S::source == fairkv::score_source::window_attention) return kGroup * 16;
  else if constexpr (S::source == fairkv::score_source::last_attention) return kGroup;
  else return 0;
}

// The reference: per KV head, the logits of `rows` query rows over all L keys as one Eigen GEMM into a
// [rows, L] buffer (what an attention scorer cannot beat without skipping work).
void gemm_reference(benchmark::State& state, std::int64_t rows) {
  const std::int64_t L = state.range(0);
  layer& l = get_layer(L);
  using rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  rm logits(rows, L);
  for (auto _ : state) {
    for (std::int64_t h = 0; h < kHeads; ++h) {
      const Eigen::Map<const rm> q(l.q.data() + h * kGroup * 64 * kDim, rows, kDim);
      const Eigen::Map<const rm> keys(l.k.data() + h * L * kDim, L, kDim);
      logits.noalias() = q * keys.transpose();
      benchmark::DoNotOptimize(logits.data());
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(logit_flops(rows, L) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// One core's multiply-add peak per ISA (fma_peak.inc), over each attention tile's own packet, register count and
// primitives (its namespace in attention_gemm.hpp): the compile flags' tile, and each dispatched tile's ISA in its own
// target region.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // packet types (__m512, ...) as template arguments
#endif
namespace peak_compiled {
using namespace fairkv::cpu::detail::tile;
#include "fma_peak.inc"
}  // namespace peak_compiled
#if defined(FAIRKV_TILE_AVX2)
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX2)
namespace peak_avx2 {
using namespace fairkv::cpu::detail::tile_avx2;
#include "fma_peak.inc"
}  // namespace peak_avx2
FAIRKV_TARGET_POP
#endif
#if defined(FAIRKV_TILE_AVX512)
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX512)
namespace peak_avx512 {
using namespace fairkv::cpu::detail::tile_avx512;
#include "fma_peak.inc"
}  // namespace peak_avx512
FAIRKV_TARGET_POP
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

void fma_peak(benchmark::State& state, [[maybe_unused]] fairkv::cpu::detail::cpu_isa isa) {
  using fairkv::cpu::detail::cpu_isa;
  float (*steps)(std::int64_t, float, float) = peak_compiled::peak_steps;
  std::int64_t flops_per_step = peak_compiled::peak_flops_per_step;
#if defined(FAIRKV_TILE_AVX2)
  if (isa == cpu_isa::avx2) steps = peak_avx2::peak_steps, flops_per_step = peak_avx2::peak_flops_per_step;
#endif
#if defined(FAIRKV_TILE_AVX512)
  if (isa == cpu_isa::avx512) steps = peak_avx512::peak_steps, flops_per_step = peak_avx512::peak_flops_per_step;
#endif
  constexpr std::int64_t n = std::int64_t{1} << 16;
  float x = 0.999f, y = 1e-3f;
  for (auto _ : state) {
    benchmark::DoNotOptimize(x);  // the operands are not constants to the compiler
    benchmark::DoNotOptimize(y);
    benchmark::DoNotOptimize(steps(n, x, y));
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(n * flops_per_step) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

using fairkv_testing::thread_executor;

const thread_executor& pool_of(int threads) {
  static const thread_executor one(1), two(2);
  return threads == 1 ? one : two;
}

// threads 0: the serial overloads; 1 or 2: the executor overloads with that pool. tile >= 0 pins the attention
// tile (cpu_isa.hpp) for the run; -1 runs what dispatch picks.
template <class S, class Sel, class A>
void fairkv_policy(benchmark::State& state, S scorer, int threads, int tile = -1) {
  struct pin {
    explicit pin(int t) { fairkv::cpu::detail::pinned_isa.store(t); }
    ~pin() { fairkv::cpu::detail::pinned_isa.store(-1); }
  } pinned(tile);
  const std::int64_t L = state.range(0);
  layer& l = get_layer(L);
  using P = fairkv::policy<S, Sel, A>;
  fairkv::layer_inputs<fairkv::kv_view<const float>> in{l.kv().as_const()};
  if constexpr (S::source == fairkv::score_source::observed_attention) {
    in.attention_column_sums = l.colsum.data();
    in.attention_q_heads = kHeads * kGroup;
  } else if constexpr (fairkv::is_attention_source(S::source)) {
    in.queries = fairkv::make_contiguous_view(l.q.data(), 1, kHeads * kGroup, 64, kDim).as_const();
  }
  const std::vector<fairkv::segment> segs = A::uses_segments ? l.segments : std::vector<fairkv::segment>{};
  const std::vector<std::int32_t> wl = A::uses_whitelist ? l.whitelist : std::vector<std::int32_t>{};
  // Workspace and plan allocated once, as an engine would.
  std::size_t bytes = 0;
  const fairkv::result q = threads == 0
                               ? fairkv::cpu::plan(nullptr, bytes, P{scorer, {}, {}}, in, segs, wl, kRatio,
                                                   fairkv::keep_plan_view{})
                               : fairkv::cpu::plan(pool_of(threads), nullptr, bytes, P{scorer, {}, {}}, in, segs, wl,
                                                   kRatio, fairkv::keep_plan_view{});
  if (!q) {
    state.SkipWithError("workspace query failed");
    return;
  }
  std::vector<std::byte> ws(bytes);
  fairkv::keep_plan plan;
  plan.resize(1, kHeads, L);
  for (auto _ : state) {
    state.PauseTiming();
    l.restore();
    state.ResumeTiming();
    const fairkv::result r =
        threads == 0 ? fairkv::cpu::plan(ws.data(), bytes, P{scorer, {}, {}}, in, segs, wl, kRatio, plan.view())
                     : fairkv::cpu::plan(pool_of(threads), ws.data(), bytes, P{scorer, {}, {}}, in, segs, wl, kRatio,
                                         plan.view());
    if (!r) {
      state.SkipWithError(r.message());
      return;
    }
    const fairkv::result c = threads == 0 ? fairkv::cpu::compact(plan.view(), l.kv(), l.vv())
                                          : fairkv::cpu::compact(pool_of(threads), plan.view(), l.kv(), l.vv());
    if (!c) {
      state.SkipWithError("compact failed");
      return;
    }
    benchmark::DoNotOptimize(l.k.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, L);
  if constexpr (logit_rows<S>() > 0)
    state.counters["GFLOP/s"] =
        benchmark::Counter(logit_flops(logit_rows<S>(), L) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class S, class Sel, class A>
void add(const char* name, S scorer = {}, bool threaded = false) {
  for (int threads : {0, 1, 2}) {
    if (threads > 0 && !threaded) break;
    const std::string full = threads == 0 ? std::string(name) : std::string(name) + "@" + std::to_string(threads) + "t";
    benchmark::RegisterBenchmark(full.c_str(),
                                 [scorer, threads](benchmark::State& st) { fairkv_policy<S, Sel, A>(st, scorer, threads); })
        ->Arg(4096)
        ->Arg(32768)
        ->Unit(benchmark::kMillisecond);
  }
}

// The benchmark label of a pinned tile: the flags' own is `compiled` whatever extension it is, so the labels in
// docs/benchmarks.md stay the same across builds.
const char* tile_name(fairkv::cpu::detail::cpu_isa isa) {
  return isa == fairkv::cpu::detail::cpu_isa::compiled ? "compiled" : fairkv::cpu::detail::isa_name(isa);
}

// The attention tiles a pin can run in this build on this CPU: the flags' own, and each dispatched one wider than it.
std::vector<fairkv::cpu::detail::cpu_isa> runnable_tiles() {
  using fairkv::cpu::detail::cpu_isa;
  std::vector<cpu_isa> out;
  for (const cpu_isa isa : {cpu_isa::compiled, cpu_isa::avx2, cpu_isa::avx512}) {
    fairkv::cpu::detail::pinned_isa.store(static_cast<int>(isa));
    const bool runs = fairkv::cpu::detail::active_isa() == isa;
    fairkv::cpu::detail::pinned_isa.store(-1);
    if (isa == cpu_isa::compiled || (runs && isa > fairkv::cpu::detail::compiled_isa)) out.push_back(isa);
  }
  return out;
}

// name#compiled, name#avx2, name#avx512: the policy with each attention tile this build and CPU can run, pinned, so
// the tiles compare with each other and with the baseline in one run (the dispatched one is `name` itself).
template <class S, class Sel, class A>
void add_tiles(const char* name) {
  for (const auto isa : runnable_tiles()) {
    const std::string full = std::string(name) + "#" + tile_name(isa);
    benchmark::RegisterBenchmark(full.c_str(),
                                 [isa](benchmark::State& st) { fairkv_policy<S, Sel, A>(st, S{}, 0, static_cast<int>(isa)); })
        ->Arg(4096)
        ->Arg(32768)
        ->Unit(benchmark::kMillisecond);
  }
}

// The console output plus, at the end, each threaded variant's time over its serial run's (medians when
// repeated, else the single run).
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      const bool aggregate = r.run_type == Run::RT_Aggregate;
      if (aggregate && r.aggregate_name != "median") continue;
      if (!aggregate && r.repetitions > 1) continue;
      const std::string name = r.run_name.str();
      times_[name] = r.GetAdjustedRealTime();
      constexpr std::string_view peak_prefix = "fma_peak#";
      const auto rate = r.counters.find("GFLOP/s");
      if (name.rfind(peak_prefix, 0) == 0 && rate != r.counters.end())
        peaks_[name.substr(peak_prefix.size())] = rate->second.value;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    bool header = false;
    for (const auto& [name, t] : times_) {
      const std::size_t at = name.find('@');
      if (at == std::string::npos) continue;
      const std::size_t slash = name.find('/', at);
      const std::string serial = name.substr(0, at) + (slash == std::string::npos ? "" : name.substr(slash));
      const auto it = times_.find(serial);
      if (it == times_.end()) continue;
      if (!header) std::printf("\nthreaded variant / serial, same run:\n");
      header = true;
      std::printf("  %-40s %7.3f ms  x%.2f of serial (%.3f ms)\n", name.c_str(), t, t / it->second, it->second);
    }
    // Attention scorers: time over the baseline's, and the logits' rate over the same-shape GEMM's.
    header = false;
    for (const auto& [name, t] : times_) {
      const bool snap = name.rfind("snapkv16/", 0) == 0, tova = name.rfind("tova/", 0) == 0;
      if ((!snap && !tova) || name.find('@') != std::string::npos) continue;
      const std::string arg = name.substr(name.rfind('/'));
      const auto base = times_.find("baseline_nth_element" + arg);
      const auto gemm = times_.find(std::string(snap ? "gemm_reference/snapkv16" : "gemm_reference/tova") + arg);
      if (base == times_.end()) continue;
      if (!header)
        std::printf("\nattention scorers, same run: x baseline; logits rate / same-shape GEMM's rate; what the logits "
                    "alone take at the tile's FMA peak (fma_peak#tile), a floor on one thread:\n");
      header = true;
      std::printf("  %-40s %8.3f ms  x%.2f of baseline", name.c_str(), t, t / base->second);
      if (gemm != times_.end()) std::printf("  %5.1f%% of GEMM (GEMM %.3f ms)", 100.0 * gemm->second / t, gemm->second);
      std::printf("\n");
      // The tile that ran: the pinned one after '#', else the one dispatch picks.
      const std::size_t hash = name.find('#');
      const std::string tile = hash == std::string::npos
                                   ? tile_name(fairkv::cpu::detail::active_isa())
                                   : name.substr(hash + 1, name.rfind('/') - hash - 1);
      const auto peak = peaks_.find(tile);
      if (peak == peaks_.end()) continue;
      const double flops = logit_flops(snap ? kGroup * 16 : kGroup, std::stoll(arg.substr(1)));
      const double at_peak_ms = flops / (peak->second * 1e9) * 1e3;
      std::printf("      %s FMA peak %.1f GFLOP/s: the logits alone at it take x%.2f of baseline", tile.c_str(),
                  peak->second, at_peak_ms / base->second);
      // Plus what every policy pays after scoring: h2o_colsum's plan + compact, whose scores are read from column sums.
      const auto rest = times_.find("h2o_colsum/uniform" + arg);
      if (rest != times_.end())
        std::printf(", with h2o_colsum's selection and compaction x%.2f", (at_peak_ms + rest->second) / base->second);
      std::printf("; this plan + compact runs them at %.1f%% of it\n", 100.0 * at_peak_ms / t);
    }
  }

 private:
  std::map<std::string, double> times_;
  std::map<std::string, double> peaks_;  // fma_peak's GFLOP/s by tile label
};

void register_all() {
  using namespace fairkv;
  using ph = selectors::per_head;
  for (const auto isa : runnable_tiles())
    benchmark::RegisterBenchmark((std::string("fma_peak#") + tile_name(isa)).c_str(),
                                 [isa](benchmark::State& st) { fma_peak(st, isa); })
        ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("baseline_nth_element", baseline_nth_element)->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);
  add<scorers::knorm, ph, allocators::uniform>("knorm/uniform", {}, true);
  add<scorers::knorm, ph, allocators::whitelist>("knorm/whitelist");
  add<scorers::knorm, ph, allocators::fair>("knorm/fair", {}, true);
  add<scorers::knorm, ph, allocators::fair_with_whitelist>("knorm/fair_with_whitelist");
  add<scorers::knorm, ph, allocators::debias>("knorm/debias0.5", {});
  add<scorers::knorm, selectors::union_heads, allocators::uniform>("knorm/union/uniform");
  add<scorers::knorm, selectors::head_adaptive, allocators::uniform>("knorm/head_adaptive/uniform");
  add<scorers::streaming_llm<>, ph, allocators::uniform>("streaming_llm/uniform");
  add<scorers::streaming_llm<>, ph, allocators::fair_with_whitelist>("streaming_llm/fair_with_whitelist");
  benchmark::RegisterBenchmark("gemm_reference/snapkv16", [](benchmark::State& st) { gemm_reference(st, kGroup * 16); })
      ->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gemm_reference/tova", [](benchmark::State& st) { gemm_reference(st, kGroup); })
      ->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);
  add<scorers::snapkv<16>, ph, allocators::uniform>("snapkv16/uniform", {}, true);
  add<scorers::snapkv<16>, ph, allocators::whitelist>("snapkv16/whitelist");
  add<scorers::tova, ph, allocators::uniform>("tova/uniform", {}, true);
  add<scorers::tova, ph, allocators::whitelist>("tova/whitelist");
  add_tiles<scorers::snapkv<16>, ph, allocators::uniform>("snapkv16/uniform");
  add_tiles<scorers::tova, ph, allocators::uniform>("tova/uniform");
  add<scorers::h2o, ph, allocators::uniform>("h2o_colsum/uniform", {}, true);
  add<scorers::h2o, ph, allocators::whitelist>("h2o_colsum/whitelist");
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("attention tile: %s (compile flags' tile: %s; FAIRKV_CPU_ISA caps it)\n",
              std::string(fairkv::cpu::attention_kernel_isa()).c_str(),
              fairkv::cpu::detail::isa_name(fairkv::cpu::detail::cpu_isa::compiled));
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
