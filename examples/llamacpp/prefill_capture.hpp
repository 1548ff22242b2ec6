// What a prefill of the system turn in llama.cpp keeps for fairkv's attention scorers, read from llama.cpp's own
// graph through the public cb_eval hook (ggml_backend_sched_eval_callback), so the scorers need not recompute
// attention:
//
//   tensor (per layer il)         shape (ne0, ne1, ne2, ne3)             kept as
//   "Qcur-<il>", op ROPE          [head_dim, n_head, tokens, 1]          queries [tokens][n_head][head_dim]
//   "Kcur-<il>", op ROPE          [head_dim, n_head_kv, tokens, 1]       keys    [tokens][n_head_kv][head_dim]
//   "kq_soft_max-<il>", SOFT_MAX  [n_kv, tokens, n_head, 1]              colsum / rows / local_colsum
//
// The softmax tensor exists only without flash attention (with it, attention is one fused op): a context that
// captures statistics is made with flash attention off. Its rows are the causal softmax of each query of the
// ubatch over the n_kv cells of the stream, masked cells 0. The prefill starts on an empty sequence, so cell j
// holds token j and the ubatch's rows are tokens [fed, fed + tokens): checked on every call.
//
// The statistics are those of fairkv-llama's own prefill (examples/llama/forward.hpp, capture_options), added in
// the same order (ubatches in order, rows in order within one), so fairkv reads either engine's the same way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "forward.hpp"  // llama::capture_options, llama::add_local_row
#include "ggml-backend.h"
#include "ggml.h"

namespace llamacpp {

// One layer's statistics of the captured prefill (empty vectors: not asked for).
struct layer_stats {
  std::vector<float> q;             // [tokens][n_head][head_dim] post-RoPE queries
  std::vector<float> colsum;        // [n_head][n] H2O: sum over every query of its attention row
  std::vector<float> rows;          // [n_head][rows_n][n] the attention rows of the last rows_n queries
  int rows_n = 0;
  std::vector<float> local_colsum;  // [n_head][n] each query's row renormalised to its own region
  std::vector<float> k;             // [tokens][n_head_kv][head_dim] post-RoPE keys (the local sums' fallback)
  int fed = 0;                      // tokens whose softmax rows were read so far
  int q_fed = 0, k_fed = 0;         // tokens whose queries / keys were read so far
};

class prefill_capture {
 public:
  void init(int n_layer, int n_head, int n_head_kv, int head_dim, float scale) {
    n_layer_ = n_layer, n_head_ = n_head, n_head_kv_ = n_head_kv, head_dim_ = head_dim, scale_ = scale;
    layers_.assign(size_t(n_layer), {});
  }

  // Starts capturing what `what` asks for over the next `n` tokens fed to an empty sequence.
  void start(const llama::capture_options& what, int n) {
    what_ = what;
    n_ = n;
    error_.clear();
    const int rows = std::min(std::max(what.last_rows, 0), n);
    for (layer_stats& l : layers_) {
      l = layer_stats{};
      if (what.queries || !what.local_regions.empty()) l.q.reserve(size_t(n) * size_t(n_head_) * size_t(head_dim_));
      if (what.column_sums) l.colsum.assign(size_t(n_head_) * size_t(n), 0.0f);
      if (rows > 0) l.rows.assign(size_t(n_head_) * size_t(rows) * size_t(n), 0.0f);
      l.rows_n = rows;
      if (!what.local_regions.empty()) {
        l.local_colsum.assign(size_t(n_head_) * size_t(n), 0.0f);
        l.k.reserve(size_t(n) * size_t(n_head_kv_) * size_t(head_dim_));
      }
    }
    active_ = what.any();
  }
  // Starts keeping the post-RoPE queries of every token fed from now on, to a sequence in any state (a chat keeps
  // the queries of its cached tokens): each layer's q grows by the fed rows until take_queries or the next start.
  void start_queries() {
    what_ = {};
    what_.queries = true;
    n_ = std::numeric_limits<int>::max();
    error_.clear();
    for (layer_stats& l : layers_) l = layer_stats{};
    active_ = true;
  }
  // Layer l's queries captured since start_queries ([tokens][n_head][head_dim]), moved out.
  std::vector<float> take_queries(int l) { return std::exchange(layers_[size_t(l)].q, {}); }
  // Stops capturing; on error the statistics are unusable and error() says why.
  void stop() { active_ = false; }
  bool active() const { return active_; }
  const std::string& error() const { return error_; }
  const llama::capture_options& what() const { return what_; }
  int tokens() const { return n_; }
  int n_head() const { return n_head_; }
  int head_dim() const { return head_dim_; }
  const layer_stats& layer(int l) const { return layers_[size_t(l)]; }
  // Frees every statistic (compression read them).
  void clear() {
    for (layer_stats& l : layers_) l = layer_stats{};
    what_ = {};
    n_ = 0;
  }

