// Quantised weight formats of ggml (F32, F16, BF16, Q4_0, Q4_1, Q8_0): dequantisation and dot products that
// work directly on the blocks in the memory-mapped file, so quantised weights are never expanded in memory.
//
// Two paths. The default (exact) one expands each weight block to floats in registers and multiplies it with
// the float activations, so results equal a float reference up to summation order. The optional fast one
// follows llama.cpp: activations are quantised to 8-bit blocks of 32 (a float scale plus the scaled sum of the
// quants, which the Q4 offsets need) and each block is multiplied with integer arithmetic (AVX2 / AVX-VNNI);
// it is faster but moves logits by up to ~1 (measured, docs/llama-runner.md) and can change greedy tokens.
// Kernels use AVX-512 / AVX2 when the compiler targets them, scalar code otherwise.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "gguf.hpp"

namespace llama::quant {

inline constexpr int qk = 32;  // elements per block of every format handled here

// Block layouts exactly as ggml stores them (little-endian, packed, no padding).
struct block_q4_0 {
  uint16_t d;          // f16 scale
  uint8_t qs[qk / 2];  // element j in the low nibble of qs[j], element j+16 in the high nibble; x = (q-8)*d
};
struct block_q4_1 {
  uint16_t d;          // f16 scale
  uint16_t m;          // f16 minimum; x = q*d + m
  uint8_t qs[qk / 2];  // same nibble order as q4_0
};
struct block_q8_0 {
  uint16_t d;      // f16 scale
  int8_t qs[qk];   // x = q*d
};
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q8_0) == 34);

// An activation block: 32 int8 quants with a float scale and the scaled sum of its quants (s = d * sum q),
// so that the Q4 offsets (the -8 of Q4_0, the minimum m of Q4_1) cost one multiply per block.
struct block_q8_act {
  float d;
  float s;
  int8_t qs[qk];
};
static_assert(sizeof(block_q8_act) == 40);

// ---- scalar conversions ----------------------------------------------------------------------------------

inline float f16_to_f32(uint16_t h) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
#endif
}

inline float bf16_to_f32(uint16_t h) noexcept { return std::bit_cast<float>(uint32_t(h) << 16); }

// ---- format description ----------------------------------------------------------------------------------

// True for the formats whose matvec runs on quantised activations.
inline bool is_block_quant(gguf::ggml_type t) noexcept {
  using gguf::ggml_type;
  return t == ggml_type::q4_0 || t == ggml_type::q4_1 || t == ggml_type::q8_0;
}

inline bool is_supported(gguf::ggml_type t) noexcept {
  using gguf::ggml_type;
  return is_block_quant(t) || t == ggml_type::f32 || t == ggml_type::f16 || t == ggml_type::bf16;
}

inline void require_supported(gguf::ggml_type t, const std::string& tensor_name) {
  if (!is_supported(t))
    throw std::runtime_error("tensor '" + tensor_name + "' has type " + gguf::type_name(t) +
                             ", which the runner does not implement (supported: f32, f16, bf16, q4_0, q4_1, q8_0)");
}

// Bytes of one row of n elements (n must be a multiple of the block size for block formats).
inline size_t row_bytes(gguf::ggml_type t, int64_t n) {
  return size_t(n) / gguf::block_size(t) * gguf::type_size(t);
}

// ---- activation quantisation -----------------------------------------------------------------------------

// x[n] -> y[n/32] (n a multiple of 32). Symmetric, round to nearest, like ggml's quantize_row_q8_1.
inline void quantize_row_q8_act(const float* x, block_q8_act* y, int64_t n) noexcept {
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float amax = 0.0f;
    for (int j = 0; j < qk; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < qk; ++j) {
      const int q = int(std::nearbyint(x[j] * id));
      y[i].qs[j] = int8_t(q);
      sum += q;
    }
    y[i].d = d;
    y[i].s = d * float(sum);
  }
}

// ---- dot products of one weight row with one activation row ----------------------------------------------

