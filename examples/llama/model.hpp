// A Llama-architecture model read from a GGUF file: hyper-parameters and weight descriptors that point into
// the memory map. Nothing is copied: quantised matrices are multiplied block by block (quant.hpp), float
// vectors (norm weights) are read in place.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "quant.hpp"

namespace llama {

struct hparams {
  int n_layers = 0;
  int d_model = 0;     // embedding length
  int d_ff = 0;        // feed-forward length
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA: n_heads is a multiple)
  int head_dim = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
};

// A 2-D weight of ggml shape ne = [n_in, n_out]: n_out rows of n_in elements, row r at data + r * row_bytes.
struct matrix {
  std::string name;
  gguf::ggml_type type = gguf::ggml_type::f32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  size_t row_bytes = 0;
  const std::byte* data = nullptr;  // into the mmap

  const void* row(int64_t r) const noexcept { return data + size_t(r) * row_bytes; }
};

struct layer_weights {
  const float* attn_norm = nullptr;  // [d_model]
  matrix wq, wk, wv, wo;             // [d_model -> n_heads*hd], [-> n_kv*hd] x2, [n_heads*hd -> d_model]
  const float* ffn_norm = nullptr;   // [d_model]
  matrix w_gate, w_up, w_down;       // [d_model -> d_ff] x2, [d_ff -> d_model]
};

class model {
 public:
  static model load(const std::string& path) { return model(gguf::file::open(path), path); }
  // From an already opened file (e.g. gguf::file::from_memory in tests); `name` is used in messages.
  static model from_file(gguf::file f, std::string name) { return model(std::move(f), std::move(name)); }

  const hparams& hp() const noexcept { return hp_; }
  const matrix& token_embd() const noexcept { return token_embd_; }
  const matrix& output() const noexcept { return output_; }  // token_embd when the embeddings are tied
  bool tied_embeddings() const noexcept { return tied_; }
  const float* output_norm() const noexcept { return output_norm_; }
  const layer_weights& layer(int l) const { return layers_.at(size_t(l)); }
  const gguf::file& file() const noexcept { return file_; }
  const std::string& path() const noexcept { return path_; }

 private:
  model(gguf::file f, std::string path) : file_(std::move(f)), path_(std::move(path)) { init(); }

  // The hyper-parameters, each checked alone and against the others and against the tensors' extents; every
  // message names the GGUF key (or the tensor) it comes from, so a corrupted file never runs with garbage.
  void init() {
    const std::string arch = file_.has("general.architecture") ? file_.get_string("general.architecture") : "";
    if (arch != "llama") fail("general.architecture is '" + arch + "', the runner only implements 'llama'");
    constexpr int int_max = std::numeric_limits<int>::max();
    // Each block has 9 tensors, so a block count beyond what the file holds is corrupt (checked before any
    // allocation by it).
    hp_.n_layers = get_int("block_count", 1, int(std::min<size_t>(file_.tensors().size() / 9, size_t(int_max))),
                           " (each block has 9 tensors and the file holds " + std::to_string(file_.tensors().size()) +
                               ")");
    hp_.d_model = get_int("embedding_length", 1, int_max);
    hp_.d_ff = get_int("feed_forward_length", 1, int_max);
    hp_.n_heads = get_int("attention.head_count", 1, hp_.d_model, " (at most llama.embedding_length)");
    hp_.n_kv_heads = file_.has(key("attention.head_count_kv"))
                         ? get_int("attention.head_count_kv", 1, hp_.n_heads, " (at most llama.attention.head_count)")
                         : hp_.n_heads;
    if (hp_.n_heads % hp_.n_kv_heads != 0)
      fail(key("attention.head_count") + " = " + std::to_string(hp_.n_heads) + " is not a multiple of " +
           key("attention.head_count_kv") + " = " + std::to_string(hp_.n_kv_heads));
    if (hp_.d_model % hp_.n_heads != 0)
      fail(key("embedding_length") + " = " + std::to_string(hp_.d_model) + " is not " + key("attention.head_count") +
           " = " + std::to_string(hp_.n_heads) + " times a head dimension");
    hp_.head_dim = hp_.d_model / hp_.n_heads;
    if (hp_.head_dim % 2 != 0)
      fail("head dimension " + std::to_string(hp_.head_dim) + " (" + key("embedding_length") + " / " +
           key("attention.head_count") + ") is odd; RoPE rotates pairs");
    for (const char* k : {"attention.key_length", "attention.value_length", "rope.dimension_count"})
      if (file_.has(key(k)) && file_.get_u32(key(k)) != uint32_t(hp_.head_dim))
        fail(key(k) + " = " + std::to_string(file_.get_u32(key(k))) + " differs from the head dimension " +
             std::to_string(hp_.head_dim) + " (" + key("embedding_length") + " / " + key("attention.head_count") +
             "); separate key/value/RoPE dimensions are not implemented");
    if (file_.has(key("rope.scaling.type")) && file_.get_string(key("rope.scaling.type")) != "none")
      fail("RoPE scaling '" + file_.get_string(key("rope.scaling.type")) + "' (" + key("rope.scaling.type") +
           ") is not implemented");
    hp_.n_ctx_train = file_.has(key("context_length")) ? get_int("context_length", 1, int_max) : 0;
    hp_.rope_base = get_positive("rope.freq_base", hp_.rope_base);
    hp_.rms_eps = get_positive("attention.layer_norm_rms_epsilon", hp_.rms_eps);

    const std::string embd = key("embedding_length"), ff = key("feed_forward_length");
    token_embd_ = get_matrix("token_embd.weight", {hp_.d_model, embd}, {-1, "the vocabulary"});
    if (token_embd_.n_out < 1 || token_embd_.n_out > int_max)
      fail("token_embd.weight has " + std::to_string(token_embd_.n_out) + " rows (the vocabulary size)");
    hp_.n_vocab = int(token_embd_.n_out);
    if (file_.find_tensor("output.weight")) {
      output_ = get_matrix("output.weight", {hp_.d_model, embd}, {hp_.n_vocab, "rows of token_embd.weight"});
    } else {
      output_ = token_embd_;
      tied_ = true;
    }
    output_norm_ = get_vector("output_norm.weight", {hp_.d_model, embd});

    const int hd = hp_.head_dim;
    const extent d{hp_.d_model, embd}, q{int64_t(hp_.n_heads) * hd, key("attention.head_count") + " x head dim"},
        kv{int64_t(hp_.n_kv_heads) * hd, key("attention.head_count_kv") + " x head dim"}, f{hp_.d_ff, ff};
    layers_.resize(size_t(hp_.n_layers));
    for (int l = 0; l < hp_.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      layer_weights& lw = layers_[size_t(l)];
      lw.attn_norm = get_vector(p + "attn_norm.weight", d);
      lw.wq = get_matrix(p + "attn_q.weight", d, q);
      lw.wk = get_matrix(p + "attn_k.weight", d, kv);
      lw.wv = get_matrix(p + "attn_v.weight", d, kv);
      lw.wo = get_matrix(p + "attn_output.weight", q, d);
      lw.ffn_norm = get_vector(p + "ffn_norm.weight", d);
      lw.w_gate = get_matrix(p + "ffn_gate.weight", d, f);
      lw.w_up = get_matrix(p + "ffn_up.weight", d, f);
      lw.w_down = get_matrix(p + "ffn_down.weight", f, d);
    }
  }

