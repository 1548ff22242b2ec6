// Quantised formats: dequantisation by hand-computed values, and every block dot product against the float
// dot product of the dequantised operands (which it must equal up to float rounding: the integer part is exact).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant.hpp"

namespace q = llama::quant;
using llama::gguf::ggml_type;

namespace {

uint16_t f32_to_f16_bits(float f) {  // exact for the values used below (small integers / powers of two)
#if defined(__F16C__)
  return _cvtss_sh(f, 0);
#else
  // test-only: enough for normal numbers
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int exp = int((b >> 23) & 0xff) - 127 + 15;
  const uint32_t mant = (b >> 13) & 0x3ffu;
  return uint16_t(sign | (uint32_t(exp) << 10) | mant);
#endif
}

float dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return float(s);
}

// The activation the kernels really see: dequantised q8 blocks.
std::vector<float> dequant_act(const std::vector<q::block_q8_act>& xq) {
  std::vector<float> out;
  for (const auto& b : xq)
    for (int j = 0; j < q::qk; ++j) out.push_back(b.d * float(b.qs[j]));
  return out;
}

}  // namespace

TEST_CASE("quant: f16 and bf16 conversion") {
  CHECK(q::f16_to_f32(0x3c00) == 1.0f);
  CHECK(q::f16_to_f32(0xc000) == -2.0f);
  CHECK(q::f16_to_f32(0x0000) == 0.0f);
  CHECK(q::f16_to_f32(0x7bff) == 65504.0f);
  CHECK(q::f16_to_f32(0x0001) == doctest::Approx(5.960464477539063e-08));  // smallest subnormal
  CHECK(std::isinf(q::f16_to_f32(0x7c00)));
  CHECK(q::bf16_to_f32(0x3f80) == 1.0f);
  CHECK(q::bf16_to_f32(0xc040) == -3.0f);
}

TEST_CASE("quant: dequantisation of hand-made blocks") {
  SUBCASE("q4_0: (q - 8) * d, low nibbles first") {
    q::block_q4_0 b{};
    b.d = f32_to_f16_bits(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
    float out[32];
    q::dequantize_row(ggml_type::q4_0, &b, out, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(out[j] == float(j - 8) * 0.5f);
      CHECK(out[j + 16] == float(15 - j - 8) * 0.5f);
    }
  }
  SUBCASE("q4_1: q * d + m") {
    q::block_q4_1 b{};
    b.d = f32_to_f16_bits(0.25f);
    b.m = f32_to_f16_bits(-1.0f);
    for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | (j << 4));
    float out[32];
    q::dequantize_row(ggml_type::q4_1, &b, out, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(out[j] == float(j) * 0.25f - 1.0f);
      CHECK(out[j + 16] == float(j) * 0.25f - 1.0f);
    }
  }
  SUBCASE("q8_0: q * d") {
    q::block_q8_0 b{};
    b.d = f32_to_f16_bits(2.0f);
    for (int j = 0; j < 32; ++j) b.qs[j] = int8_t(j * 8 - 128);
    float out[32];
    q::dequantize_row(ggml_type::q8_0, &b, out, 32);
    for (int j = 0; j < 32; ++j) CHECK(out[j] == float(j * 8 - 128) * 2.0f);
  }
}

// The vectorised expansion (a table lookup on AVX-512) against the format's definition, element by element, on
// random blocks whose two nibbles of a byte differ: an element order or nibble mix-up cannot pass. q4_1's
// q * d + m may round once (fused) or twice (scalar code the compiler did not contract): either is accepted.
TEST_CASE("quant: dequantisation of random rows equals the per-element definition") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  const int n = 576, nb = n / 32;
  std::vector<q::block_q4_0> b40(static_cast<size_t>(nb));
  std::vector<q::block_q4_1> b41(static_cast<size_t>(nb));
  std::vector<q::block_q8_0> b80(static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i) {
    b40[size_t(i)].d = f32_to_f16_bits(0.5f);
    b41[size_t(i)].d = f32_to_f16_bits(scale(rng));
    b41[size_t(i)].m = f32_to_f16_bits(-scale(rng) * 8);
    b80[size_t(i)].d = f32_to_f16_bits(0.25f);
    for (int j = 0; j < 16; ++j) {
      b40[size_t(i)].qs[j] = uint8_t(byte(rng));
      b41[size_t(i)].qs[j] = uint8_t(byte(rng));
    }
    for (int j = 0; j < 32; ++j) b80[size_t(i)].qs[j] = int8_t(byte(rng) - 128);
  }
  std::vector<float> out(static_cast<size_t>(n));
  auto nibble = [](const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; };
  q::dequantize_row(ggml_type::q4_0, b40.data(), out.data(), n);
  for (int e = 0; e < n; ++e)
    CHECK(out[size_t(e)] == float(nibble(b40[size_t(e / 32)].qs, e % 32) - 8) * 0.5f);
  q::dequantize_row(ggml_type::q4_1, b41.data(), out.data(), n);
  for (int e = 0; e < n; ++e) {
    const q::block_q4_1& b = b41[size_t(e / 32)];
    const float qf = float(nibble(b.qs, e % 32)), d = q::f16_to_f32(b.d), m = q::f16_to_f32(b.m);
    volatile float prod = qf * d;  // volatile: the twice-rounded value, never contracted
    const bool fused = out[size_t(e)] == std::fma(qf, d, m), twice = out[size_t(e)] == prod + m;
    CHECK((fused || twice));
  }
  q::dequantize_row(ggml_type::q8_0, b80.data(), out.data(), n);
  for (int e = 0; e < n; ++e) CHECK(out[size_t(e)] == float(b80[size_t(e / 32)].qs[e % 32]) * 0.25f);
}

