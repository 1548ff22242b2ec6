// What the llama.cpp benches share: MODEL TOKENS [ROUNDS] [THREADS] from the command line, a context sized for
// TOKENS, a fixed token sequence without repetition structure, and a median.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine.hpp"
#include "model_path.hpp"

namespace fairkv_bench {

struct llamacpp_args {
  std::string model;  // as given (a name or a path)
  std::string path;   // resolved
  int tokens = 0, rounds = 5;
  llamacpp::context_options context;
};

// Parses MODEL TOKENS [ROUNDS] [THREADS]; prints the usage and exits with 2 when they are missing.
inline llamacpp_args parse_llamacpp_args(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL TOKENS [ROUNDS] [THREADS]\n", argv[0]);
    std::exit(2);
  }
  llamacpp_args a;
  a.model = argv[1];
  a.path = llama::resolve_model(argv[1]);
  a.tokens = std::atoi(argv[2]);
  a.rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  a.context.n_ctx = a.tokens + 16;
  a.context.threads = argc > 4 ? std::atoi(argv[4]) : llama::default_threads();
  return a;
}

inline std::vector<llama_token> bench_tokens(int n) {
  std::vector<llama_token> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = llama_token(1000 + (i * 7919) % 20000);
  return ids;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace fairkv_bench
