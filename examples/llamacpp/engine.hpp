// The unmodified llama.cpp, through its public C API only: model and context (RAII), tokenisation with byte
// offsets, prefill and greedy decode of sequence 0, the post-RoPE queries of a prefill captured through the
// cb_eval hook, and the sequence state as bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include "seq_state.hpp"
#include "tokenizer.hpp"  // llama::byte_range, llama::encoding (the runner's segment mapping reads them)

namespace llamacpp {

// The post-RoPE queries of every layer, [layer][token][q_head][head_dim], appended ubatch by ubatch while active.
// llama.cpp names two tensors "Qcur-<il>" in a Llama layer (the projection, then its RoPE): the ROPE one is taken.
struct query_capture {
  bool active = false;
  int n_layer = 0, n_head = 0, head_dim = 0;
  std::vector<std::vector<float>> q;  // [n_layer][tokens * n_head * head_dim]
  std::string error;                  // a tensor of an unexpected shape (then the capture is unusable)

  int tokens(int layer) const { return int(q[size_t(layer)].size() / (size_t(n_head) * size_t(head_dim))); }

  static int layer_of(const ggml_tensor* t) {
    if (t->op != GGML_OP_ROPE || std::strncmp(t->name, "Qcur-", 5) != 0) return -1;
    char* end = nullptr;
    const long l = std::strtol(t->name + 5, &end, 10);
    return (end && *end == '\0' && l >= 0) ? int(l) : -1;
  }

  // ggml_backend_sched_eval_callback: `ask` selects the tensors to observe, then each is handed over computed.
  static bool callback(ggml_tensor* t, bool ask, void* user) {
    auto& self = *static_cast<query_capture*>(user);
    const int l = self.active ? layer_of(t) : -1;
    if (ask) return l >= 0 && l < self.n_layer;
    if (l < 0 || l >= self.n_layer) return true;
    if (t->type != GGML_TYPE_F32 || t->ne[0] != self.head_dim || t->ne[1] != self.n_head || !ggml_is_contiguous(t)) {
      self.error = std::string("tensor ") + t->name + " is not a contiguous f32 [head_dim, n_head, tokens]";
      return true;
    }
    std::vector<float>& dst = self.q[size_t(l)];
    const size_t old = dst.size(), n = size_t(ggml_nelements(t));
    dst.resize(old + n);
    ggml_backend_tensor_get(t, dst.data() + old, 0, n * sizeof(float));
    return true;
  }
};

struct context_options {
  int n_ctx = 4096;
  int n_batch = 512;
  int threads = 0;                  // 0: llama.cpp's default
  int flash_attn = -1;              // -1 auto, 0 off (V transposed in the cache), 1 on
  ggml_type type_k = GGML_TYPE_F16; // a quantised type is accepted by llama.cpp and refused by the compressor
  ggml_type type_v = GGML_TYPE_F16;
};

class engine {
 public:
  engine(const std::string& model_path, const context_options& o) {
    static const bool backend_ready = [] {
      llama_log_set([](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) std::fputs(text, stderr);
      }, nullptr);
      llama_backend_init();
      return true;
    }();
    (void)backend_ready;
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model_.reset(llama_model_load_from_file(model_path.c_str(), mp));
    if (!model_) throw std::runtime_error("llama.cpp could not load '" + model_path + "'");
    vocab_ = llama_model_get_vocab(model_.get());
    n_layer_ = llama_model_n_layer(model_.get());
    n_head_ = llama_model_n_head(model_.get());
    n_head_kv_ = llama_model_n_head_kv(model_.get());
    head_dim_ = llama_model_n_embd(model_.get()) / n_head_;
    char buf[64];
    if (llama_model_meta_val_str(model_.get(), "llama.attention.key_length", buf, sizeof buf) > 0) head_dim_ = std::atoi(buf);
    capture_.n_layer = n_layer_;
    capture_.n_head = n_head_;
    capture_.head_dim = head_dim_;
    capture_.q.assign(size_t(n_layer_), {});

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(o.n_ctx);
    cp.n_batch = cp.n_ubatch = uint32_t(o.n_batch);
    cp.n_seq_max = 1;
    if (o.threads > 0) cp.n_threads = cp.n_threads_batch = o.threads;
    cp.flash_attn_type = o.flash_attn < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                                          : (o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED);
    cp.type_k = o.type_k;
    cp.type_v = o.type_v;
    cp.cb_eval = &query_capture::callback;
    cp.cb_eval_user_data = &capture_;
    cp.no_perf = true;
    ctx_.reset(llama_init_from_model(model_.get(), cp));
    if (!ctx_) throw std::runtime_error("llama.cpp could not create a context (n_ctx " + std::to_string(o.n_ctx) + ")");
    n_batch_ = o.n_batch;
  }

  llama_context* ctx() const { return ctx_.get(); }
  const llama_vocab* vocab() const { return vocab_; }
  int n_layer() const { return n_layer_; }
  int n_head() const { return n_head_; }
  int n_head_kv() const { return n_head_kv_; }
  int head_dim() const { return head_dim_; }
  int n_ctx_train() const { return llama_model_n_ctx_train(model_.get()); }
  bool mrope() const {
    const llama_rope_type r = llama_model_rope_type(model_.get());
    return r == LLAMA_ROPE_TYPE_MROPE || r == LLAMA_ROPE_TYPE_IMROPE || r == LLAMA_ROPE_TYPE_VISION;
  }
  query_capture& capture() { return capture_; }