namespace detail {

// Decode streams every weight once per token, and the hardware prefetchers stop at each 4 KiB page, so a
// kernel walking a weight row asks for the bytes 2 KiB ahead (rows are contiguous, so past a row's end that is
// the next rows'; a prefetch past the mapping is dropped, never a fault). Measured on the 135M model, 1 thread,
// AVX-512: decode 46.6 -> 69.2 tok/s with the prefetch (1 KiB ahead: 60.9; 4 KiB: as 2 KiB), docs/benchmarks.md.
inline constexpr int prefetch_bytes = 2048;
inline void prefetch_ahead(const void* p) noexcept {
  __builtin_prefetch(static_cast<const char*>(p) + prefetch_bytes, 0, 3);
}

#if defined(__AVX2__)
inline float hsum(__m256 v) noexcept {
  __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Eight int32 partial sums of u[i]*s[i] over 32 unsigned x signed bytes.
inline __m256i dot_u8_s8(__m256i u, __m256i s) noexcept {
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// 32 nibbles of a Q4 block as bytes 0..15, in element order (low nibbles first, then high nibbles).
inline __m256i unpack_nibbles(const uint8_t* qs) noexcept {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}
#endif

// sum_j q[j] * a[j] for a Q4 block's nibbles (unsigned 0..15) and an activation block.
inline int dot_nibbles_scalar(const uint8_t* qs, const int8_t* a) noexcept {
  int acc = 0;
  for (int j = 0; j < qk / 2; ++j) acc += int(qs[j] & 0x0f) * a[j] + int(qs[j] >> 4) * a[j + qk / 2];
  return acc;
}

}  // namespace detail

// Q4_1 row (n/32 blocks) . activation row: sum_b d_w d_a (q.a) + m_w s_a.
inline float vec_dot_q4_1(const block_q4_1* w, const block_q8_act* a, int64_t nb) noexcept {
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  float offs = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 2 == 0) detail::prefetch_ahead(w + i);
    const __m256i q = detail::unpack_nibbles(w[i].qs);
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256 p = _mm256_cvtepi32_ps(detail::dot_u8_s8(q, y));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(w[i].d) * a[i].d), p, acc);
    offs += f16_to_f32(w[i].m) * a[i].s;
  }
  return detail::hsum(acc) + offs;
#else
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i)
    sum += f16_to_f32(w[i].d) * a[i].d * float(detail::dot_nibbles_scalar(w[i].qs, a[i].qs)) +
           f16_to_f32(w[i].m) * a[i].s;
  return sum;
#endif
}

// Q4_0 row . activation row: sum_b d_w (d_a (q.a) - 8 s_a), the -8 offset folded into the block sum.
inline float vec_dot_q4_0(const block_q4_0* w, const block_q8_act* a, int64_t nb) noexcept {
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  float offs = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 2 == 0) detail::prefetch_ahead(w + i);
    const float dw = f16_to_f32(w[i].d);
    const __m256i q = detail::unpack_nibbles(w[i].qs);
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256 p = _mm256_cvtepi32_ps(detail::dot_u8_s8(q, y));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[i].d), p, acc);
    offs -= 8.0f * dw * a[i].s;
  }
  return detail::hsum(acc) + offs;
#else
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i)
    sum += f16_to_f32(w[i].d) * (a[i].d * float(detail::dot_nibbles_scalar(w[i].qs, a[i].qs)) - 8.0f * a[i].s);
  return sum;
#endif
}

// Q8_0 row . activation row (signed x signed: |w| times a with w's sign, so the u8 x s8 instruction applies).
inline float vec_dot_q8_0(const block_q8_0* w, const block_q8_act* a, int64_t nb) noexcept {
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    detail::prefetch_ahead(w + i);
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256 p = _mm256_cvtepi32_ps(detail::dot_u8_s8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(w[i].d) * a[i].d), p, acc);
  }
  return detail::hsum(acc);
#else
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int s = 0;
    for (int j = 0; j < qk; ++j) s += int(w[i].qs[j]) * a[i].qs[j];
    sum += f16_to_f32(w[i].d) * a[i].d * float(s);
  }
  return sum;
#endif
}

// ---- block weights . float activations (the default, exact path) -----------------------------------------
//
// The weight block is expanded to floats in registers and multiplied with the float activation: the result
// equals the float dot product of the dequantised row up to summation order, so the runner reproduces a
// float reference. The block offsets use per-block sums of x (xsum[b] = sum of x over block b):
//   q4_1: sum_j (d q_j + m) x_j = d (q.x) + m xsum,   q4_0: d (q.x - 8 xsum),   q8_0: d (q.x).