  // An expected tensor extent and where it comes from (a GGUF key), for the messages; value < 0: any.
  struct extent {
    int64_t value;
    std::string source;
    std::string str() const { return value < 0 ? "*" : std::to_string(value) + " (" + source + ")"; }
  };

  static std::string key(const char* k) { return std::string("llama.") + k; }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("model '" + path_ + "': " + what);
  }
  // llama.<k>: an integer in [lo, hi] (`why` explains hi).
  int get_int(const char* k, int lo, int hi, const std::string& why = "") const {
    const uint32_t v = file_.get_u32(key(k));
    if (int64_t(v) < lo || int64_t(v) > hi)
      fail(key(k) + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" +
           why);
    return int(v);
  }
  // llama.<k> if present (else `fallback`): a finite float > 0.
  float get_positive(const char* k, float fallback) const {
    if (!file_.has(key(k))) return fallback;
    const float v = file_.get_f32(key(k));
    if (!(std::isfinite(v) && v > 0.0f)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", double(v));
      fail(key(k) + " = " + buf + " must be finite and positive");
    }
    return v;
  }

  matrix get_matrix(const std::string& name, const extent& n_in, const extent& n_out) const {
    const gguf::tensor_info& t = file_.tensor(name);
    quant::require_supported(t.type, name);
    if (t.ne.size() != 2 || int64_t(t.ne[0]) != n_in.value || (n_out.value >= 0 && int64_t(t.ne[1]) != n_out.value))
      fail("tensor '" + name + "' has shape " + shape_string(t) + ", expected [" + n_in.str() + ", " + n_out.str() +
           "]");
    if (gguf::block_size(t.type) > 1 && n_in.value % quant::qk != 0)
      fail("tensor '" + name + "': row length is not a multiple of the block size");
    matrix m;
    m.name = name;
    m.type = t.type;
    m.n_in = int64_t(t.ne[0]);
    m.n_out = int64_t(t.ne[1]);
    m.row_bytes = quant::row_bytes(t.type, m.n_in);
    m.data = t.data;
    return m;
  }

  const float* get_vector(const std::string& name, const extent& n) const {
    const gguf::tensor_info& t = file_.tensor(name);
    if (t.type != gguf::ggml_type::f32 || t.ne.size() != 1 || int64_t(t.ne[0]) != n.value)
      fail("tensor '" + name + "' must be f32 of shape [" + n.str() + "], it is " + gguf::type_name(t.type) + " " +
           shape_string(t));
    // GGUF aligns tensor data (32 bytes by default), so the pointer is suitably aligned for float.
    return reinterpret_cast<const float*>(t.data);
  }

  static std::string shape_string(const gguf::tensor_info& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.ne.size(); ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
    return s + "]";
  }

  gguf::file file_;
  std::string path_;
  hparams hp_;
  matrix token_embd_;  // [d_model, n_vocab]
  matrix output_;      // [d_model, n_vocab]
  bool tied_ = false;
  const float* output_norm_ = nullptr;  // [d_model]
  std::vector<layer_weights> layers_;
};

}  // namespace llama