  // ggml_backend_sched_eval_callback: `ask` selects the tensors to observe, then each is handed over computed.
  static bool callback(ggml_tensor* t, bool ask, void* user) {
    auto& self = *static_cast<prefill_capture*>(user);
    if (!self.active_) return ask ? false : true;
    const auto [kind, layer] = self.classify(t);
    if (ask) return kind != tensor_kind::none;
    if (kind == tensor_kind::none || !self.error_.empty()) return true;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
      self.fail(std::string("tensor ") + t->name + " is not a contiguous f32 tensor");
      return true;
    }
    const float* data = self.read(t);
    switch (kind) {
      case tensor_kind::queries: self.on_queries(t, layer, data); break;
      case tensor_kind::keys: self.on_keys(t, layer, data); break;
      case tensor_kind::softmax: self.on_softmax(t, layer, data); break;
      case tensor_kind::none: break;
    }
    return true;
  }

 private:
  enum class tensor_kind { none, queries, keys, softmax };

  std::pair<tensor_kind, int> classify(const ggml_tensor* t) const {
    auto layer_after = [&](const char* prefix) {
      const size_t n = std::strlen(prefix);
      if (std::strncmp(t->name, prefix, n) != 0) return -1;
      char* end = nullptr;
      const long l = std::strtol(t->name + n, &end, 10);
      return (end && end != t->name + n && *end == '\0' && l >= 0 && l < n_layer_) ? int(l) : -1;
    };
    const bool want_q = what_.queries || !what_.local_regions.empty();
    const bool want_rows = what_.column_sums || what_.last_rows > 0 || !what_.local_regions.empty();
    int l = -1;
    if (t->op == GGML_OP_ROPE && want_q && (l = layer_after("Qcur-")) >= 0) return {tensor_kind::queries, l};
    if (t->op == GGML_OP_ROPE && !what_.local_regions.empty() && (l = layer_after("Kcur-")) >= 0)
      return {tensor_kind::keys, l};
    if (t->op == GGML_OP_SOFT_MAX && want_rows && (l = layer_after("kq_soft_max-")) >= 0)
      return {tensor_kind::softmax, l};
    return {tensor_kind::none, -1};
  }

  void fail(std::string what) {
    if (error_.empty()) error_ = std::move(what);
  }

  // The tensor's values: in place when its buffer is host memory (the CPU backend), else copied.
  const float* read(const ggml_tensor* t) {
    if (t->buffer && ggml_backend_buffer_is_host(t->buffer)) return static_cast<const float*>(t->data);
    copy_.resize(size_t(ggml_nelements(t)));
    ggml_backend_tensor_get(t, copy_.data(), 0, copy_.size() * sizeof(float));
    return copy_.data();
  }

  // [head_dim, heads, tokens] rows appended to dst, checking the shape and that they continue the prefill.
  bool append_rows(const ggml_tensor* t, int heads, int& fed, std::vector<float>& dst, const float* data) {
    if (t->ne[0] != head_dim_ || t->ne[1] != heads || t->ne[3] != 1) {
      fail(std::string("tensor ") + t->name + " is not [head_dim, " + std::to_string(heads) + ", tokens]");
      return false;
    }
    const int tokens = int(t->ne[2]);
    if (fed + tokens > n_) {
      fail(std::string("tensor ") + t->name + ": more tokens than the " + std::to_string(n_) + " captured");
      return false;
    }
    dst.insert(dst.end(), data, data + size_t(tokens) * size_t(heads) * size_t(head_dim_));
    fed += tokens;
    return true;
  }

