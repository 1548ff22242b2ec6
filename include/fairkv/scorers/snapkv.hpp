// SnapKV (kvpress SnapKVPress): attention of the last `window` queries to the earlier keys (causal softmax over
// all keys, scale 1/sqrt(d)), mean over the window, avg-pool (kernel, zero padding kernel/2, divisor kernel),
// mean over the GQA group; window tokens score max + 1 so they are always kept.
// kvpress's default window is 64; the paper uses 16: `snapkv<16>` or set `window` at run time.
#pragma once

#include <cstdint>

#include "fairkv/scorer.hpp"

namespace fairkv::scorers {

template <int Window = 64, int Kernel = 5>
struct snapkv {
  static_assert(Window >= 1, "snapkv<Window, Kernel>: Window must be at least 1");
  static_assert(Kernel >= 1 && Kernel % 2 == 1, "snapkv<Window, Kernel>: Kernel must be odd and positive");
  static constexpr score_source source = score_source::window_attention;
  static constexpr const char* name = "snapkv";

  std::int32_t window = Window;
  std::int32_t kernel = Kernel;
};
static_assert(Scorer<snapkv<>>);

}  // namespace fairkv::scorers
