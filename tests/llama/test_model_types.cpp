// Every supported weight type end to end through model loading and the forward pass: a tiny random Llama
// written as a GGUF with its matrices in type T, against the same model with the dequantised weights stored as
// F32. Both must give the same logits (the exact path multiplies the same float values), for prefill and
// decode, with tied and untied output embeddings.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "forward.hpp"
#include "gguf_test_writer.hpp"
#include "model.hpp"

namespace {

using llama::gguf::ggml_type;
using llama::test::tensor_data;
namespace q = llama::quant;

uint16_t to_f16(float f) {  // round-to-nearest for normal numbers (enough for the small values used here)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int exp = int((b >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return uint16_t(sign);
  uint32_t mant = (b >> 13) & 0x3ffu;
  uint32_t e = uint32_t(exp);
  if (b & 0x1000u) {  // round half up
    if (++mant == 0x400u) {
      mant = 0;
      ++e;
    }
  }
  return uint16_t(sign | (e << 10) | mant);
}

// A random matrix [n_in, n_out] in type t, and its dequantised F32 twin.
std::pair<tensor_data, tensor_data> random_matrix(const std::string& name, int64_t n_in, int64_t n_out, ggml_type t,
                                                  std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.0f, 0.08f);
  tensor_data qt{name, {uint64_t(n_in), uint64_t(n_out)}, t, {}};
  const size_t row = q::row_bytes(t, n_in);
  qt.bytes.resize(row * size_t(n_out));
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(qt.bytes.data() + at, &v, 2); };
  const int64_t nb = n_in / 32;
  for (int64_t r = 0; r < n_out; ++r) {
    const size_t base = size_t(r) * row;
    switch (t) {
      case ggml_type::f32:
        for (int64_t i = 0; i < n_in; ++i) {
          const float v = nd(rng);
          std::memcpy(qt.bytes.data() + base + size_t(i) * 4, &v, 4);
        }
        break;
      case ggml_type::f16:
        for (int64_t i = 0; i < n_in; ++i) put16(base + size_t(i) * 2, to_f16(nd(rng)));
        break;
      case ggml_type::bf16:
        for (int64_t i = 0; i < n_in; ++i) {
          const float v = nd(rng);
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          put16(base + size_t(i) * 2, uint16_t(bits >> 16));
        }
        break;
      case ggml_type::q4_0:
      case ggml_type::q4_1:
      case ggml_type::q8_0: {
        const size_t bs = t == ggml_type::q4_0 ? 18 : t == ggml_type::q4_1 ? 20 : 34;
        for (int64_t b = 0; b < nb; ++b) {
          const size_t at = base + size_t(b) * bs;
          for (size_t k = 0; k < bs; ++k) qt.bytes[at + k] = std::byte(byte(rng));
          put16(at, to_f16(t == ggml_type::q8_0 ? 0.0015f : 0.02f));
          if (t == ggml_type::q4_1) put16(at + 2, to_f16(-0.15f));
        }
        break;
      }
      default:
        FAIL("unexpected type");
    }
  }
  tensor_data ft{name, qt.ne, ggml_type::f32, std::vector<std::byte>(size_t(n_in * n_out) * 4)};
  std::vector<float> tmp(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_out; ++r) {
    q::dequantize_row(t, qt.bytes.data() + size_t(r) * row, tmp.data(), n_in);
    std::memcpy(ft.bytes.data() + size_t(r * n_in) * 4, tmp.data(), size_t(n_in) * 4);
  }
  return {qt, ft};
}

tensor_data norm_vector(const std::string& name, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.8f, 1.2f);
  tensor_data t{name, {uint64_t(n)}, ggml_type::f32, std::vector<std::byte>(size_t(n) * 4)};
  for (int64_t i = 0; i < n; ++i) {
    const float v = u(rng);
    std::memcpy(t.bytes.data() + size_t(i) * 4, &v, 4);
  }
  return t;
}

std::vector<std::byte> write_gguf(const std::vector<tensor_data>& ts, int layers, int d, int ff, int heads, int kv) {
  return llama::test::write_gguf(llama::test::llama_metadata(layers, d, ff, heads, kv), ts);
}

}  // namespace

