// The packet operations attention_tile.inc uses, for the x86 kernels fairkv compiles beyond the engine's flags
// (cpu_isa.hpp): simd_portable.hpp's primitives (names and semantics as Eigen's packet primitives) over the intrinsic
// types, each function compiled for its ISA with a target attribute (GCC and clang): 128- and 256-bit packets for
// AVX2 + FMA, 512-bit ones for AVX-512F. Intrinsics rather than vector extensions here for the transposes, which
// the compilers do not find from portable code. Nothing here may run before cpu_isa.hpp has checked the CPU.
#pragma once

#include "fairkv/cpu/detail/cpu_isa.hpp"

#if defined(FAIRKV_ISA_DISPATCH)

#include <immintrin.h>

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // intrinsic vector types as template arguments
#endif

namespace fairkv::cpu::detail::x86 {

template <class Packet>
struct unpacket_traits;
template <class Packet, int N>
struct PacketBlock {
  Packet packet[N];
};
template <class Packet>
Packet pset1(float x);
template <class Packet>
Packet pset1(int x);
template <class Packet>
Packet ploadu(const float* p);
template <class To, class From>
To preinterpret(const From& x);

#define FAIRKV_X86_INLINE inline __attribute__((always_inline))

// ---- 128 and 256 bits: AVX2 + FMA ----
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX2)

template <>
struct unpacket_traits<__m128> {
  static constexpr int size = 4;
  using half = __m128;
  using integer_packet = __m128i;
};
template <>
struct unpacket_traits<__m256> {
  static constexpr int size = 8;
  using half = __m128;
  using integer_packet = __m256i;
};

template <>
FAIRKV_X86_INLINE __m128 pset1<__m128>(float x) { return _mm_set1_ps(x); }
template <>
FAIRKV_X86_INLINE __m256 pset1<__m256>(float x) { return _mm256_set1_ps(x); }
template <>
FAIRKV_X86_INLINE __m128i pset1<__m128i>(int x) { return _mm_set1_epi32(x); }
template <>
FAIRKV_X86_INLINE __m256i pset1<__m256i>(int x) { return _mm256_set1_epi32(x); }
template <>
FAIRKV_X86_INLINE __m128 ploadu<__m128>(const float* p) { return _mm_loadu_ps(p); }
template <>
FAIRKV_X86_INLINE __m256 ploadu<__m256>(const float* p) { return _mm256_loadu_ps(p); }
FAIRKV_X86_INLINE void pstoreu(float* p, __m128 x) { _mm_storeu_ps(p, x); }
FAIRKV_X86_INLINE void pstoreu(float* p, __m256 x) { _mm256_storeu_ps(p, x); }