namespace detail {
// A block's 32 weights (bytes, element order) expanded to floats, then dotted with 32 floats of x as vector
// lanes to be scaled by the block's d. Expanding once and dotting with several token rows is what lets a
// batch of decode steps share the unpacking while each row's arithmetic stays that of one token.
#if defined(__AVX512F__)
struct expanded {
  __m512 lo, hi;
};
// A Q4 block's 32 nibbles as floats: byte j widened to lane j, whose low 4 bits (the low nibble, element j)
// and, shifted, whose high nibble (element j+16) index a table of 0..15 (vpermps reads only an index's low 4
// bits, so no masking). Four uops instead of the seven of unpack + widen + convert; the floats are the same.
inline expanded expand_nibbles(const uint8_t* qs) noexcept {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return {_mm512_permutexvar_ps(b, iota), _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), iota)};
}
inline expanded expand_s8(__m256i q) noexcept {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))),
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)))};
}
inline __m512 dot_expanded(const expanded& e, const float* x) noexcept {
  return _mm512_fmadd_ps(e.hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(e.lo, _mm512_loadu_ps(x)));
}
#elif defined(__AVX2__)
struct expanded {
  __m256 v0, v1, v2, v3;
};
// A Q4 block's 32 nibbles as floats, in element order.
inline expanded expand_nibbles(const uint8_t* qs) noexcept {
  const __m256i q = unpack_nibbles(qs);
  const __m128i a = _mm256_castsi256_si128(q), b = _mm256_extracti128_si256(q, 1);
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(a)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(a, 8))),
          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
}
inline expanded expand_s8(__m256i q) noexcept {
  const __m128i a = _mm256_castsi256_si128(q), b = _mm256_extracti128_si256(q, 1);
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
}
inline __m256 dot_expanded(const expanded& e, const float* x) noexcept {
  __m256 acc = _mm256_mul_ps(e.v0, _mm256_loadu_ps(x));
  acc = _mm256_fmadd_ps(e.v1, _mm256_loadu_ps(x + 8), acc);
  acc = _mm256_fmadd_ps(e.v2, _mm256_loadu_ps(x + 16), acc);
  return _mm256_fmadd_ps(e.v3, _mm256_loadu_ps(x + 24), acc);
}
#endif

#if defined(__AVX512F__)
using fvec = __m512;
inline fvec fzero() noexcept { return _mm512_setzero_ps(); }
inline fvec ffma(float a, fvec b, fvec c) noexcept { return _mm512_fmadd_ps(_mm512_set1_ps(a), b, c); }
inline float fsum(fvec v) noexcept { return _mm512_reduce_add_ps(v); }
inline fvec fadd(fvec a, fvec b) noexcept { return _mm512_add_ps(a, b); }
inline fvec fset1(float a) noexcept { return _mm512_set1_ps(a); }
inline fvec fmul(fvec a, fvec b) noexcept { return _mm512_mul_ps(a, b); }
// dst[32] = f(each vector of an expanded block), in element order.
template <class F>
inline void store_expanded(const expanded& e, float* dst, F&& f) noexcept {
  _mm512_storeu_ps(dst, f(e.lo));
  _mm512_storeu_ps(dst + 16, f(e.hi));
}
#elif defined(__AVX2__)
using fvec = __m256;
inline fvec fzero() noexcept { return _mm256_setzero_ps(); }
inline fvec ffma(float a, fvec b, fvec c) noexcept { return _mm256_fmadd_ps(_mm256_set1_ps(a), b, c); }
inline float fsum(fvec v) noexcept { return hsum(v); }
inline fvec fadd(fvec a, fvec b) noexcept { return _mm256_add_ps(a, b); }
inline fvec fset1(float a) noexcept { return _mm256_set1_ps(a); }
inline fvec fmul(fvec a, fvec b) noexcept { return _mm256_mul_ps(a, b); }
template <class F>
inline void store_expanded(const expanded& e, float* dst, F&& f) noexcept {
  _mm256_storeu_ps(dst, f(e.v0));
  _mm256_storeu_ps(dst + 8, f(e.v1));
  _mm256_storeu_ps(dst + 16, f(e.v2));
  _mm256_storeu_ps(dst + 24, f(e.v3));
}
#endif