TEST_CASE("model types: F32/F16/BF16/Q4_0/Q4_1/Q8_0 matrices give the logits of their dequantised F32 twin") {
  const int layers = 2, d = 64, ff = 128, heads = 4, kv = 2, vocab = 80;
  for (ggml_type t : {ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q4_0, ggml_type::q4_1,
                      ggml_type::q8_0}) {
    for (bool tied : {true, false}) {
      CAPTURE(llama::gguf::type_name(t));
      CAPTURE(tied);
      std::mt19937 rng(42);
      std::vector<tensor_data> qts, fts;
      auto add_matrix = [&](const std::string& name, int64_t n_in, int64_t n_out) {
        auto [qt, ft] = random_matrix(name, n_in, n_out, t, rng);
        qts.push_back(std::move(qt));
        fts.push_back(std::move(ft));
      };
      auto add_vector = [&](const std::string& name, int64_t n) {
        tensor_data v = norm_vector(name, n, rng);
        qts.push_back(v);
        fts.push_back(std::move(v));
      };
      add_matrix("token_embd.weight", d, vocab);
      if (!tied) add_matrix("output.weight", d, vocab);
      add_vector("output_norm.weight", d);
      for (int l = 0; l < layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        add_vector(p + "attn_norm.weight", d);
        add_vector(p + "ffn_norm.weight", d);
        add_matrix(p + "attn_q.weight", d, d);
        add_matrix(p + "attn_k.weight", d, d / heads * kv);
        add_matrix(p + "attn_v.weight", d, d / heads * kv);
        add_matrix(p + "attn_output.weight", d, d);
        add_matrix(p + "ffn_gate.weight", d, ff);
        add_matrix(p + "ffn_up.weight", d, ff);
        add_matrix(p + "ffn_down.weight", ff, d);
      }
      const auto qbytes = write_gguf(qts, layers, d, ff, heads, kv);
      const auto fbytes = write_gguf(fts, layers, d, ff, heads, kv);
      const llama::model mq = llama::model::from_file(llama::gguf::file::from_memory(qbytes), "typed");
      const llama::model mf = llama::model::from_file(llama::gguf::file::from_memory(fbytes), "f32 twin");
      CHECK(mq.tied_embeddings() == tied);
      CHECK(mq.hp().head_dim == 16);
      CHECK(mq.hp().n_vocab == vocab);

      const std::vector<int32_t> prompt = {1, 5, 9, 33, 2, 70, 12, 12, 64, 3};
      for (int batch : {1, 8}) {
        llama::engine eq(mq, 32, {.threads = 2, .batch = batch});
        llama::engine ef(mf, 32, {.threads = 2, .batch = batch});
        auto lq = eq.feed(prompt, true);
        auto lf = ef.feed(prompt, true);
        const int32_t next = 7;
        const auto dq = eq.feed(std::span<const int32_t>(&next, 1));
        const auto df = ef.feed(std::span<const int32_t>(&next, 1));
        lq.insert(lq.end(), dq.begin(), dq.end());
        lf.insert(lf.end(), df.begin(), df.end());
        REQUIRE(lq.size() == lf.size());
        double md = 0, mag = 0;
        for (size_t i = 0; i < lq.size(); ++i) {
          md = std::max(md, double(std::fabs(lq[i] - lf[i])));
          mag = std::max(mag, double(std::fabs(lf[i])));
        }
        MESSAGE(llama::gguf::type_name(t) << std::string(tied ? " tied" : " untied") << " batch " << batch
                                          << ": max |logit - f32 twin| = " << md << " (max |logit| " << mag << ")");
        CHECK(mag > 0.1);  // the logits are not trivially zero
        CHECK(md <= 1e-4 * std::max(1.0, mag));
        // The 8-bit activation path stays close on the block formats (it is not exact by design).
        if (q::is_block_quant(t)) {
          llama::engine e8(mq, 32, {.threads = 2, .batch = batch, .q8_activations = true});
          const auto l8 = e8.feed(prompt, true);
          double md8 = 0;
          for (size_t i = 0; i < l8.size(); ++i) md8 = std::max(md8, double(std::fabs(l8[i] - lf[i])));
          CHECK(md8 <= 0.05 * std::max(1.0, mag));
        }
      }
    }
  }
}

TEST_CASE("model types: an unsupported type is refused with a message naming the tensor and the type") {
  // A K-quant token embedding (d_model 256: one q6_k block per row).
  std::vector<tensor_data> ts = llama::test::llama_tensors(1, 256, 256, 4, 2, 80);
  ts[0].type = ggml_type::q6_k;
  ts[0].bytes.assign(size_t(80) * 210, std::byte{0});
  const auto kbytes = write_gguf(ts, 1, 256, 256, 4, 2);
  CHECK_THROWS_WITH(llama::model::from_file(llama::gguf::file::from_memory(kbytes), "kq"),
                    doctest::Contains("q6_k"));
}
