// Which x86 vector kernels the attention scorers run. fairkv is header-only, so its kernels are compiled
// with the engine's flags, and most engines, Python extensions and distribution packages build for baseline x86-64
// (SSE2): there SnapKV's scoring ran at a third of the speed the same CPU gives with AVX2 and a quarter of AVX-512's.
// On x86-64 with GCC or clang the attention kernel is therefore also compiled for AVX2 + FMA and for AVX-512 (each
// under its own target attribute, attention_gemm.hpp) and the widest one the CPU and the OS support runs; the
// compiled flags' own kernel is the floor, so a -march=native build runs exactly what it ran before.
//
// FAIRKV_CPU_ISA in the environment caps the choice, read once per process: `avx512`, `avx2`, or `none` (only the
// kernel of the compile flags; also what any other value means). fairkv::cpu::attention_kernel_isa() says which
// kernel runs. Defining FAIRKV_NO_ISA_DISPATCH before including fairkv removes the other kernels altogether. nvcc,
// MSVC and non-x86 targets never dispatch.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstddef>
#include <cstdlib>

#if !defined(FAIRKV_NO_ISA_DISPATCH) && !defined(__CUDACC__) && !defined(_MSC_VER) && \
    (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define FAIRKV_ISA_DISPATCH 1
#endif

#if defined(FAIRKV_ISA_DISPATCH)
// The targets of the dispatched kernels, and a region of code compiled for one of them: every function between
// FAIRKV_TARGET_PUSH(t) and FAIRKV_TARGET_POP, lambdas included (they are functions too and would not inherit an
// enclosing function's target attribute).
#define FAIRKV_TARGET_AVX2 "avx2,fma"
#define FAIRKV_TARGET_AVX512 "avx512f,avx2,fma"
#define FAIRKV_PRAGMA(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define FAIRKV_TARGET_PUSH(t) FAIRKV_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define FAIRKV_TARGET_POP FAIRKV_PRAGMA(clang attribute pop)
#else
#define FAIRKV_TARGET_PUSH(t) FAIRKV_PRAGMA(GCC push_options) FAIRKV_PRAGMA(GCC target(t))
#define FAIRKV_TARGET_POP FAIRKV_PRAGMA(GCC pop_options)
#endif
#endif

namespace fairkv::cpu::detail {

enum class cpu_isa : int { compiled = 0, avx2 = 1, avx512 = 2 };

// What the compile flags already guarantee of the CPU: a dispatched kernel at least that wide always runs.
inline constexpr cpu_isa compiled_isa =
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
    cpu_isa::avx512;
#elif defined(__AVX2__) && defined(__FMA__)
    cpu_isa::avx2;
#else
    cpu_isa::compiled;
#endif

// The widest kernel this CPU and OS can run (libgcc's and compiler-rt's cpu checks include the OS's XSAVE state).
[[nodiscard]] inline cpu_isa detected_isa() noexcept {
#if defined(FAIRKV_ISA_DISPATCH)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return cpu_isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return cpu_isa::avx2;
#endif
  return cpu_isa::compiled;
}

// A FAIRKV_CPU_ISA value as a cap, case-insensitive: unset or empty, no cap; `avx512`, `avx2`, `none`; anything
// else is read as `none`, so a mistyped cap never runs a wider kernel than the one asked for.
[[nodiscard]] inline cpu_isa parse_isa_cap(const char* s) noexcept {
  if (s == nullptr || *s == '\0') return cpu_isa::avx512;
  const auto is = [s](const char* name) {
    std::size_t i = 0;
    for (; s[i] != '\0' && name[i] != '\0'; ++i)
      if (std::tolower(static_cast<unsigned char>(s[i])) != name[i]) return false;
    return s[i] == '\0' && name[i] == '\0';
  };
  if (is("avx512")) return cpu_isa::avx512;
  if (is("avx2")) return cpu_isa::avx2;
  return cpu_isa::compiled;
}

[[nodiscard]] inline cpu_isa requested_isa() noexcept {
  return parse_isa_cap(std::getenv("FAIRKV_CPU_ISA"));  // NOLINT(concurrency-mt-unsafe): read once, below
}

// Tests pin a kernel here (-1: none pinned); the pin is still capped by what the CPU supports.
inline std::atomic<int> pinned_isa{-1};

// The kernel the attention scorers run now.
[[nodiscard]] inline cpu_isa active_isa() noexcept {
  static const cpu_isa detected = detected_isa();
  static const cpu_isa requested = requested_isa();
  const int pin = pinned_isa.load(std::memory_order_relaxed);
  const int cap = pin >= 0 ? pin : static_cast<int>(requested);
  const int runnable = std::min(static_cast<int>(detected), cap);
  return static_cast<cpu_isa>(std::max(runnable, static_cast<int>(compiled_isa)));
}

// What a kernel runs, by name: the dispatched ones by their ISA, the flags' own by the widest vector instructions
// they enable.
[[nodiscard]] constexpr const char* isa_name(cpu_isa isa) noexcept {
  switch (isa) {
    case cpu_isa::avx512: return "avx512";
    case cpu_isa::avx2: return "avx2";
    default: break;
  }
#if defined(__CUDACC__) || !(defined(__GNUC__) || defined(__clang__))
  return "scalar";  // simd_portable.hpp: no vector extensions here
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX__)
  return "avx";
#elif defined(__SSE2__)
  return "sse2";
#elif defined(__ARM_NEON)
  return "neon";
#else
  return "vector";
#endif
}

}  // namespace fairkv::cpu::detail
