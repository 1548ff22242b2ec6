// Compress one sequence of a llama_context in place, through llama.cpp's public C API only: the sequence's state
// is read (llama_state_seq_get_data), compressed (fairkv/llamacpp/compress_state.hpp) and loaded back in its place
// (llama_state_seq_set_data). The next token of the sequence goes at the position it would have had uncompressed.
//
// Needs llama.h and libllama (CMake: link fairkv::llamacpp). The state layout is llama.cpp's at
// LLAMA_STATE_SEQ_VERSION 3 (llama-cpp-python 0.3.36); another version is refused with its number in the message.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

#include "fairkv/llamacpp/compress_state.hpp"

namespace fairkv::llamacpp {

namespace detail {

inline std::string model_meta(const llama_model* model, const std::string& key) {
  char buf[256];
  const int n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof buf);
  return n > 0 && n < int(sizeof buf) ? std::string(buf, std::size_t(n)) : std::string();
}

}  // namespace detail

// The state shape of ctx's model. kv_unified: whether the context was created with llama_context_params::kv_unified
// (llama.cpp then keeps one KV stream for all sequences, else one per sequence slot; no getter tells which).
[[nodiscard]] inline state_shape shape_of(const llama_context* ctx, bool kv_unified) {
  const llama_model* model = llama_get_model(ctx);
  state_shape s;
  s.n_head_kv = llama_model_n_head_kv(model);
  const int n_head = llama_model_n_head(model);
  s.head_dim = n_head > 0 ? llama_model_n_embd(model) / n_head : 0;
  const std::string arch = detail::model_meta(model, "general.architecture");
  if (const std::string kl = detail::model_meta(model, arch + ".attention.key_length"); !kl.empty())
    s.head_dim = std::atoi(kl.c_str());
  const llama_rope_type rope = llama_model_rope_type(model);
  s.expect.version = LLAMA_STATE_SEQ_VERSION;
  s.expect.n_layer = std::uint32_t(llama_model_n_layer(model));
  s.expect.n_embd_k = s.expect.n_embd_v = std::uint32_t(s.n_head_kv * s.head_dim);
  s.expect.n_stream = kv_unified ? 1u : llama_n_seq_max(ctx);
  s.expect.cell_ext = rope == LLAMA_ROPE_TYPE_MROPE || rope == LLAMA_ROPE_TYPE_IMROPE || rope == LLAMA_ROPE_TYPE_VISION;
  return s;
}

namespace detail {

// Reads sequence seq's state, compresses it with compress(bytes) -> compression (which writes the compressed state
// over the bytes it is given), and loads the result in its place. keep_original: compress a copy, so that on any
// failure the sequence holds what it held; else the one buffer is compressed, and only a load llama.cpp refuses
// (after the sequence was emptied for it) loses the sequence.
template <class Compress>
[[nodiscard]] compression round_trip(llama_context* ctx, llama_seq_id seq, bool keep_original, Compress&& compress) {
  compression out;
  std::vector<std::uint8_t> original(llama_state_seq_get_size(ctx, seq));
  if (original.empty() || llama_state_seq_get_data(ctx, original.data(), original.size(), seq) != original.size()) {
    out.error = "llama_state_seq_get_data: sequence " + std::to_string(seq) + " has no state to read";
    return out;
  }
  std::vector<std::uint8_t> work;
  if (keep_original) work = original;
  out = compress(keep_original ? work : original);
  if (!out.error.empty()) return out;
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_rm(mem, seq, -1, -1);
  if (llama_state_seq_set_data(ctx, out.state.data(), out.state.size(), seq) == out.state.size()) return out;
  llama_memory_seq_rm(mem, seq, -1, -1);
  const bool restored =
      keep_original && llama_state_seq_set_data(ctx, original.data(), original.size(), seq) == original.size();
  out.error = "llama.cpp refused the compressed state (" + std::to_string(out.state.size()) + " bytes); " +
              (restored        ? "the sequence was restored"
               : keep_original ? "restoring the original failed too: the sequence is empty"
                               : "the sequence is empty (request::keep_original was false)");
  out.state.clear();
  return out;
}

}  // namespace detail

// Compresses sequence `seq` of `ctx` in place for `req` (statistics_of and planner as compress_state takes them).
// On any failure the sequence holds what it held before (llama.cpp empties a sequence whose load fails; the
// original state is then loaded back) and `error` says why. The round trip holds the state twice at its peak (the
// original and the copy compressed in place); with req.keep_original false, once.
template <class Statistics, class Planner = inline_planner<>>
[[nodiscard]] compression compress_sequence(llama_context* ctx, llama_seq_id seq, const state_shape& shape,
                                            const request& req, Statistics&& statistics_of,
                                            const Planner& planner = {}) {
  auto unused = [](int, int) { return head_request{}; };
  return detail::round_trip(ctx, seq, req.keep_original, [&](std::vector<std::uint8_t>& bytes) {
    return detail::compress(bytes, shape, req, false, unused, statistics_of, planner, /*in_place=*/true);
  });
}

// The same with every (layer, KV head) planned on its own lists (compress_state_per_head): a sequence compressed
// again after earlier compactions, each head's segments and whitelist remapped through compression::head_plan.
template <class HeadRequests, class Statistics, class Planner = inline_planner<>>
[[nodiscard]] compression compress_sequence_per_head(llama_context* ctx, llama_seq_id seq, const state_shape& shape,
                                                     const request& req, HeadRequests&& head_request_of,
                                                     Statistics&& statistics_of, const Planner& planner = {}) {
  return detail::round_trip(ctx, seq, req.keep_original, [&](std::vector<std::uint8_t>& bytes) {
    return detail::compress(bytes, shape, req, true, head_request_of, statistics_of, planner, /*in_place=*/true);
  });
}

}  // namespace fairkv::llamacpp