FAIRKV_X86_INLINE __m128 padd(__m128 a, __m128 b) { return _mm_add_ps(a, b); }
FAIRKV_X86_INLINE __m256 padd(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
FAIRKV_X86_INLINE __m128i padd(__m128i a, __m128i b) { return _mm_add_epi32(a, b); }
FAIRKV_X86_INLINE __m256i padd(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
FAIRKV_X86_INLINE __m128 psub(__m128 a, __m128 b) { return _mm_sub_ps(a, b); }
FAIRKV_X86_INLINE __m256 psub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
FAIRKV_X86_INLINE __m128 pmul(__m128 a, __m128 b) { return _mm_mul_ps(a, b); }
FAIRKV_X86_INLINE __m256 pmul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
FAIRKV_X86_INLINE __m128 pdiv(__m128 a, __m128 b) { return _mm_div_ps(a, b); }
FAIRKV_X86_INLINE __m256 pdiv(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
FAIRKV_X86_INLINE __m128 pmadd(__m128 a, __m128 b, __m128 c) { return _mm_fmadd_ps(a, b, c); }
FAIRKV_X86_INLINE __m256 pmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
// pmax: a NaN in either argument gives the first (maxps returns its second operand then).
FAIRKV_X86_INLINE __m128 pmax(__m128 a, __m128 b) { return _mm_max_ps(b, a); }
FAIRKV_X86_INLINE __m256 pmax(__m256 a, __m256 b) { return _mm256_max_ps(b, a); }
// Masks are packets with every bit of a true lane set; pselect(m, a, b) takes a where m is set.
FAIRKV_X86_INLINE __m128 pcmp_lt(__m128 a, __m128 b) { return _mm_cmp_ps(a, b, _CMP_LT_OQ); }
FAIRKV_X86_INLINE __m256 pcmp_lt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
FAIRKV_X86_INLINE __m128 pcmp_eq(__m128 a, __m128 b) { return _mm_cmp_ps(a, b, _CMP_EQ_OQ); }
FAIRKV_X86_INLINE __m256 pcmp_eq(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
FAIRKV_X86_INLINE __m128 pselect(__m128 m, __m128 a, __m128 b) { return _mm_blendv_ps(b, a, m); }
FAIRKV_X86_INLINE __m256 pselect(__m256 m, __m256 a, __m256 b) { return _mm256_blendv_ps(b, a, m); }
template <>
FAIRKV_X86_INLINE __m128i preinterpret<__m128i, __m128>(const __m128& x) { return _mm_castps_si128(x); }
template <>
FAIRKV_X86_INLINE __m256i preinterpret<__m256i, __m256>(const __m256& x) { return _mm256_castps_si256(x); }
template <>
FAIRKV_X86_INLINE __m128 preinterpret<__m128, __m128i>(const __m128i& x) { return _mm_castsi128_ps(x); }
template <>
FAIRKV_X86_INLINE __m256 preinterpret<__m256, __m256i>(const __m256i& x) { return _mm256_castsi256_ps(x); }
template <int N>
FAIRKV_X86_INLINE __m128i plogical_shift_left(__m128i x) {
  return _mm_slli_epi32(x, N);
}
template <int N>
FAIRKV_X86_INLINE __m256i plogical_shift_left(__m256i x) {
  return _mm256_slli_epi32(x, N);
}
FAIRKV_X86_INLINE float predux(__m128 x) {
  const __m128 s = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
FAIRKV_X86_INLINE float predux(__m256 x) {
  return predux(_mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
}

// Every transpose below starts with a 4 x 4 transpose within each 128-bit lane of 4 rows: lane L of row i then
// holds column 4L + i of that lane's 4 x 4 block.
FAIRKV_X86_INLINE void transpose_lanes4(__m128* p) {
  const __m128 t0 = _mm_unpacklo_ps(p[0], p[1]), t1 = _mm_unpackhi_ps(p[0], p[1]);
  const __m128 t2 = _mm_unpacklo_ps(p[2], p[3]), t3 = _mm_unpackhi_ps(p[2], p[3]);
  p[0] = _mm_movelh_ps(t0, t2);
  p[1] = _mm_movehl_ps(t2, t0);
  p[2] = _mm_movelh_ps(t1, t3);
  p[3] = _mm_movehl_ps(t3, t1);
}
FAIRKV_X86_INLINE void transpose_lanes4(__m256* p) {
  const __m256 t0 = _mm256_unpacklo_ps(p[0], p[1]), t1 = _mm256_unpackhi_ps(p[0], p[1]);
  const __m256 t2 = _mm256_unpacklo_ps(p[2], p[3]), t3 = _mm256_unpackhi_ps(p[2], p[3]);
  p[0] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  p[1] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  p[2] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  p[3] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
}

FAIRKV_X86_INLINE void ptranspose(PacketBlock<__m128, 4>& b) { transpose_lanes4(b.packet); }
// Rows 0-3 and 4-7 transposed within their lanes; column 4L + i is then lane L of rows i and 4 + i.
FAIRKV_X86_INLINE void ptranspose(PacketBlock<__m256, 8>& b) {
  transpose_lanes4(b.packet);
  transpose_lanes4(b.packet + 4);
  for (int i = 0; i < 4; ++i) {
    const __m256 a = b.packet[i], c = b.packet[4 + i];
    b.packet[i] = _mm256_permute2f128_ps(a, c, 0x20);
    b.packet[4 + i] = _mm256_permute2f128_ps(a, c, 0x31);
  }
}

FAIRKV_TARGET_POP

// ---- 512 bits: AVX-512F ----
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX512)

// GCC 12's plain AVX-512 intrinsics start from _mm512_undefined_*(), which -Wall reports as uninitialised wherever
// they are inlined (a false positive, in the engine's code too); their merge-masked forms with every lane selected
// compile to the same instructions and start from an operand.
inline constexpr __mmask16 all16 = 0xFFFF;

template <>
struct unpacket_traits<__m512> {
  static constexpr int size = 16;
  using half = __m256;
  using integer_packet = __m512i;
};

template <>
FAIRKV_X86_INLINE __m512 pset1<__m512>(float x) { return _mm512_set1_ps(x); }
template <>
FAIRKV_X86_INLINE __m512i pset1<__m512i>(int x) { return _mm512_set1_epi32(x); }
template <>
FAIRKV_X86_INLINE __m512 ploadu<__m512>(const float* p) { return _mm512_loadu_ps(p); }
FAIRKV_X86_INLINE void pstoreu(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
FAIRKV_X86_INLINE __m512 padd(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
FAIRKV_X86_INLINE __m512i padd(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
FAIRKV_X86_INLINE __m512 psub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
FAIRKV_X86_INLINE __m512 pmul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
FAIRKV_X86_INLINE __m512 pdiv(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
FAIRKV_X86_INLINE __m512 pmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
FAIRKV_X86_INLINE __m512 pmax(__m512 a, __m512 b) { return _mm512_mask_max_ps(a, all16, b, a); }
FAIRKV_X86_INLINE __m512 mask_packet(__mmask16 m) {
  return _mm512_castsi512_ps(_mm512_maskz_set1_epi32(m, -1));
}
FAIRKV_X86_INLINE __m512 pcmp_lt(__m512 a, __m512 b) { return mask_packet(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)); }
FAIRKV_X86_INLINE __m512 pcmp_eq(__m512 a, __m512 b) { return mask_packet(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ)); }
FAIRKV_X86_INLINE __m512 pselect(__m512 m, __m512 a, __m512 b) {
  const __m512i mi = _mm512_castps_si512(m);
  return _mm512_mask_blend_ps(_mm512_test_epi32_mask(mi, mi), b, a);
}
template <>
FAIRKV_X86_INLINE __m512i preinterpret<__m512i, __m512>(const __m512& x) { return _mm512_castps_si512(x); }
template <>
FAIRKV_X86_INLINE __m512 preinterpret<__m512, __m512i>(const __m512i& x) { return _mm512_castsi512_ps(x); }
template <int N>
FAIRKV_X86_INLINE __m512i plogical_shift_left(__m512i x) {
  return _mm512_mask_slli_epi32(x, all16, x, N);
}
FAIRKV_X86_INLINE float predux(__m512 x) {
  // Halves added within the register: the 512-to-256-bit casts and extracts start from undefined values too.
  x = _mm512_add_ps(x, _mm512_mask_shuffle_f32x4(x, all16, x, x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm512_add_ps(x, _mm512_mask_shuffle_f32x4(x, all16, x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  x = _mm512_add_ps(x, _mm512_mask_shuffle_ps(x, all16, x, x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm512_add_ps(x, _mm512_mask_shuffle_ps(x, all16, x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(x);
}
FAIRKV_X86_INLINE void transpose_lanes4(__m512* p) {
  const __m512 t0 = _mm512_mask_unpacklo_ps(p[0], all16, p[0], p[1]);
  const __m512 t1 = _mm512_mask_unpackhi_ps(p[0], all16, p[0], p[1]);
  const __m512 t2 = _mm512_mask_unpacklo_ps(p[2], all16, p[2], p[3]);
  const __m512 t3 = _mm512_mask_unpackhi_ps(p[2], all16, p[2], p[3]);
  p[0] = _mm512_mask_shuffle_ps(t0, all16, t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  p[1] = _mm512_mask_shuffle_ps(t0, all16, t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  p[2] = _mm512_mask_shuffle_ps(t1, all16, t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  p[3] = _mm512_mask_shuffle_ps(t1, all16, t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
}
// Each group of 4 rows transposed within its 128-bit lanes; column 4L + i is then lane L of rows i, 4 + i, 8 + i
// and 12 + i, gathered by two rounds of 128-bit lane shuffles.
FAIRKV_X86_INLINE void ptranspose(PacketBlock<__m512, 16>& b) {
  for (int g = 0; g < 16; g += 4) transpose_lanes4(b.packet + g);
  for (int i = 0; i < 4; ++i) {
    const __m512 r0 = b.packet[i], r1 = b.packet[4 + i], r2 = b.packet[8 + i], r3 = b.packet[12 + i];
    const __m512 u0 = _mm512_mask_shuffle_f32x4(r0, all16, r0, r1, _MM_SHUFFLE(1, 0, 1, 0));  // r0.L0 r0.L1 r1.L0 r1.L1
    const __m512 u1 = _mm512_mask_shuffle_f32x4(r0, all16, r0, r1, _MM_SHUFFLE(3, 2, 3, 2));  // r0.L2 r0.L3 r1.L2 r1.L3
    const __m512 v0 = _mm512_mask_shuffle_f32x4(r2, all16, r2, r3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 v1 = _mm512_mask_shuffle_f32x4(r2, all16, r2, r3, _MM_SHUFFLE(3, 2, 3, 2));
    b.packet[i] = _mm512_mask_shuffle_f32x4(u0, all16, u0, v0, _MM_SHUFFLE(2, 0, 2, 0));       // lane 0 of r0..r3
    b.packet[4 + i] = _mm512_mask_shuffle_f32x4(u0, all16, u0, v0, _MM_SHUFFLE(3, 1, 3, 1));   // lane 1
    b.packet[8 + i] = _mm512_mask_shuffle_f32x4(u1, all16, u1, v1, _MM_SHUFFLE(2, 0, 2, 0));   // lane 2
    b.packet[12 + i] = _mm512_mask_shuffle_f32x4(u1, all16, u1, v1, _MM_SHUFFLE(3, 1, 3, 1));  // lane 3
  }
}

FAIRKV_TARGET_POP

#undef FAIRKV_X86_INLINE

}  // namespace fairkv::cpu::detail::x86

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#endif  // FAIRKV_ISA_DISPATCH
