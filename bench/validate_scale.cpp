// Validation at engine scale (issue 34): segments and paged page tables as the planners and compaction check
// them, against the pairwise definitions they replaced (re-stated here as the baseline, measured in the same run).
// Prints the median of R runs and the ratio to the baseline at the sizes where the baseline still finishes.
//
//   fairkv_bench_validate [ROUNDS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "median_time.hpp"

namespace {

using fairkv_bench::median_ms;

// The checks as they were: every pair.
bool pairwise_segments_ok(const std::vector<fairkv::segment>& s) {
  for (std::size_t i = 0; i < s.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (s[i].begin < s[j].end && s[j].begin < s[i].end) return false;
  return true;
}
bool pairwise_pages_ok(const std::vector<std::int32_t>& idx) {
  for (std::size_t i = 0; i < idx.size(); ++i)
    for (std::size_t j = i + 1; j < idx.size(); ++j)
      if (idx[i] == idx[j]) return false;
  return true;
}

volatile bool sink = false;

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::mt19937 rng(7);
  std::printf("| check | size | baseline (pairwise) ms | fairkv ms | baseline / fairkv |\n|---|---|---|---|---|\n");
  for (const int n : {8192, 32768, 100000}) {
    std::vector<fairkv::segment> s;
    for (int i = 0; i < n; ++i) s.push_back({2 * i, 2 * i + 2});
    std::shuffle(s.begin(), s.end(), rng);
    const double ours = median_ms(rounds, [&] { sink = fairkv::validate_segments(s, 2 * n).ok(); });
    const bool base_feasible = n <= 32768;
    const double base = base_feasible ? median_ms(1, [&] { sink = pairwise_segments_ok(s); }) : 0.0;
    if (base_feasible)
      std::printf("| segments, shuffled | %d | %.1f | %.3f | %.0f |\n", n, base, ours, base / ours);
    else
      std::printf("| segments, shuffled | %d | (not run) | %.3f | |\n", n, ours);
  }
  {  // sorted by begin, as every caller of ours passes them: one pass
    std::vector<fairkv::segment> s;
    for (int i = 0; i < 100000; ++i) s.push_back({2 * i, 2 * i + 2});
    const double ours = median_ms(rounds, [&] { sink = fairkv::validate_segments(s, 200000).ok(); });
    std::printf("| segments, sorted | 100000 | (not run) | %.3f | |\n", ours);
  }
  for (const std::int64_t pages : {12500, 100000, 1000000}) {
    std::vector<float> k(static_cast<std::size_t>(pages)), v(k.size());
    std::vector<std::int32_t> idx(static_cast<std::size_t>(pages));
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    const std::vector<std::int32_t> indptr = {0, static_cast<std::int32_t>(pages)}, last = {1};
    const auto view = fairkv::make_paged_view(fairkv::page_layout::nhd, k.data(), v.data(), pages, 1, 1, 1, 1,
                                              indptr.data(), idx.data(), last.data());
    const double ours = median_ms(rounds, [&] { sink = fairkv::validate(view, "view").ok(); });
    const bool base_feasible = pages <= 100000;
    const double base = base_feasible ? median_ms(1, [&] { sink = pairwise_pages_ok(idx); }) : 0.0;
    if (base_feasible)
      std::printf("| paged view, duplicate pages | %lld | %.1f | %.3f | %.0f |\n", static_cast<long long>(pages), base,
                  ours, base / ours);
    else
      std::printf("| paged view, duplicate pages | %lld | (not run) | %.3f | |\n", static_cast<long long>(pages), ours);
  }
  return 0;
}