TEST_CASE("quant: activation quantisation round trip") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(256);
  for (auto& v : x) v = nd(rng);
  x[5] = 0.0f;
  std::vector<q::block_q8_act> xq(8);
  q::quantize_row_q8_act(x.data(), xq.data(), 256);
  const auto back = dequant_act(xq);
  for (int b = 0; b < 8; ++b) {
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      sum += xq[size_t(b)].qs[j];
      // round to nearest: error at most half a step
      CHECK(std::fabs(back[size_t(b * 32 + j)] - x[size_t(b * 32 + j)]) <= 0.5f * xq[size_t(b)].d * 1.0001f);
    }
    CHECK(xq[size_t(b)].s == doctest::Approx(xq[size_t(b)].d * float(sum)));
  }
  std::vector<float> zeros(32, 0.0f);
  q::quantize_row_q8_act(zeros.data(), xq.data(), 32);
  CHECK(xq[0].d == 0.0f);
  CHECK(xq[0].s == 0.0f);
}

TEST_CASE("quant: block dot products equal the float dot product of the dequantised operands") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n = 576;  // SmolLM2's d_model: 18 blocks
  const int nb = n / 32;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  std::vector<q::block_q8_act> xq(static_cast<size_t>(nb));
  q::quantize_row_q8_act(x.data(), xq.data(), n);
  const auto xa = dequant_act(xq);

  auto check = [&](ggml_type t, const void* row) {
    std::vector<float> w(static_cast<size_t>(n));
    q::dequantize_row(t, row, w.data(), n);
    const float ref = dot(w, xa);
    const float got = q::vec_dot_row(t, row, x.data(), xq.data(), n);
    double mag = 0;
    for (int i = 0; i < n; ++i) mag += std::fabs(double(w[size_t(i)]) * xa[size_t(i)]);
    CHECK(std::fabs(got - ref) <= 1e-5 * mag + 1e-6);
  };
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<q::block_q4_0> b40(static_cast<size_t>(nb));
    std::vector<q::block_q4_1> b41(static_cast<size_t>(nb));
    std::vector<q::block_q8_0> b80(static_cast<size_t>(nb));
    for (int i = 0; i < nb; ++i) {
      b40[size_t(i)].d = f32_to_f16_bits(scale(rng));
      b41[size_t(i)].d = f32_to_f16_bits(scale(rng));
      b41[size_t(i)].m = f32_to_f16_bits(-scale(rng) * 8);
      b80[size_t(i)].d = f32_to_f16_bits(scale(rng));
      for (int j = 0; j < 16; ++j) {
        b40[size_t(i)].qs[j] = uint8_t(byte(rng));
        b41[size_t(i)].qs[j] = uint8_t(byte(rng));
      }
      for (int j = 0; j < 32; ++j) b80[size_t(i)].qs[j] = int8_t(byte(rng) - 128);  // includes -128
    }
    check(ggml_type::q4_0, b40.data());
    check(ggml_type::q4_1, b41.data());
    check(ggml_type::q8_0, b80.data());
  }
  // Float weight types multiply the float activations directly.
  std::vector<float> wf(static_cast<size_t>(n));
  std::vector<uint16_t> wh(static_cast<size_t>(n)), wb(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    wf[size_t(i)] = float(i % 7) - 3.0f;
    wh[size_t(i)] = f32_to_f16_bits(wf[size_t(i)] == 0.0f ? 1.0f : wf[size_t(i)]);
    uint32_t bits;
    std::memcpy(&bits, &wf[size_t(i)], 4);
    wb[size_t(i)] = uint16_t(bits >> 16);
  }
  CHECK(q::vec_dot_row(ggml_type::f32, wf.data(), x.data(), nullptr, n) == doctest::Approx(dot(wf, x)).epsilon(1e-5));
  CHECK(q::vec_dot_row(ggml_type::bf16, wb.data(), x.data(), nullptr, n) == doctest::Approx(dot(wf, x)).epsilon(1e-5));
  std::vector<float> wh_f(static_cast<size_t>(n));
  q::dequantize_row(ggml_type::f16, wh.data(), wh_f.data(), n);
  CHECK(q::vec_dot_row(ggml_type::f16, wh.data(), x.data(), nullptr, n) == doctest::Approx(dot(wh_f, x)).epsilon(1e-5));
  CHECK(q::row_bytes(ggml_type::q4_1, 576) == 18 * 20);
  CHECK(q::row_bytes(ggml_type::f16, 576) == 1152);
  CHECK_THROWS(q::require_supported(ggml_type::q6_k, "x"));
}
