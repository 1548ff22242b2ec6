// The packet operations attention_tile.inc uses, for the kernel of the compile flags: GCC / clang vector extensions
// as wide as the flags allow (the compiler lowers them to SSE, AVX, AVX-512, NEON, ... as the target has them), or
// one float per packet where the compiler has no vector extensions. Same names and semantics as simd_x86.hpp (and as
// Eigen's packet primitives, which live in Eigen::internal: not an API Eigen promises to keep). Every operation is
// plain C++ on the vector type, so the tile of the compile flags needs no intrinsics and no target attribute.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define FAIRKV_VECTOR_EXTENSIONS 1
#endif

#if defined(FAIRKV_VECTOR_EXTENSIONS)
#define FAIRKV_PORTABLE_INLINE inline __attribute__((always_inline))
#else
#define FAIRKV_PORTABLE_INLINE inline
#endif

namespace fairkv::cpu::detail::portable {

template <class Packet>
struct unpacket_traits;
template <class Packet, int N>
struct PacketBlock {
  Packet packet[N];
};

#if defined(FAIRKV_VECTOR_EXTENSIONS)
// Only the widths the flags support are declared: a wider vector type in a signature changes the ABI and GCC warns.
typedef float f32x4 __attribute__((vector_size(16)));
typedef std::uint32_t u32x4 __attribute__((vector_size(16)));
template <>
struct unpacket_traits<f32x4> {
  static constexpr int size = 4;
  using half = f32x4;
  using integer_packet = u32x4;
};
#if defined(__AVX__)
typedef float f32x8 __attribute__((vector_size(32)));
typedef std::uint32_t u32x8 __attribute__((vector_size(32)));
template <>
struct unpacket_traits<f32x8> {
  static constexpr int size = 8;
  using half = f32x4;
  using integer_packet = u32x8;
};
#endif
#if defined(__AVX512F__)
typedef float f32x16 __attribute__((vector_size(64)));
typedef std::uint32_t u32x16 __attribute__((vector_size(64)));
template <>
struct unpacket_traits<f32x16> {
  static constexpr int size = 16;
  using half = f32x8;
  using integer_packet = u32x16;
};
#endif

// The widest packet of the flags, and the vector register count the tile's blocking assumes.
#if defined(__AVX512F__)
using widest = f32x16;
inline constexpr int vector_registers = 32;
#elif defined(__AVX__)
using widest = f32x8;
inline constexpr int vector_registers = 16;
#elif defined(__aarch64__)
using widest = f32x4;
inline constexpr int vector_registers = 32;
#else
using widest = f32x4;
inline constexpr int vector_registers = 16;
#endif

// Whether a * b + c becomes one instruction: the target has one and the compiler contracts the expression (GCC and
// clang do by default in their GNU modes; where they do not, the tile is only slower, never different in kind).
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__)
inline constexpr bool contracts_madd = true;
#else
inline constexpr bool contracts_madd = false;
#endif

template <class P>
inline constexpr bool is_vector = !std::is_arithmetic_v<P>;

// Lane masks: an integer vector whose true lanes have every bit set, as the comparisons give them.
template <class P>
using mask_of = decltype(P{} < P{});

#else
using widest = float;
inline constexpr int vector_registers = 16;
inline constexpr bool contracts_madd = false;
template <class P>
inline constexpr bool is_vector = false;
#endif

// One float per packet: the scalar form of every primitive (also what a compiler without vector extensions runs).
template <>
struct unpacket_traits<float> {
  static constexpr int size = 1;
  using half = float;
  using integer_packet = std::uint32_t;
};

template <class P>
inline constexpr int lanes_of = unpacket_traits<P>::size;

