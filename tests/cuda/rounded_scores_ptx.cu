// Compiled to PTX with exactly the flags an engine gets from fairkv::cuda (nvcc's default -fmad=true), and read by
// check_rounded_ptx.cmake: the scores the CPU must reproduce bit for bit contain no fused multiply-add and no
// product ptxas could still fuse (plain mul.f32 / add.f32), while the control, the same sum of squares written
// plainly, must be fused here, or the check could not tell.
#include <cstdint>

#include "fairkv/detail/paper_spans.hpp"
#include "fairkv/scorers/knorm.hpp"

extern "C" __global__ void fairkv_probe_knorm(const float* k, std::int64_t n, float* out) {
  *out = fairkv::scorers::knorm{}(fairkv::key_row<float, true>{k, n, 1}, fairkv::token_info{0, n, 0, 0});
}

extern "C" __global__ void fairkv_probe_linspace(std::int64_t i, std::int64_t n, float* out) {
  *out = fairkv::detail::linspace_01_09(i, n);
}

extern "C" __global__ void fairkv_probe_control(const float* k, std::int64_t n, float* out) {
  float s = 0.f;
  for (std::int64_t i = 0; i < n; ++i) s += k[i] * k[i];
  *out = s;
}