  // Tokens of `text` (special-token text parsed, no BOS added: the chat template spells every token) and the
  // byte range of each, from the pieces llama.cpp renders; they must concatenate back to the text exactly.
  llama::encoding tokenize(std::string_view text) const {
    llama::encoding e;
    int n = -llama_tokenize(vocab_, text.data(), int32_t(text.size()), nullptr, 0, false, true);
    e.ids.resize(size_t(n > 0 ? n : 0));
    if (n > 0 && llama_tokenize(vocab_, text.data(), int32_t(text.size()), e.ids.data(), n, false, true) != n)
      throw std::runtime_error("llama_tokenize failed");
    size_t at = 0;
    for (llama_token id : e.ids) {
      const std::string p = piece(id, true);
      if (text.compare(at, p.size(), p) != 0)
        throw std::runtime_error("token pieces do not reproduce the text at byte " + std::to_string(at) +
                                 " (cannot map segments to tokens)");
      e.offsets.push_back({at, at + p.size()});
      at += p.size();
    }
    if (at != text.size()) throw std::runtime_error("token pieces cover " + std::to_string(at) + " of " +
                                                    std::to_string(text.size()) + " bytes");
    return e;
  }

  std::string piece(llama_token id, bool special) const {
    char buf[256];
    const int n = llama_token_to_piece(vocab_, id, buf, sizeof buf, 0, special);
    if (n < 0) {
      std::string big(size_t(-n), '\0');
      llama_token_to_piece(vocab_, id, big.data(), -n, 0, special);
      return big;
    }
    return std::string(buf, size_t(n));
  }

  // Feeds `ids` to sequence 0 at the positions after its last one, in chunks of n_batch, the logits of the last
  // token requested. capture_queries: the post-RoPE queries of these tokens are appended to capture().
  void feed(const std::vector<llama_token>& ids, bool capture_queries = false) {
    capture_.active = capture_queries;
    for (size_t i = 0; i < ids.size(); i += size_t(n_batch_)) {
      const int n = int(std::min(ids.size() - i, size_t(n_batch_)));
      llama_batch b = llama_batch_get_one(const_cast<llama_token*>(ids.data() + i), n);
      const int rc = llama_decode(ctx_.get(), b);
      if (rc != 0) {
        capture_.active = false;
        throw std::runtime_error("llama_decode failed (" + std::to_string(rc) + ")");
      }
    }
    capture_.active = false;
    if (!capture_.error.empty()) throw std::runtime_error("query capture: " + capture_.error);
  }
  void clear_queries() {
    for (auto& q : capture_.q) q.clear();
    capture_.error.clear();
  }

  std::vector<float> last_logits() const {
    const float* p = llama_get_logits_ith(ctx_.get(), -1);
    if (!p) throw std::runtime_error("llama.cpp returned no logits");
    return {p, p + llama_vocab_n_tokens(vocab_)};
  }

  static llama_token argmax(const std::vector<float>& logits) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;  // the lowest id among equal maxima, as the runner
    return llama_token(best);
  }

  // Greedy answer to an already fed prompt, up to max_new tokens or an end-of-generation token.
  std::vector<llama_token> generate(int max_new) {
    std::vector<llama_token> out;
    std::vector<float> logits = last_logits();
    for (int i = 0; i < max_new; ++i) {
      const llama_token t = argmax(logits);
      if (llama_vocab_is_eog(vocab_, t)) break;
      out.push_back(t);
      if (i + 1 == max_new) break;
      feed({t});
      logits = last_logits();
    }
    return out;
  }

  std::string detokenize(const std::vector<llama_token>& ids) const {
    std::string s;
    for (llama_token t : ids) s += piece(t, false);
    return s;
  }

  llama_memory_t memory() const { return llama_get_memory(ctx_.get()); }
  // Drops positions [p0, inf) of sequence 0 (p0 = 0: all of it).
  void truncate(llama_pos p0) { llama_memory_seq_rm(memory(), 0, p0, -1); }
  llama_pos last_pos() const { return llama_memory_seq_pos_max(memory(), 0); }

  std::vector<uint8_t> get_state() const {
    std::vector<uint8_t> s(llama_state_seq_get_size(ctx_.get(), 0));
    if (s.empty() || llama_state_seq_get_data(ctx_.get(), s.data(), s.size(), 0) != s.size())
      throw std::runtime_error("llama_state_seq_get_data failed");
    return s;
  }
  // Replaces sequence 0 by `s`; false if llama.cpp refused it (the sequence is then empty).
  bool set_state(const std::vector<uint8_t>& s) { return llama_state_seq_set_data(ctx_.get(), s.data(), s.size(), 0) == s.size(); }

  state_expectations expectations() const {
    state_expectations w;
    w.version = LLAMA_STATE_SEQ_VERSION;
    w.n_layer = uint32_t(n_layer_);
    w.n_embd_k = w.n_embd_v = uint32_t(n_head_kv_ * head_dim_);
    w.cell_ext = mrope();
    return w;
  }

 private:
  struct model_free { void operator()(llama_model* m) const { llama_model_free(m); } };
  struct ctx_free { void operator()(llama_context* c) const { llama_free(c); } };
  std::unique_ptr<llama_model, model_free> model_;
  std::unique_ptr<llama_context, ctx_free> ctx_;
  const llama_vocab* vocab_ = nullptr;
  int n_layer_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0, n_batch_ = 512;
  query_capture capture_;
};

}  // namespace llamacpp
