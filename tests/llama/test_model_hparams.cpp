// Model files are untrusted: every hyper-parameter is checked alone, against the others and against the tensors'
// extents, and a corrupted value is refused with a message naming its GGUF key (or the tensor), never run with
// garbage. One subcase per corrupted key and value, on a tiny Llama written by gguf_test_writer.hpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gguf_test_writer.hpp"
#include "model.hpp"

namespace {

using llama::test::meta;
using llama::test::tensor_data;

constexpr int layers = 2, d = 64, ff = 128, heads = 4, kv = 2, vocab = 80;

struct corrupted_file {
  std::vector<meta> metadata = llama::test::llama_metadata(layers, d, ff, heads, kv);
  std::vector<tensor_data> tensors = llama::test::llama_tensors(layers, d, ff, heads, kv, vocab);

  // Sets `key` (appended if absent).
  corrupted_file& set(const std::string& key, std::variant<uint32_t, float, std::string> value) {
    for (meta& m : metadata)
      if (m.key == key) {
        m.value = std::move(value);
        return *this;
      }
    metadata.push_back({key, std::move(value)});
    return *this;
  }
  tensor_data& tensor(const std::string& name) {
    for (tensor_data& t : tensors)
      if (t.name == name) return t;
    FAIL("no tensor " << name);
    return tensors.front();
  }
  std::string load_error() const {
    try {
      (void)llama::model::from_file(llama::gguf::file::from_memory(llama::test::write_gguf(metadata, tensors)),
                                    "corrupted");
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
};

struct bad_key {
  const char* key;
  std::variant<uint32_t, float, std::string> value;
  const char* message;  // the error must contain this (the key, or what it is checked against)
};

}  // namespace

TEST_CASE("model hparams: the uncorrupted tiny model loads") {
  corrupted_file f;
  CHECK(f.load_error() == "");
  f.set("llama.context_length", uint32_t(256)).set("llama.rope.dimension_count", uint32_t(16));
  f.set("llama.attention.key_length", uint32_t(16)).set("llama.attention.value_length", uint32_t(16));
  CHECK(f.load_error() == "");
}

TEST_CASE("model hparams: every corrupted key is refused with a message naming it") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<bad_key> table = {
      {"general.architecture", std::string("gpt2"), "general.architecture"},
      {"llama.block_count", uint32_t(0), "llama.block_count = 0"},
      {"llama.block_count", uint32_t(0xFFFFFFFF), "llama.block_count = 4294967295"},
      {"llama.block_count", uint32_t(3), "llama.block_count = 3"},  // the file holds 2 blocks' tensors
      {"llama.block_count", 2.0f, "llama.block_count"},             // not an integer
      {"llama.embedding_length", uint32_t(0), "llama.embedding_length = 0"},
      {"llama.embedding_length", uint32_t(0x80000000), "llama.embedding_length = 2147483648"},
      {"llama.embedding_length", uint32_t(4), "head dimension 1"},   // 4 heads of 1: odd, RoPE needs pairs
      {"llama.embedding_length", uint32_t(12), "head dimension 3"},  // 4 heads of 3
      {"llama.embedding_length", uint32_t(66), "llama.embedding_length = 66 is not"},  // not 4 x head_dim
      {"llama.embedding_length", uint32_t(32), "llama.embedding_length"},  // valid alone, not the tensors' 64
      {"llama.feed_forward_length", uint32_t(0), "llama.feed_forward_length = 0"},
      {"llama.feed_forward_length", uint32_t(96), "llama.feed_forward_length"},  // not the tensors' 128
      {"llama.attention.head_count", uint32_t(0), "llama.attention.head_count = 0"},
      {"llama.attention.head_count", uint32_t(128), "llama.attention.head_count = 128"},  // > embedding_length
      {"llama.attention.head_count", uint32_t(3), "llama.attention.head_count = 3"},      // 2 kv heads
      {"llama.attention.head_count", uint32_t(8), "llama.attention.head_count"},  // head_dim 8: not the tensors'
      {"llama.attention.head_count_kv", uint32_t(0), "llama.attention.head_count_kv = 0"},
      {"llama.attention.head_count_kv", uint32_t(3), "llama.attention.head_count_kv = 3"},
      {"llama.attention.head_count_kv", uint32_t(8), "llama.attention.head_count_kv = 8"},  // > head_count
      {"llama.attention.head_count_kv", uint32_t(1), "llama.attention.head_count_kv"},  // not the tensors' 2
      {"llama.context_length", uint32_t(0), "llama.context_length = 0"},
      {"llama.context_length", uint32_t(0xFFFFFFFF), "llama.context_length = 4294967295"},
      {"llama.rope.freq_base", 0.0f, "llama.rope.freq_base = 0"},
      {"llama.rope.freq_base", -10000.0f, "llama.rope.freq_base = -10000"},
      {"llama.rope.freq_base", nan, "llama.rope.freq_base = nan"},
      {"llama.rope.freq_base", inf, "llama.rope.freq_base = inf"},
      {"llama.rope.freq_base", std::string("1e4"), "llama.rope.freq_base"},  // not a number
      {"llama.attention.layer_norm_rms_epsilon", -1e-5f, "llama.attention.layer_norm_rms_epsilon = -1e-05"},
      {"llama.attention.layer_norm_rms_epsilon", 0.0f, "llama.attention.layer_norm_rms_epsilon = 0"},
      {"llama.attention.layer_norm_rms_epsilon", nan, "llama.attention.layer_norm_rms_epsilon = nan"},
      {"llama.rope.dimension_count", uint32_t(8), "llama.rope.dimension_count = 8"},
      {"llama.attention.key_length", uint32_t(32), "llama.attention.key_length = 32"},
      {"llama.attention.value_length", uint32_t(8), "llama.attention.value_length = 8"},
      {"llama.rope.scaling.type", std::string("yarn"), "llama.rope.scaling.type"},
  };
  for (const bad_key& row : table) {
    const std::string name = std::string(row.key) + " " + std::to_string(&row - table.data());
    SUBCASE(name.c_str()) {
      corrupted_file f;
      f.set(row.key, row.value);
      const std::string err = f.load_error();
      CAPTURE(err);
      CHECK(err.find(row.message) != std::string::npos);
    }
  }
}

TEST_CASE("model hparams: tensor extents must agree with the hyper-parameters and may not overlap") {
  SUBCASE("a tensor's shape names the keys it is checked against") {
    corrupted_file f;
    f.set("llama.attention.head_count_kv", uint32_t(1));
    CHECK(f.load_error().find("[64 (llama.embedding_length), 16 (llama.attention.head_count_kv x head dim)]") !=
          std::string::npos);
  }
  SUBCASE("a missing block tensor is named") {
    corrupted_file f;
    f.tensors.pop_back();                                         // blk.1.ffn_down.weight
    f.tensors.push_back(llama::test::llama_tensors(1, d, ff, heads, kv, vocab)[1]);  // keep the tensor count
    f.tensors.back().name = "extra.weight";
    CHECK(f.load_error().find("blk.1.ffn_down.weight") != std::string::npos);
  }
  SUBCASE("an untied output with another vocabulary") {
    corrupted_file f;
    f.tensors.push_back(llama::test::llama_tensors(0, d, ff, heads, kv, vocab + 1)[0]);
    f.tensors.back().name = "output.weight";
    CHECK(f.load_error().find("output.weight") != std::string::npos);
  }
  SUBCASE("a norm vector of the wrong length") {
    corrupted_file f;
    f.tensor("blk.0.ffn_norm.weight").ne = {32};
    f.tensor("blk.0.ffn_norm.weight").bytes.resize(32 * 4);
    CHECK(f.load_error().find("blk.0.ffn_norm.weight") != std::string::npos);
  }
  SUBCASE("an aliased tensor (same offset as another)") {
    corrupted_file f;
    f.tensor("blk.1.attn_q.weight").offset = 0;  // token_embd.weight's data
    const std::string err = f.load_error();
    CAPTURE(err);
    CHECK(err.find("overlap") != std::string::npos);
    CHECK(err.find("blk.1.attn_q.weight") != std::string::npos);
  }
  SUBCASE("a tensor overlapping the next one") {
    corrupted_file f;
    f.tensor("output_norm.weight").offset = uint64_t(d) * vocab * 4 - 32;  // the last 32 bytes of token_embd
    const std::string err = f.load_error();
    CAPTURE(err);
    CHECK(err.find("overlap") != std::string::npos);
    CHECK(err.find("token_embd.weight") != std::string::npos);
  }
}