// Broadcast. x - 0 keeps -0.f (0 + x would not) and NaN payloads.
template <class P, class T>
FAIRKV_PORTABLE_INLINE P pset1(T x) {
  if constexpr (is_vector<P>)
    return static_cast<std::remove_cvref_t<decltype(P{}[0])>>(x) - P{};
  else
    return static_cast<P>(x);
}
template <class P>
FAIRKV_PORTABLE_INLINE P ploadu(const float* p) {
  P r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
template <class P>
FAIRKV_PORTABLE_INLINE void pstoreu(float* p, const P& x) {
  std::memcpy(p, &x, sizeof x);
}
template <class To, class From>
FAIRKV_PORTABLE_INLINE To preinterpret(const From& x) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}

template <class P>
FAIRKV_PORTABLE_INLINE P padd(const P& a, const P& b) {
  return a + b;
}
template <class P>
FAIRKV_PORTABLE_INLINE P psub(const P& a, const P& b) {
  return a - b;
}
template <class P>
FAIRKV_PORTABLE_INLINE P pmul(const P& a, const P& b) {
  return a * b;
}
template <class P>
FAIRKV_PORTABLE_INLINE P pdiv(const P& a, const P& b) {
  return a / b;
}
template <class P>
FAIRKV_PORTABLE_INLINE P pmadd(const P& a, const P& b, const P& c) {
  return a * b + c;
}

// pselect(m, a, b): a where m's lane is set (m from pcmp_*), b elsewhere.
template <class P>
FAIRKV_PORTABLE_INLINE P pselect(const P& m, const P& a, const P& b) {
  if constexpr (is_vector<P>) {
#if defined(FAIRKV_VECTOR_EXTENSIONS)
    using M = mask_of<P>;
    const M mi = preinterpret<M>(m);
    return preinterpret<P>((mi & preinterpret<M>(a)) | (~mi & preinterpret<M>(b)));
#endif
  } else {
    return preinterpret<std::uint32_t>(m) != 0 ? a : b;
  }
}
template <class P>
FAIRKV_PORTABLE_INLINE P pcmp_lt(const P& a, const P& b) {
  if constexpr (is_vector<P>)
    return preinterpret<P>(a < b);
  else
    return preinterpret<P>(a < b ? ~std::uint32_t{0} : std::uint32_t{0});
}
template <class P>
FAIRKV_PORTABLE_INLINE P pcmp_eq(const P& a, const P& b) {
  if constexpr (is_vector<P>)
    return preinterpret<P>(a == b);
  else
    return preinterpret<P>(a == b ? ~std::uint32_t{0} : std::uint32_t{0});
}
// A NaN in either argument gives the first, as x86's maxps with its operands swapped (the tile clamps and keeps a
// NaN logit NaN through it).
template <class P>
FAIRKV_PORTABLE_INLINE P pmax(const P& a, const P& b) {
  return pselect(pcmp_lt(a, b), b, a);
}
template <int N, class PI>
FAIRKV_PORTABLE_INLINE PI plogical_shift_left(const PI& x) {
  return x << N;
}
// Lane sum, pairwise (as the x86 packets reduce).
template <class P>
FAIRKV_PORTABLE_INLINE float predux(const P& x) {
  constexpr int W = lanes_of<P>;
  float v[W];
  pstoreu(v, x);
  for (int w = W / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) v[i] += v[i + w];
  return v[0];
}
// Row i, lane j becomes row j, lane i: through memory, which compilers turn into shuffles where they can; the tile
// transposes once per W tokens' sums.
template <class P, int N>
FAIRKV_PORTABLE_INLINE void ptranspose(PacketBlock<P, N>& b) {
  static_assert(N == lanes_of<P>, "a square block");
  float m[N][N];
  for (int i = 0; i < N; ++i) pstoreu(m[i], b.packet[i]);
  for (int j = 0; j < N; ++j) {
    float col[N];
    for (int i = 0; i < N; ++i) col[i] = m[i][j];
    b.packet[j] = ploadu<P>(col);
  }
}
// Only one-float packets call it: the tile has its own exponential for wider ones.
FAIRKV_PORTABLE_INLINE float pexp(float x) { return std::exp(x); }

}  // namespace fairkv::cpu::detail::portable

#undef FAIRKV_PORTABLE_INLINE
