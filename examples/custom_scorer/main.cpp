// An engine adds its own scorer: a plain struct that satisfies fairkv::Scorer. This one keeps tokens whose
// key points along a direction the engine cares about (say, a probe vector), and it composes with the shipped
// selectors and allocators like any built-in scorer.
#include <cmath>
#include <cstdio>
#include <vector>

#include "fairkv/fairkv.hpp"

struct probe_alignment {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "probe_alignment";
  float probe_x = 1.0f, probe_y = 0.0f;  // runtime parameters live in the aggregate

  template <class Row>
  float operator()(const Row& k, const fairkv::token_info&) const noexcept {
    return k[0] * probe_x + k[1] * probe_y;
  }
};
static_assert(fairkv::Scorer<probe_alignment>);

int main() {
  // 1 head, 12 tokens, head_dim 2: key t points at angle 0.4 * t radians.
  std::vector<float> k(12 * 2), v(12 * 2, 0.f);
  for (int t = 0; t < 12; ++t) {
    k[2 * t] = std::cos(0.4f * static_cast<float>(t));
    k[2 * t + 1] = std::sin(0.4f * static_cast<float>(t));
  }
  auto keys = fairkv::make_contiguous_view(k.data(), 1, 1, 12, 2);
  const std::vector<fairkv::segment> segments{{0, 6}, {6, 12}};
  // fair keeps the first 4 tokens (attention sinks) by default; with 12 toy tokens they would fill the first
  // half's share, so they are off here to let the kept set show the scorer's own choice.
  fairkv::policy<probe_alignment, fairkv::selectors::per_head, fairkv::allocators::fair> pol{
      {0.f, 1.f}, {}, {.protect = {.n_sink = 0}}};
  fairkv::keep_plan plan;
  if (auto r = fairkv::cpu::plan(pol, fairkv::keys_only(keys), segments, {}, 0.5, plan); !r) {
    std::fprintf(stderr, "fairkv: %s\n", r.message());
    return 1;
  }
  std::printf("kept (probe = +y, fair over two halves):");
  for (int t : plan.kept(0, 0)) std::printf(" %d", t);
  std::printf("\n");
  // sin(0.4 t): the first half's best are 3, 4, 5 (0.93, 1.0, 0.91), the second half's 6, 7, 8 (0.68, 0.34, -0.06).
  const std::vector<int> expect{3, 4, 5, 6, 7, 8};
  if (plan.kept(0, 0) != expect) {
    std::fprintf(stderr, "unexpected kept set\n");
    return 1;
  }
  return fairkv::cpu::compact(plan.view(), keys, fairkv::make_contiguous_view(v.data(), 1, 1, 12, 2)) ? 0 : 1;
}