inline float dot_nibbles_f32_scalar(const uint8_t* qs, const float* x) noexcept {
  float acc = 0.0f;
  for (int j = 0; j < qk / 2; ++j) acc += float(qs[j] & 0x0f) * x[j] + float(qs[j] >> 4) * x[j + qk / 2];
  return acc;
}
}  // namespace detail

// ---- dequantisation (prefill GEMM tiles, embedding lookup, tests) ----------------------------------------

// Expands one row of n elements of type t at src into dst[n].
inline void dequantize_row(gguf::ggml_type t, const void* src, float* dst, int64_t n) {
  using gguf::ggml_type;
  switch (t) {
    case ggml_type::f32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case ggml_type::f16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    case ggml_type::bf16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case ggml_type::q4_0: {
      const auto* b = static_cast<const block_q4_0*>(src);
      for (int64_t i = 0; i < n / qk; ++i, dst += qk) {
        const float d = f16_to_f32(b[i].d);
#if defined(__AVX2__)
        const detail::fvec vd = detail::fset1(d), minus8 = detail::fset1(-8.0f);
        detail::store_expanded(detail::expand_nibbles(b[i].qs), dst,
                               [&](detail::fvec v) { return detail::fmul(detail::fadd(v, minus8), vd); });
#else
        for (int j = 0; j < qk / 2; ++j) {
          dst[j] = float(int(b[i].qs[j] & 0x0f) - 8) * d;
          dst[j + qk / 2] = float(int(b[i].qs[j] >> 4) - 8) * d;
        }
#endif
      }
      return;
    }
    case ggml_type::q4_1: {
      const auto* b = static_cast<const block_q4_1*>(src);
      for (int64_t i = 0; i < n / qk; ++i, dst += qk) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
#if defined(__AVX2__)
        const detail::fvec vm = detail::fset1(m);
        detail::store_expanded(detail::expand_nibbles(b[i].qs), dst,
                               [&](detail::fvec v) { return detail::ffma(d, v, vm); });
#else
        for (int j = 0; j < qk / 2; ++j) {
          dst[j] = float(b[i].qs[j] & 0x0f) * d + m;
          dst[j + qk / 2] = float(b[i].qs[j] >> 4) * d + m;
        }
#endif
      }
      return;
    }
    case ggml_type::q8_0: {
      const auto* b = static_cast<const block_q8_0*>(src);
      for (int64_t i = 0; i < n / qk; ++i, dst += qk) {
        const float d = f16_to_f32(b[i].d);
#if defined(__AVX2__)
        const detail::fvec vd = detail::fset1(d);
        detail::store_expanded(detail::expand_s8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs))), dst,
                               [&](detail::fvec v) { return detail::fmul(v, vd); });
#else
        for (int j = 0; j < qk; ++j) dst[j] = float(b[i].qs[j]) * d;
#endif
      }
      return;
    }
    default:
      throw std::runtime_error("dequantize_row: unsupported type " + gguf::type_name(t));
  }
}

// Rows of activations dotted with one weight row at a time: how many share each expanded block.
#if defined(__AVX512F__)
inline constexpr int dot_rows = 4;
#else
inline constexpr int dot_rows = 4;
#endif

// Per-block sums of x[n]: xsum[n/32].
inline void block_sums(const float* x, float* xsum, int64_t n) noexcept {
  for (int64_t b = 0; b < n / qk; ++b) {
    float s = 0.0f;
    for (int j = 0; j < qk; ++j) s += x[b * qk + j];
    xsum[b] = s;
  }
}

