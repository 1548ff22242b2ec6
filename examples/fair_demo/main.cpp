// fairkv's smallest end-to-end demo: a synthetic layer cache whose system prompt has a defense segment and two
// instruction segments. The keys are built so that K-Norm prefers late tokens (as recency-biased policies do),
// so plain eviction empties the early defense first; fair eviction keeps every segment at the target ratio, and
// a whitelist pins the defense's key phrase on top. Prints what each segment kept.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"

namespace {

constexpr std::int64_t kHeads = 4, kTokens = 120, kDim = 32;
const std::vector<fairkv::segment> kSegments{{0, 40}, {40, 80}, {80, 120}};
const char* const kNames[] = {"defense", "instruction 1", "instruction 2"};

template <class Alloc>
void report(const char* label, const std::vector<float>& k0, const std::vector<std::int32_t>& whitelist, double ratio) {
  std::vector<float> k = k0, v(k0.size(), 0.f);  // the engine's buffers (copied per run only for the demo)
  auto keys = fairkv::make_contiguous_view(k.data(), 1, kHeads, kTokens, kDim);
  auto values = fairkv::make_contiguous_view(v.data(), 1, kHeads, kTokens, kDim);
  const auto segs = Alloc::uses_segments ? kSegments : std::vector<fairkv::segment>{};
  fairkv::keep_plan plan;
  fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, Alloc> pol{};
  if (auto r = fairkv::cpu::plan(pol, fairkv::keys_only(keys), segs, whitelist, ratio, plan); !r) {
    std::fprintf(stderr, "fairkv: %s\n", r.message());
    std::exit(1);
  }
  if (auto r = fairkv::cpu::compact(plan.view(), keys, values); !r) {
    std::fprintf(stderr, "fairkv: %s\n", r.message());
    std::exit(1);
  }
  std::printf("%-22s", label);
  for (std::size_t s = 0; s < kSegments.size(); ++s) {
    double kept = 0;
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (int t : plan.kept(0, h)) kept += (t >= kSegments[s].begin && t < kSegments[s].end) ? 1 : 0;
    std::printf("  %s %5.1f%%", kNames[s], 100.0 * kept / (kHeads * kSegments[s].size()));
  }
  bool phrase = true;
  for (std::int64_t h = 0; h < kHeads; ++h)
    for (int t = 2; t < 8; ++t) {
      const auto kept = plan.kept(0, h);
      phrase = phrase && std::find(kept.begin(), kept.end(), t) != kept.end();
    }
  std::printf("  defense phrase [2, 8) kept: %s\n", phrase ? "yes" : "no");
}

}  // namespace

int main(int argc, char** argv) {
  const double ratio = argc > 1 ? std::stod(argv[1]) : 0.6;
  std::mt19937 rng(42);
  std::normal_distribution<float> noise(0.f, 1.f);
  std::vector<float> k(static_cast<std::size_t>(kHeads * kTokens * kDim));
  for (std::int64_t h = 0; h < kHeads; ++h)
    for (std::int64_t t = 0; t < kTokens; ++t) {
      // Norm shrinks with position: K-Norm (keep small norms) then favours recent tokens.
      const float scale = 2.0f - 1.5f * static_cast<float>(t) / kTokens;
      for (std::int64_t d = 0; d < kDim; ++d) k[(h * kTokens + t) * kDim + d] = scale * noise(rng);
    }
  std::vector<std::int32_t> phrase;
  for (int t = 2; t < 8; ++t) phrase.push_back(t);
  std::printf("fairkv demo: 3 segments x 40 tokens, %lld KV heads, K-Norm, ratio %.2f (fraction evicted)\n",
              static_cast<long long>(kHeads), ratio);
  report<fairkv::allocators::uniform>("plain", k, {}, ratio);
  report<fairkv::allocators::whitelist>("whitelist", k, phrase, ratio);
  report<fairkv::allocators::fair>("fair", k, {}, ratio);
  report<fairkv::allocators::fair_with_whitelist>("fair + whitelist", k, phrase, ratio);
  return 0;
}
