// a * b + c with the product rounded before the sum, on the host and on the device alike. Scores that the CPU and the
// CUDA backend must compute bit for bit (K-Norm's sums of squares, the paper's StreamingLLM ramps; a custom key or
// position scorer's own arithmetic, examples/custom_scorer) use it: nvcc
// contracts a * b + c into one fused multiply-add by default (-fmad=true), a baseline x86-64 host build never
// does, and the two round differently. The device side takes __fmul_rn / __fadd_rn, which nvcc never contracts,
// so an engine need not compile its own kernels with -fmad=false to get the CPU's scores. On the host the
// expression is the compiler's as written (a build with FMA and contraction enabled fuses it there too).
#pragma once

#include "fairkv/config.hpp"

namespace fairkv {

[[nodiscard]] FAIRKV_HOST_DEVICE inline float mul_add_rounded(float a, float b, float c) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

}  // namespace fairkv
