// Which instruction set the CPU backend's attention kernel (SnapKV, TOVA, H2O from queries) runs in this process:
// the widest of AVX-512, AVX2 + FMA and the compile flags' own that the CPU supports, capped by FAIRKV_CPU_ISA
// (docs/integration.md, "Compile flags"). For an engine's logs, and to see what a cap did.
#pragma once

#include <string_view>

#include "fairkv/cpu/detail/cpu_isa.hpp"

namespace fairkv::cpu {

// "avx512", "avx2", or the compile flags' vector extension ("avx", "sse2", "neon", ...; "scalar" without one).
[[nodiscard]] inline std::string_view attention_kernel_isa() noexcept {
  return detail::isa_name(detail::active_isa());
}

}  // namespace fairkv::cpu
