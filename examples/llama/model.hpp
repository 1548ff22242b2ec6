// A Llama-architecture model read from a GGUF file: hyper-parameters and weight descriptors that point into
// the memory map. Nothing is copied: quantised matrices are multiplied block by block (quant.hpp), float
// vectors (norm weights) are read in place.
#pragma once

#include <cstdint>
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

  void init() {
    const std::string arch = file_.has("general.architecture") ? file_.get_string("general.architecture") : "";
    if (arch != "llama")
      throw std::runtime_error("model '" + path_ + "': general.architecture is '" + arch +
                               "', the runner only implements 'llama'");
    auto key = [](const char* k) { return std::string("llama.") + k; };
    hp_.n_layers = int(file_.get_u32(key("block_count")));
    hp_.d_model = int(file_.get_u32(key("embedding_length")));
    hp_.d_ff = int(file_.get_u32(key("feed_forward_length")));
    hp_.n_heads = int(file_.get_u32(key("attention.head_count")));
    hp_.n_kv_heads = file_.has(key("attention.head_count_kv")) ? int(file_.get_u32(key("attention.head_count_kv")))
                                                               : hp_.n_heads;
    if (hp_.n_heads <= 0 || hp_.n_kv_heads <= 0 || hp_.n_heads % hp_.n_kv_heads != 0 ||
        hp_.d_model % hp_.n_heads != 0)
      throw std::runtime_error("model: head counts do not divide (" + std::to_string(hp_.n_heads) + " heads, " +
                               std::to_string(hp_.n_kv_heads) + " kv heads, d_model " +
                               std::to_string(hp_.d_model) + ")");
    hp_.head_dim = hp_.d_model / hp_.n_heads;
    if (file_.has(key("rope.dimension_count")) && int(file_.get_u32(key("rope.dimension_count"))) != hp_.head_dim)
      throw std::runtime_error("model: partial RoPE (rope.dimension_count != head_dim) is not implemented");
    if (file_.has(key("rope.scaling.type")) && file_.get_string(key("rope.scaling.type")) != "none")
      throw std::runtime_error("model: RoPE scaling '" + file_.get_string(key("rope.scaling.type")) +
                               "' is not implemented");
    hp_.n_ctx_train = file_.has(key("context_length")) ? int(file_.get_u32(key("context_length"))) : 0;
    if (file_.has(key("rope.freq_base"))) hp_.rope_base = file_.get_f32(key("rope.freq_base"));
    if (file_.has(key("attention.layer_norm_rms_epsilon")))
      hp_.rms_eps = file_.get_f32(key("attention.layer_norm_rms_epsilon"));

    token_embd_ = get_matrix("token_embd.weight", hp_.d_model, -1);
    hp_.n_vocab = int(token_embd_.n_out);
    if (file_.find_tensor("output.weight")) {
      output_ = get_matrix("output.weight", hp_.d_model, hp_.n_vocab);
    } else {
      output_ = token_embd_;
      tied_ = true;
    }
    output_norm_ = get_vector("output_norm.weight", hp_.d_model);

    const int hd = hp_.head_dim, q_dim = hp_.n_heads * hd, kv_dim = hp_.n_kv_heads * hd;
    layers_.resize(size_t(hp_.n_layers));
    for (int l = 0; l < hp_.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      layer_weights& lw = layers_[size_t(l)];
      lw.attn_norm = get_vector(p + "attn_norm.weight", hp_.d_model);
      lw.wq = get_matrix(p + "attn_q.weight", hp_.d_model, q_dim);
      lw.wk = get_matrix(p + "attn_k.weight", hp_.d_model, kv_dim);
      lw.wv = get_matrix(p + "attn_v.weight", hp_.d_model, kv_dim);
      lw.wo = get_matrix(p + "attn_output.weight", q_dim, hp_.d_model);
      lw.ffn_norm = get_vector(p + "ffn_norm.weight", hp_.d_model);
      lw.w_gate = get_matrix(p + "ffn_gate.weight", hp_.d_model, hp_.d_ff);
      lw.w_up = get_matrix(p + "ffn_up.weight", hp_.d_model, hp_.d_ff);
      lw.w_down = get_matrix(p + "ffn_down.weight", hp_.d_ff, hp_.d_model);
    }
  }

  // n_out < 0: any number of rows.
  matrix get_matrix(const std::string& name, int64_t n_in, int64_t n_out) const {
    const gguf::tensor_info& t = file_.tensor(name);
    quant::require_supported(t.type, name);
    if (t.ne.size() != 2 || int64_t(t.ne[0]) != n_in || (n_out >= 0 && int64_t(t.ne[1]) != n_out))
      throw std::runtime_error("tensor '" + name + "' has shape " + shape_string(t) + ", expected [" +
                               std::to_string(n_in) + ", " + (n_out >= 0 ? std::to_string(n_out) : "*") + "]");
    if (gguf::block_size(t.type) > 1 && n_in % quant::qk != 0)
      throw std::runtime_error("tensor '" + name + "': row length is not a multiple of the block size");
    matrix m;
    m.name = name;
    m.type = t.type;
    m.n_in = int64_t(t.ne[0]);
    m.n_out = int64_t(t.ne[1]);
    m.row_bytes = quant::row_bytes(t.type, m.n_in);
    m.data = t.data;
    return m;
  }

  const float* get_vector(const std::string& name, int64_t n) const {
    const gguf::tensor_info& t = file_.tensor(name);
    if (t.type != gguf::ggml_type::f32 || t.ne.size() != 1 || int64_t(t.ne[0]) != n)
      throw std::runtime_error("tensor '" + name + "' must be f32 of shape [" + std::to_string(n) + "], it is " +
                               gguf::type_name(t.type) + " " + shape_string(t));
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