  void on_queries(const ggml_tensor* t, int l, const float* data) {
    layer_stats& s = layers_[size_t(l)];
    if (!what_.queries) {  // only the local sums' fallback reads them: keep this ubatch's rows only
      const int tokens = int(t->ne[2]);
      s.q.clear();
      int fed = s.fed;  // the ubatch starts where the softmax rows stopped
      if (append_rows(t, n_head_, fed, s.q, data)) s.q_fed = s.fed + tokens;
      return;
    }
    append_rows(t, n_head_, s.q_fed, s.q, data);
  }

  void on_keys(const ggml_tensor* t, int l, const float* data) {
    layer_stats& s = layers_[size_t(l)];
    append_rows(t, n_head_kv_, s.k_fed, s.k, data);
  }

  void on_softmax(const ggml_tensor* t, int l, const float* data) {
    layer_stats& s = layers_[size_t(l)];
    const int64_t n_kv = t->ne[0], tokens = t->ne[1];
    if (t->ne[2] != n_head_ || t->ne[3] != 1) {
      fail(std::string("tensor ") + t->name + " is not [n_kv, tokens, " + std::to_string(n_head_) + ", 1]");
      return;
    }
    const int first = s.fed;
    if (first + tokens > n_ || n_kv < first + tokens) {
      fail(std::string("tensor ") + t->name + ": rows of tokens [" + std::to_string(first) + ", " +
           std::to_string(first + tokens) + ") over " + std::to_string(n_kv) + " cells do not continue a prefill of " +
           std::to_string(n_) + " tokens from an empty sequence");
      return;
    }
    const bool local = !s.local_colsum.empty();
    const bool own_q = !what_.queries;  // s.q holds this ubatch only
    if (local && (s.k_fed < first + tokens || s.q_fed < first + tokens)) {
      fail(std::string("tensor ") + t->name + ": the ubatch's keys or queries were not captured before its softmax");
      return;
    }
    const int first_row = n_ - s.rows_n;
    const int group = n_head_ / n_head_kv_;
    for (int h = 0; h < n_head_; ++h)
      for (int64_t r = 0; r < tokens; ++r) {
        const int i = first + int(r);  // this query's token (= cell) index
        const float* row = data + (size_t(h) * size_t(tokens) + size_t(r)) * size_t(n_kv);
        const int visible = i + 1;
        if (!s.colsum.empty()) {
          float* cs = s.colsum.data() + size_t(h) * size_t(n_);
          for (int j = 0; j < visible; ++j) cs[j] += row[j];
        }
        if (local) {
          const auto it = std::prev(std::upper_bound(what_.local_regions.begin(), what_.local_regions.end(), i,
                                                     [](int x, const fairkv::segment& g) { return x < g.begin; }));
          const int rb = it->begin;
          // The region's probabilities underflow when its best logit lies more than 60 below the row's (the
          // threshold of fairkv-llama's prefill): its softmax is then taken from logits q.k * scale.
          float region_max = 0.0f;
          for (int j = rb; j < visible; ++j) region_max = std::max(region_max, row[j]);
          const float* logits = nullptr;
          if (region_max < std::exp(-60.0f)) {
            region_logits_.resize(size_t(visible));
            const size_t q_row = own_q ? size_t(r) : size_t(i);
            const float* q = s.q.data() + (q_row * size_t(n_head_) + size_t(h)) * size_t(head_dim_);
            for (int j = rb; j < visible; ++j) {
              const float* k = s.k.data() + (size_t(j) * size_t(n_head_kv_) + size_t(h / group)) * size_t(head_dim_);
              float dot = 0.0f;
              for (int d = 0; d < head_dim_; ++d) dot += q[d] * k[d];
              region_logits_[size_t(j)] = dot * scale_;
            }
            logits = region_logits_.data();
          }
          llama::add_local_row(row, logits, rb, i, s.local_colsum.data() + size_t(h) * size_t(n_));
        }
        if (s.rows_n > 0 && i >= first_row)
          std::copy_n(row, visible, s.rows.data() + (size_t(h) * size_t(s.rows_n) + size_t(i - first_row)) * size_t(n_));
      }
    s.fed = first + int(tokens);
  }

  int n_layer_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0;
  float scale_ = 1.0f;
  bool active_ = false;
  int n_ = 0;
  llama::capture_options what_;
  std::vector<layer_stats> layers_;
  std::vector<float> copy_, region_logits_;
  std::string error_;
};

}  // namespace llamacpp
