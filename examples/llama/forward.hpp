// The Llama forward pass on the CPU: token embedding, 30 x (RMSNorm, GQA attention with RoPE, RMSNorm,
// SwiGLU MLP), final RMSNorm and the (tied) output projection.
//
// Matrix products run on the quantised blocks (quant.hpp) and are split over output rows between the threads
// of a small pool (thread_pool.hpp); a batch of tokens (prefill) shares one pass over each weight row, one token (decode) is a matvec.
// Attention uses Eigen on the cache in place. Each KV head attends to its own length, so a head-adaptive
// compressed (ragged) cache is handled exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <thread>
#include <utility>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/Core>


#include "kv_cache.hpp"
#include "model.hpp"
#include "quant.hpp"
#include "thread_pool.hpp"

namespace llama {

inline int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

struct forward_options {
  int threads = 0;           // 0: all hardware threads
  int batch = 128;           // prefill chunk (tokens per matrix-matrix pass)
  bool q8_activations = false;  // llama.cpp-style 8-bit activations: faster, less exact (see matmul)
};

class engine {
 public:
  // capacity: tokens per KV head the cache can hold.
  engine(const model& m, int capacity, forward_options opt = {})
      : m_(m), hp_(m.hp()), opt_(opt),
        cache_(hp_.n_layers, hp_.n_heads, hp_.n_kv_heads, hp_.head_dim, capacity) {
    if (opt_.threads <= 0) opt_.threads = default_threads();
    if (opt_.batch <= 0) opt_.batch = 128;
    pool_ = std::make_unique<thread_pool>(opt_.threads);
    // RoPE inverse frequencies, in float like the reference (transformers) computes them.
    inv_freq_.resize(size_t(hp_.head_dim / 2));
    for (int i = 0; i < hp_.head_dim / 2; ++i)
      inv_freq_[size_t(i)] = 1.0f / std::pow(hp_.rope_base, float(2 * i) / float(hp_.head_dim));
  }

  const hparams& hp() const noexcept { return hp_; }
  kv_cache& cache() noexcept { return cache_; }
  const kv_cache& cache() const noexcept { return cache_; }
  int threads() const noexcept { return opt_.threads; }

  // Absolute position of the next token: the number of tokens ever fed, evicted ones included (kvpress).
  int n_past() const noexcept { return n_past_; }
  void set_n_past(int n) noexcept { n_past_ = n; }
  void reset() {
    cache_.clear();
    n_past_ = 0;
  }

  // Feeds tokens (in chunks of opt.batch), appending them to the cache. Returns the logits of the last token
  // ([n_vocab]), or of every token ([n_tokens][n_vocab]) when all_logits. capture_queries keeps the
  // post-RoPE queries of these tokens in each layer's sys_q ([n_heads][n_tokens][head_dim]).
  // on_chunk(done, total) reports progress after each chunk.
  std::vector<float> feed(std::span<const int32_t> tokens, bool all_logits = false, bool capture_queries = false,
                          const std::function<void(int, int)>& on_chunk = {}) {
    const int n = int(tokens.size());
    if (n == 0) throw std::runtime_error("engine::feed: no tokens");
    for (int32_t t : tokens)
      if (t < 0 || t >= hp_.n_vocab)
        throw std::runtime_error("engine::feed: token id " + std::to_string(t) + " outside the vocabulary");
    cache_.require_room(n);
    if (capture_queries)
      for (int l = 0; l < hp_.n_layers; ++l)
        cache_.layer(l).sys_q.assign(size_t(hp_.n_heads) * size_t(n) * size_t(hp_.head_dim), 0.0f);

    std::vector<float> logits(size_t(all_logits ? n : 1) * size_t(hp_.n_vocab));
    for (int start = 0; start < n; start += opt_.batch) {
      const int count = std::min(opt_.batch, n - start);
      const bool last_chunk = start + count == n;
      forward_chunk(tokens.subspan(size_t(start), size_t(count)), capture_queries ? start : -1, n);
      if (all_logits)
        output_logits(0, count, logits.data() + size_t(start) * size_t(hp_.n_vocab));
      else if (last_chunk)
        output_logits(count - 1, 1, logits.data());
      if (on_chunk) on_chunk(start + count, n);
    }
    return logits;
  }

