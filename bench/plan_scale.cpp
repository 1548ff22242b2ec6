// Planning at engine scale (issue 34): fair eviction over many segments, and SnapKV with a pooling kernel as long
// as the sequence, each against the cheap case of the same planner on the same keys, measured in the same run: a
// ratio near 1 is a cost linear (or n log n) in the input, where a quadratic one grows with the size.
//
//   fairkv_bench_plan_scale [ROUNDS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "median_time.hpp"

namespace {

using fairkv_bench::median_ms;

std::vector<float> normal(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

template <class P>
void plan_or_die(const P& pol, const fairkv::layer_inputs<fairkv::kv_view<const float>>& in,
                 std::span<const fairkv::segment> segs, std::span<const std::int32_t> wl, fairkv::keep_plan& out) {
  if (const fairkv::result r = fairkv::cpu::plan(pol, in, segs, wl, 0.5, out); !r) {
    std::fprintf(stderr, "plan failed: %s\n", r.message());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fairkv;
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::mt19937 rng(7);
  std::printf("| case | size | baseline | baseline ms | fairkv ms | fairkv / baseline |\n|---|---|---|---|---|---|\n");
  // Fair eviction (K-norm, per head, 2 KV heads of dim 64) over S two-token segments with a whitelisted token in
  // every third, against the uniform allocator on the same keys with no segments.
  for (const int S : {8192, 32768, 100000}) {
    const std::int64_t L = 2 * S + 8, H = 2, D = 64;
    const std::vector<float> k = normal(static_cast<std::size_t>(H * L * D), rng);
    const kv_view<const float> keys{k.data(), 1, H, L, D, H * L * D, L * D, D, 1};
    const layer_inputs<kv_view<const float>> in{keys};
    std::vector<segment> segs;
    std::vector<std::int32_t> wl;
    for (int i = 0; i < S; ++i) segs.push_back({2 * i + 4, 2 * i + 6});
    std::shuffle(segs.begin(), segs.end(), rng);
    for (int i = 0; i < S; i += 3) wl.push_back(2 * i + 4);
    keep_plan out;
    const double base = median_ms(rounds, [&] {
      plan_or_die(policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, in, {}, {}, out);
    });
    const double fair = median_ms(rounds, [&] {
      plan_or_die(policy<scorers::knorm, selectors::per_head, allocators::fair_with_whitelist>{}, in, segs, wl, out);
    });
    std::printf("| fair_with_whitelist, %d segments | %lld tokens | uniform, no segments | %.2f | %.2f | %.2f |\n", S,
                static_cast<long long>(L), base, fair, fair / base);
  }
  // SnapKV (window 64, 12 query heads over 2 KV heads, dim 64) with its default pooling kernel 5 and a kernel
  // spanning the whole sequence.
  for (const std::int64_t L : {4096, 16384}) {
    const std::int64_t H = 2, Hq = 12, D = 64, W = 64;
    const std::vector<float> k = normal(static_cast<std::size_t>(H * L * D), rng),
                             q = normal(static_cast<std::size_t>(Hq * W * D), rng);
    layer_inputs<kv_view<const float>> in{{k.data(), 1, H, L, D, H * L * D, L * D, D, 1}};
    in.queries = kv_view<const float>{q.data(), 1, Hq, W, D, Hq * W * D, W * D, D, 1};
    keep_plan out;
    scorers::snapkv<> small{}, large{};
    large.kernel = static_cast<std::int32_t>(L + 1);
    const double base = median_ms(rounds, [&] {
      plan_or_die(policy<scorers::snapkv<>, selectors::per_head, allocators::uniform>{small, {}, {}}, in, {}, {}, out);
    });
    const double wide = median_ms(rounds, [&] {
      plan_or_die(policy<scorers::snapkv<>, selectors::per_head, allocators::uniform>{large, {}, {}}, in, {}, {}, out);
    });
    std::printf("| snapkv, kernel %d | %lld tokens | kernel 5 | %.2f | %.2f | %.2f |\n", large.kernel,
                static_cast<long long>(L), base, wide, wide / base);
  }
  return 0;
}
