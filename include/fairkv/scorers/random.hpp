// Random eviction (kvpress RandomPress): every token of every KV head gets an independent uniform score in [0, 1),
// so a plan keeps a uniformly random subset. The baseline a policy has to beat: under fair allocation it is what
// "same fraction of every segment, chosen blindly" gives.
//
// The score is a hash of (seed, batch, head, position), not a draw from a generator: a plan is reproducible,
// independent of the thread count and of how the backend walks the tokens, and the same on the CPU and the GPU
// (integer arithmetic only; the top 24 bits become an exact float). Ties (two tokens with the same 24 bits) are
// broken by the planners' total order, like any other score.
#pragma once

#include <cstdint>

#include "fairkv/scorer.hpp"

namespace fairkv::scorers {

struct random {
  static constexpr score_source source = score_source::position;
  static constexpr const char* name = "random";
  std::uint32_t seed = 0;

  [[nodiscard]] FAIRKV_HOST_DEVICE static constexpr std::uint64_t mix(std::uint64_t z) noexcept {
    z += 0x9E3779B97F4A7C15ull;  // splitmix64's finaliser: every input bit reaches every output bit
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr float operator()(const token_info& where) const noexcept {
    std::uint64_t h = mix(seed);
    h = mix(h ^ static_cast<std::uint64_t>(where.batch));
    h = mix(h ^ static_cast<std::uint64_t>(where.head));
    h = mix(h ^ static_cast<std::uint64_t>(where.index));
    return static_cast<float>(h >> 40) * 0x1.0p-24f;
  }
};
static_assert(Scorer<random>);

}  // namespace fairkv::scorers
