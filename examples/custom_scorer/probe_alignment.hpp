// The custom scorer of this example and its toy problem, shared by the CPU program (main.cpp) and the CUDA one
// (main_cuda.cu), which must keep the same tokens.
//
// A user scorer is a plain struct that satisfies fairkv::Scorer: a name, a score source it computes itself (keys
// here; the attention sources are reserved for the built-in SnapKV, TOVA and H2O), and a call operator. The CUDA
// backend calls that operator inside its scoring kernel, so it must be marked FAIRKV_HOST_DEVICE (= __host__
// __device__ under nvcc, nothing for a host compiler): without it the CPU build still works, but nvcc refuses
// the call from device code. Everything it calls must be device-callable too (constexpr or FAIRKV_HOST_DEVICE
// functions; key_row's operator[] is). For the GPU to keep exactly the CPU's tokens, the float arithmetic must round
// alike on both: nvcc fuses a * b + c into one multiply-add by default, which a baseline host build does not, so
// products that feed a sum go through fairkv::mul_add_rounded (the same expression, never fused on the device).
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "fairkv/allocators/fair.hpp"
#include "fairkv/config.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/rounded_math.hpp"
#include "fairkv/scorer.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/selectors/per_head.hpp"

// Keeps tokens whose key points along a direction the engine cares about (say, a probe vector).
struct probe_alignment {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "probe_alignment";
  float probe_x = 1.0f, probe_y = 0.0f;  // runtime parameters live in the aggregate

  // A template on the row type: the backends pass key_row<T, Contiguous> for float, half and bfloat16 caches.
  template <class Row>
  FAIRKV_HOST_DEVICE float operator()(const Row& k, const fairkv::token_info&) const noexcept {
    return fairkv::mul_add_rounded(k[0], probe_x, k[1] * probe_y);  // k[0] * probe_x + k[1] * probe_y
  }
};
static_assert(fairkv::Scorer<probe_alignment>);

namespace probe_example {

inline constexpr int tokens = 12, head_dim = 2;

// [1 batch, 1 head, 12 tokens, head_dim 2]: key t points at angle 0.4 * t radians.
inline std::vector<float> keys() {
  std::vector<float> k(tokens * head_dim);
  for (int t = 0; t < tokens; ++t) {
    k[2 * t] = std::cos(0.4f * static_cast<float>(t));
    k[2 * t + 1] = std::sin(0.4f * static_cast<float>(t));
  }
  return k;
}

inline const std::vector<fairkv::segment> segments{{0, 6}, {6, 12}};
inline constexpr double ratio = 0.5;

// fair keeps the first 4 tokens (attention sinks) by default; with 12 toy tokens they would fill the first half's
// share, so they are off here to let the kept set show the scorer's own choice.
using policy = fairkv::policy<probe_alignment, fairkv::selectors::per_head, fairkv::allocators::fair>;
inline constexpr policy make_policy() { return {{0.f, 1.f}, {}, {.protect = {.n_sink = 0}}}; }

// Probe = +y, so the score is sin(0.4 t): the first half's best are 3, 4, 5 (0.93, 1.0, 0.91), the second half's
// 6, 7, 8 (0.68, 0.34, -0.06).
inline const std::vector<int> expected_kept{3, 4, 5, 6, 7, 8};

// After compaction, key row j holds what row expected_kept[j] held before.
inline bool compacted_as_expected(const std::vector<float>& before, const std::vector<float>& after) {
  for (std::size_t j = 0; j < expected_kept.size(); ++j)
    for (int d = 0; d < head_dim; ++d)
      if (after[j * head_dim + d] != before[static_cast<std::size_t>(expected_kept[j]) * head_dim + d]) return false;
  return true;
}

}  // namespace probe_example
