// An engine adds its own scorer (probe_alignment.hpp) and it composes with the shipped selectors and allocators
// like any built-in scorer. This is the CPU backend; main_cuda.cu runs the same plan through the CUDA backend.
#include <cstdio>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "probe_alignment.hpp"

int main() {
  std::vector<float> k = probe_example::keys(), v(k.size(), 0.f);
  using probe_example::head_dim;
  using probe_example::tokens;
  auto keys = fairkv::make_contiguous_view(k.data(), 1, 1, tokens, head_dim);
  fairkv::keep_plan plan;
  if (auto r = fairkv::cpu::plan(probe_example::make_policy(), fairkv::keys_only(keys), probe_example::segments, {},
                                 probe_example::ratio, plan);
      !r) {
    std::fprintf(stderr, "fairkv: %s\n", r.message());
    return 1;
  }
  std::printf("kept (probe = +y, fair over two halves):");
  for (int t : plan.kept(0, 0)) std::printf(" %d", t);
  std::printf("\n");
  if (plan.kept(0, 0) != probe_example::expected_kept) {
    std::fprintf(stderr, "unexpected kept set\n");
    return 1;
  }
  const std::vector<float> before = k;
  if (auto r = fairkv::cpu::compact(plan.view(), keys, fairkv::make_contiguous_view(v.data(), 1, 1, tokens, head_dim));
      !r) {
    std::fprintf(stderr, "fairkv: %s\n", r.message());
    return 1;
  }
  if (!probe_example::compacted_as_expected(before, k)) {
    std::fprintf(stderr, "compaction did not move the kept keys to the front\n");
    return 1;
  }
  return 0;
}