// The block formats' dots of one weight row with NT activation rows x[t] (block sums xsum[t]), out[t]. Every
// row gets the same operations in the same order whatever NT is, so results do not depend on the batching.
// The two Q4 formats differ only in the offset of a block: q4_1's minimum m times xsum, q4_0's -8 d xsum.
template <int NT, class Block>
inline void vec_dot_q4_f32_n(const Block* w, const float* const* x, const float* const* xsum, int64_t nb,
                             float* out) noexcept {
  constexpr bool has_min = std::is_same_v<Block, block_q4_1>;
#if defined(__AVX2__)
  // Two accumulators: consecutive blocks do not wait for each other's FMA latency.
  detail::fvec acc0[NT], acc1[NT];
  float offs[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = detail::fzero(), offs[t] = 0.0f;
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {
    detail::prefetch_ahead(w + i);
    const float d0 = f16_to_f32(w[i].d), d1 = f16_to_f32(w[i + 1].d);
    const detail::expanded e0 = detail::expand_nibbles(w[i].qs);
    const detail::expanded e1 = detail::expand_nibbles(w[i + 1].qs);
    for (int t = 0; t < NT; ++t) {
      const float* xb = x[t] + i * qk;
      acc0[t] = detail::ffma(d0, detail::dot_expanded(e0, xb), acc0[t]);
      acc1[t] = detail::ffma(d1, detail::dot_expanded(e1, xb + qk), acc1[t]);
      if constexpr (has_min)
        offs[t] += f16_to_f32(w[i].m) * xsum[t][i] + f16_to_f32(w[i + 1].m) * xsum[t][i + 1];
      else
        offs[t] -= 8.0f * (d0 * xsum[t][i] + d1 * xsum[t][i + 1]);
    }
  }
  if (i < nb) {
    const float d = f16_to_f32(w[i].d);
    const detail::expanded e = detail::expand_nibbles(w[i].qs);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = detail::ffma(d, detail::dot_expanded(e, x[t] + i * qk), acc0[t]);
      if constexpr (has_min)
        offs[t] += f16_to_f32(w[i].m) * xsum[t][i];
      else
        offs[t] -= 8.0f * d * xsum[t][i];
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = detail::fsum(detail::fadd(acc0[t], acc1[t])) + offs[t];
#else
  for (int t = 0; t < NT; ++t) {
    float sum = 0.0f;
    const float* xb = x[t];
    for (int64_t i = 0; i < nb; ++i, xb += qk) {
      if constexpr (has_min)
        sum += f16_to_f32(w[i].d) * detail::dot_nibbles_f32_scalar(w[i].qs, xb) + f16_to_f32(w[i].m) * xsum[t][i];
      else
        sum += f16_to_f32(w[i].d) * (detail::dot_nibbles_f32_scalar(w[i].qs, xb) - 8.0f * xsum[t][i]);
    }
    out[t] = sum;
  }
#endif
}

template <int NT>
inline void vec_dot_q8_0_f32_n(const block_q8_0* w, const float* const* x, int64_t nb, float* out) noexcept {
#if defined(__AVX2__)
  auto expand = [&](int64_t i) {
    return detail::expand_s8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs)));
  };
  detail::fvec acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = detail::fzero();
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {
    detail::prefetch_ahead(w + i);  // two 34-byte blocks span two cache lines
    detail::prefetch_ahead(w + i + 1);
    const float d0 = f16_to_f32(w[i].d), d1 = f16_to_f32(w[i + 1].d);
    const detail::expanded e0 = expand(i), e1 = expand(i + 1);
    for (int t = 0; t < NT; ++t) {
      const float* xb = x[t] + i * qk;
      acc0[t] = detail::ffma(d0, detail::dot_expanded(e0, xb), acc0[t]);
      acc1[t] = detail::ffma(d1, detail::dot_expanded(e1, xb + qk), acc1[t]);
    }
  }
  if (i < nb) {
    const float d = f16_to_f32(w[i].d);
    const detail::expanded e = expand(i);
    for (int t = 0; t < NT; ++t) acc0[t] = detail::ffma(d, detail::dot_expanded(e, x[t] + i * qk), acc0[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = detail::fsum(detail::fadd(acc0[t], acc1[t]));
#else
  for (int t = 0; t < NT; ++t) {
    float sum = 0.0f;
    const float* xb = x[t];
    for (int64_t i = 0; i < nb; ++i, xb += qk) {
      float s = 0.0f;
      for (int j = 0; j < qk; ++j) s += float(w[i].qs[j]) * xb[j];
      sum += f16_to_f32(w[i].d) * s;
    }
    out[t] = sum;
  }
#endif
}

// One activation row: the NT = 1 case.
inline float vec_dot_q4_1_f32(const block_q4_1* w, const float* x, const float* xsum, int64_t nb) noexcept {
  float out;
  vec_dot_q4_f32_n<1>(w, &x, &xsum, nb, &out);
  return out;
}
inline float vec_dot_q4_0_f32(const block_q4_0* w, const float* x, const float* xsum, int64_t nb) noexcept {
  float out;
  vec_dot_q4_f32_n<1>(w, &x, &xsum, nb, &out);
  return out;
}
inline float vec_dot_q8_0_f32(const block_q8_0* w, const float* x, int64_t nb) noexcept {
  float out;
  vec_dot_q8_0_f32_n<1>(w, &x, nb, &out);
  return out;
}

// Float weight rows . float activations (F32 / F16 / BF16 weights are not worth quantising against).
inline float vec_dot_f32(const float* w, const float* x, int64_t n) noexcept {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += w[i] * x[i];
  return s;
}
inline float vec_dot_f16(const uint16_t* w, const float* x, int64_t n) noexcept {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += f16_to_f32(w[i]) * x[i];
  return s;
}
inline float vec_dot_bf16(const uint16_t* w, const float* x, int64_t n) noexcept {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
  return s;
}

// One weight row (type t, n elements) with an activation given both as floats x[n] and, for block formats,
// as quantised blocks xq[n/32] (either may be null when the type does not need it).
inline float vec_dot_row(gguf::ggml_type t, const void* row, const float* x, const block_q8_act* xq, int64_t n) {
  using gguf::ggml_type;
  switch (t) {
    case ggml_type::q4_1: return vec_dot_q4_1(static_cast<const block_q4_1*>(row), xq, n / qk);
    case ggml_type::q4_0: return vec_dot_q4_0(static_cast<const block_q4_0*>(row), xq, n / qk);
    case ggml_type::q8_0: return vec_dot_q8_0(static_cast<const block_q8_0*>(row), xq, n / qk);
    case ggml_type::f32: return vec_dot_f32(static_cast<const float*>(row), x, n);
    case ggml_type::f16: return vec_dot_f16(static_cast<const uint16_t*>(row), x, n);
    case ggml_type::bf16: return vec_dot_bf16(static_cast<const uint16_t*>(row), x, n);
    default: throw std::runtime_error("vec_dot_row: unsupported type " + gguf::type_name(t));
  }
}

// One weight row (type t, n elements) with float activations x[n]; xsum[n/32] are x's block sums (only read
// by the Q4 formats). The exact path of the runner.
inline float vec_dot_row_f32(gguf::ggml_type t, const void* row, const float* x, const float* xsum, int64_t n) {
  using gguf::ggml_type;
  switch (t) {
    case ggml_type::q4_1: return vec_dot_q4_1_f32(static_cast<const block_q4_1*>(row), x, xsum, n / qk);
    case ggml_type::q4_0: return vec_dot_q4_0_f32(static_cast<const block_q4_0*>(row), x, xsum, n / qk);
    case ggml_type::q8_0: return vec_dot_q8_0_f32(static_cast<const block_q8_0*>(row), x, n / qk);
    case ggml_type::f32: return vec_dot_f32(static_cast<const float*>(row), x, n);
    case ggml_type::f16: return vec_dot_f16(static_cast<const uint16_t*>(row), x, n);
    case ggml_type::bf16: return vec_dot_bf16(static_cast<const uint16_t*>(row), x, n);
    default: throw std::runtime_error("vec_dot_row_f32: unsupported type " + gguf::type_name(t));
  }
}

// NT activation rows with one weight row: out[t] equals vec_dot_row_f32(t, row, x[t], xsum[t], n) exactly.
template <int NT>
inline void vec_dot_rows_f32(gguf::ggml_type t, const void* row, const float* const* x, const float* const* xsum,
                             int64_t n, float* out) {
  using gguf::ggml_type;
  switch (t) {
    case ggml_type::q4_1: return vec_dot_q4_f32_n<NT>(static_cast<const block_q4_1*>(row), x, xsum, n / qk, out);
    case ggml_type::q4_0: return vec_dot_q4_f32_n<NT>(static_cast<const block_q4_0*>(row), x, xsum, n / qk, out);
    case ggml_type::q8_0: return vec_dot_q8_0_f32_n<NT>(static_cast<const block_q8_0*>(row), x, n / qk, out);
    default:
      for (int i = 0; i < NT; ++i) out[i] = vec_dot_row_f32(t, row, x[i], xsum[i], n);
  }
}

}  // namespace llama::quant