 private:
  using mat_rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  // One chunk of T tokens through every layer. q_capture_at >= 0: index of this chunk's first token in the
  // captured queries (of n_capture tokens).
  void forward_chunk(std::span<const int32_t> tokens, int q_capture_at, int n_capture) {
    const int T = int(tokens.size());
    const int d = hp_.d_model, hd = hp_.head_dim, q_dim = hp_.n_heads * hd, kv_dim = hp_.n_kv_heads * hd;
    x_.resize(size_t(T) * d);       // [T, d_model] residual stream
    xn_.resize(size_t(T) * d);      // [T, d_model] normalised
    q_.resize(size_t(T) * q_dim);   // [T, n_heads*hd]
    k_.resize(size_t(T) * kv_dim);  // [T, n_kv*hd]
    v_.resize(size_t(T) * kv_dim);  // [T, n_kv*hd]
    att_.resize(size_t(T) * q_dim); // [T, n_heads*hd]
    gate_.resize(size_t(T) * hp_.d_ff);  // [T, d_ff]
    up_.resize(size_t(T) * hp_.d_ff);    // [T, d_ff]
    tmp_.resize(size_t(T) * d);          // [T, d_model]

    for (int t = 0; t < T; ++t)
      quant::dequantize_row(m_.token_embd().type, m_.token_embd().row(tokens[size_t(t)]), x_.data() + size_t(t) * d,
                            d);

    for (int l = 0; l < hp_.n_layers; ++l) {
      const layer_weights& w = m_.layer(l);
      rms_norm(x_.data(), w.attn_norm, xn_.data(), T, d);
      matmul({{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}}, xn_.data(), T);
      for (int t = 0; t < T; ++t) {
        const int pos = n_past_ + t;
        for (int h = 0; h < hp_.n_heads; ++h) rope(q_.data() + size_t(t) * q_dim + size_t(h) * hd, pos);
        for (int h = 0; h < hp_.n_kv_heads; ++h) rope(k_.data() + size_t(t) * kv_dim + size_t(h) * hd, pos);
      }
      if (q_capture_at >= 0) {
        std::vector<float>& sq = cache_.layer(l).sys_q;  // [n_heads, n_capture, hd]
        for (int h = 0; h < hp_.n_heads; ++h)
          for (int t = 0; t < T; ++t)
            std::copy_n(q_.data() + size_t(t) * q_dim + size_t(h) * hd, hd,
                        sq.data() + (size_t(h) * size_t(n_capture) + size_t(q_capture_at + t)) * size_t(hd));
      }
      append_kv(l, T);
      attention(l, T);
      matmul({{&w.wo, tmp_.data()}}, att_.data(), T);
      for (size_t i = 0; i < size_t(T) * d; ++i) x_[i] += tmp_[i];

      rms_norm(x_.data(), w.ffn_norm, xn_.data(), T, d);
      matmul({{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}}, xn_.data(), T);
      for (size_t i = 0; i < size_t(T) * hp_.d_ff; ++i) {
        const float g = gate_[i];
        gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];  // SiLU(gate) * up
      }
      matmul({{&w.w_down, tmp_.data()}}, gate_.data(), T);
      for (size_t i = 0; i < size_t(T) * d; ++i) x_[i] += tmp_[i];
    }
    n_past_ += T;
    last_T_ = T;
  }

  // Final norm and output projection of rows [first, first+count) of the last chunk: out[count][n_vocab].
  void output_logits(int first, int count, float* out) {
    const int d = hp_.d_model;
    xn_.resize(size_t(count) * d);
    rms_norm(x_.data() + size_t(first) * d, m_.output_norm(), xn_.data(), count, d);
    matmul({{&m_.output(), out}}, xn_.data(), count);
  }

  static void rms_norm_row(const float* x, const float* w, float* y, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    const float r = 1.0f / std::sqrt(ss / float(n) + eps);
    for (int i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
  }
  void rms_norm(const float* x, const float* w, float* y, int T, int n) const {
    for (int t = 0; t < T; ++t) rms_norm_row(x + size_t(t) * n, w, y + size_t(t) * n, n, hp_.rms_eps);
  }

  // "Normal" RoPE on adjacent pairs (x[2i], x[2i+1]): llama.cpp's convention for arch llama, equal to HF's
  // rotate_half because the GGUF converter permuted the rows of attn_q / attn_k.
  void rope(float* x, int pos) const {
    for (int i = 0; i < hp_.head_dim / 2; ++i) {
      const float a = float(pos) * inv_freq_[size_t(i)];
      const float c = std::cos(a), s = std::sin(a);
      const float x0 = x[2 * i], x1 = x[2 * i + 1];
      x[2 * i] = x0 * c - x1 * s;
      x[2 * i + 1] = x0 * s + x1 * c;
    }
  }

  // New keys/values of this chunk go after each head's current length.
  void append_kv(int l, int T) {
    const int hd = hp_.head_dim, kv_dim = hp_.n_kv_heads * hd;
    kv_layer& cl = cache_.layer(l);
    for (int g = 0; g < hp_.n_kv_heads; ++g) {
      const int base = cl.len[size_t(g)];
      for (int t = 0; t < T; ++t) {
        std::copy_n(k_.data() + size_t(t) * kv_dim + size_t(g) * hd, hd, cache_.k_row(l, g, base + t));
        std::copy_n(v_.data() + size_t(t) * kv_dim + size_t(g) * hd, hd, cache_.v_row(l, g, base + t));
      }
      cl.len[size_t(g)] = base + T;
    }
  }

  // Causal GQA attention of the chunk's T queries over each KV head's own cache rows; writes att_[T][q_dim].
  void attention(int l, int T) {
    const int hd = hp_.head_dim, q_dim = hp_.n_heads * hd, group = hp_.n_heads / hp_.n_kv_heads;
    const float scale = 1.0f / std::sqrt(float(hd));
    const kv_layer& cl = cache_.layer(l);
    // A decode step over a short cache is too little work to be worth a barrier.
    const bool parallel = int64_t(T) * cache_.max_len(l) >= 2048;
    auto heads = [&](int64_t h_begin, int64_t h_end) {
    for (int h = int(h_begin); h < int(h_end); ++h) {
      const int g = h / group;
      const int L = cl.len[size_t(g)];  // includes this chunk's T tokens
      const int past = L - T;
      thread_local mat_rm s;  // [T, L] scores, then probabilities
      s.resize(T, L);
      Eigen::Map<const mat_rm, 0, Eigen::OuterStride<>> q(q_.data() + size_t(h) * hd, T, hd,
                                                           Eigen::OuterStride<>(q_dim));
      Eigen::Map<const mat_rm> k(cache_.k_row(l, g, 0), L, hd);  // [L, hd]
      Eigen::Map<const mat_rm> v(cache_.v_row(l, g, 0), L, hd);  // [L, hd]
      s.noalias() = q * k.transpose();
      for (int t = 0; t < T; ++t) {
        const int visible = past + t + 1;  // causal: the query at cache row past+t sees rows [0, past+t]
        auto row = s.row(t);
        float mx = -INFINITY;
        for (int j = 0; j < visible; ++j) mx = std::max(mx, row(j) * scale);
        float sum = 0.0f;
        for (int j = 0; j < visible; ++j) {
          const float e = std::exp(row(j) * scale - mx);
          row(j) = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j < visible; ++j) row(j) *= inv;
        for (int j = visible; j < L; ++j) row(j) = 0.0f;
      }
      Eigen::Map<mat_rm, 0, Eigen::OuterStride<>> o(att_.data() + size_t(h) * hd, T, hd,
                                                    Eigen::OuterStride<>(q_dim));
      o.noalias() = s * v;
    }
    };
    if (parallel) pool_->parallel_for(hp_.n_heads, heads);
    else heads(0, hp_.n_heads);
  }

  // One output of a matmul: y[T][w->n_out] = x[T][n_in] . W^T.
  struct matmul_job {
    const matrix* w;
    float* y;
  };

  // Several products of the same input x[T][n_in] (Q/K/V, gate/up) in ONE parallel loop over their
  // concatenated output rows: one barrier instead of one per matrix, which matters when cores are contended.
  //  - exact (default): a few tokens (decode) multiply each weight block expanded in registers with the float
  //    activations; a batch (prefill) expands a tile of weight rows to floats once and multiplies it with
  //    all tokens in one Eigen matrix product.
  //  - q8_activations: llama.cpp's scheme, the rows of x quantised once to 8-bit blocks and integer block dots.
  void matmul(std::initializer_list<matmul_job> jobs_in, const float* x, int T) {
    const std::vector<matmul_job> jobs(jobs_in);
    const int64_t n_in = jobs.front().w->n_in, nb = n_in / quant::qk;
    constexpr int64_t tile = 32;  // rows per work item: 32 x 1536 expanded floats = 192 KiB at most
    // Work items: (job, first row) tiles over every job's rows.
    std::vector<std::pair<int, int64_t>> items;
    bool any_block = false;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (jobs[j].w->n_in != n_in) throw std::logic_error("matmul: jobs with different input sizes");
      any_block = any_block || quant::is_block_quant(jobs[j].w->type);
      for (int64_t r0 = 0; r0 < jobs[j].w->n_out; r0 += tile) items.emplace_back(int(j), r0);
    }
    const bool q8 = opt_.q8_activations && any_block;
    if (q8) {
      xq_.resize(size_t(T) * size_t(nb));  // [T, n_in/32]
      for (int t = 0; t < T; ++t) quant::quantize_row_q8_act(x + size_t(t) * n_in, xq_.data() + size_t(t) * nb, n_in);
    }
    const bool gemm = !q8 && T >= gemm_min_tokens;
    if (!gemm) {
      xsum_.resize(size_t(T) * size_t(nb));  // [T, n_in/32] block sums of x
      for (int t = 0; t < T; ++t) quant::block_sums(x + size_t(t) * n_in, xsum_.data() + size_t(t) * nb, n_in);
    }
    pool_->parallel_for(int64_t(items.size()), [&](int64_t it_begin, int64_t it_end) {
    for (int64_t it = it_begin; it < it_end; ++it) {
      const matrix& w = *jobs[size_t(items[size_t(it)].first)].w;
      float* y = jobs[size_t(items[size_t(it)].first)].y;
      const int64_t r0 = items[size_t(it)].second, rows = std::min(tile, w.n_out - r0), n_out = w.n_out;
      if (gemm) {
        thread_local std::vector<float> wt;  // [tile, n_in] expanded weight rows
        wt.resize(size_t(rows) * size_t(n_in));
        for (int64_t r = 0; r < rows; ++r) quant::dequantize_row(w.type, w.row(r0 + r), wt.data() + r * n_in, n_in);
        Eigen::Map<const mat_rm> wm(wt.data(), rows, n_in);  // [rows, n_in]
        Eigen::Map<const mat_rm> xm(x, T, n_in);              // [T, n_in]
        Eigen::Map<mat_rm, 0, Eigen::OuterStride<>> ym(y + r0, T, rows, Eigen::OuterStride<>(n_out));
        ym.noalias() = xm * wm.transpose();
      } else if (q8 && quant::is_block_quant(w.type)) {
        for (int64_t r = r0; r < r0 + rows; ++r)
          for (int t = 0; t < T; ++t)
            y[size_t(t) * n_out + r] = quant::vec_dot_row(w.type, w.row(r), nullptr, xq_.data() + size_t(t) * nb, n_in);
      } else {
        for (int64_t r = r0; r < r0 + rows; ++r)
          for (int t = 0; t < T; ++t)
            y[size_t(t) * n_out + r] = quant::vec_dot_row_f32(w.type, w.row(r), x + size_t(t) * n_in,
                                                              xsum_.data() + size_t(t) * nb, n_in);
      }
    }
    });
  }
  static constexpr int gemm_min_tokens = 4;

  const model& m_;
  hparams hp_;
  forward_options opt_;
  std::unique_ptr<thread_pool> pool_;
  kv_cache cache_;
  int n_past_ = 0;
  int last_T_ = 0;
  std::vector<float> inv_freq_;  // [head_dim/2]

  // Scratch of one chunk (reused across calls).
  std::vector<float> x_, xn_, q_, k_, v_, att_, gate_, up_, tmp_;
  std::vector<float> xsum_;              // [T, n_in/32] block sums of the activations
  std::vector<quant::block_q8_act> xq_;  // [T, n_in/32] quantised activations
};

}  // namespace llama
