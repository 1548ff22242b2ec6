// The Llama forward pass on the CPU: token embedding, n_layers x (RMSNorm, GQA attention with RoPE, RMSNorm,
// SwiGLU MLP), final RMSNorm and the output projection (the embeddings when tied). n_layers is the GGUF's
// llama.block_count: 30 for SmolLM2-135M.
//
// Matrix products run on the quantised blocks (quant.hpp) and are split over output rows between the threads
// of a small pool (thread_pool.hpp); a batch of tokens (prefill) shares one pass over each weight row, one token (decode) is a matvec.
// decode() steps several independent sequences at once: their tokens share each pass over the weights (decode is
// bound by reading them), while every row keeps the exact arithmetic of a one-token step, so a sequence decoded
// in a batch produces bit for bit the logits it would produce alone.
// Attention uses Eigen on the cache in place. Each KV head attends to its own length, so a head-adaptive
// compressed (ragged) cache is handled exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
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

// What a prefill keeps of the tokens it feeds, for compressing them afterwards (kv_cache.hpp's sys_* fields).
// The statistics come from the softmax the attention computes anyway, so an attention scorer need not recompute
// it from the queries (quadratic for H2O). Statistics need the sequence to start empty: key k is token k.
struct capture_options {
  bool queries = false;      // post-RoPE queries, sys_q (segment-local scoring recomputes attention from them)
  bool column_sums = false;  // sys_colsum: H2O's sum over every query of its attention row
  int last_rows = 0;         // sys_rows: the attention rows of the last min(last_rows, n) queries (SnapKV, TOVA)
  // sys_local_colsum over these regions (fairkv::scoring_regions of the fair H2O policy; they must tile the fed
  // tokens): segment-local H2O's sums, each query's row renormalised to its own region.
  std::vector<fairkv::segment> local_regions;
  bool any() const noexcept { return queries || column_sums || last_rows > 0 || !local_regions.empty(); }
  // run_colsum: every fed query's attention row added to its cache rows' running sums, prefill chunks and
  // single-token feeds alike, on a sequence in any state (H2O online; the caller clears the sums). Not part of
  // any(): it keeps nothing per fed token.
  bool running_column_sums = false;
};

// Adds query i's row (the causal softmax over keys [0, i], in `row`) renormalised to keys [rb, i] to
// local[rb, i]: the softmax over the region's keys. From the whole row's probabilities that is one division,
// unless the region's best logit lies more than 60 below the row's and its probabilities underflowed: the
// caller then passes the region's logits (`logits`, else null) and the softmax is taken from them.
inline void add_local_row(const float* row, const float* logits, int rb, int i, float* local) {
  if (logits == nullptr) {
    float s = 0.0f;
    for (int j = rb; j <= i; ++j) s += row[j];
    const float inv = 1.0f / s;
    for (int j = rb; j <= i; ++j) local[j] += row[j] * inv;
    return;
  }
  float m = -INFINITY;
  for (int j = rb; j <= i; ++j) m = std::max(m, logits[j]);
  float s = 0.0f;
  for (int j = rb; j <= i; ++j) s += std::exp(logits[j] - m);
  const float inv = 1.0f / s;
  for (int j = rb; j <= i; ++j) local[j] += std::exp(logits[j] - m) * inv;
}

// One sequence's state: its KV cache and the absolute position of its next token (the number of tokens ever fed,
// evicted ones included, as kvpress counts). Copyable, so a prefilled prompt can be forked.
struct sequence {
  kv_cache cache;
  int n_past = 0;
};

class engine {
 public:
  // capacity: tokens per KV head the engine's own cache can hold (make_sequence() gives others of any size).
  engine(const model& m, int capacity, forward_options opt = {})
      : m_(m), hp_(m.hp()), opt_(opt), main_(make_sequence(capacity)) {
    if (opt_.threads <= 0) opt_.threads = default_threads();
    if (opt_.batch <= 0) opt_.batch = 128;
    pool_ = std::make_unique<thread_pool>(opt_.threads);
    // RoPE inverse frequencies, in float like the reference (transformers) computes them.
    inv_freq_.resize(size_t(hp_.head_dim / 2));
    for (int i = 0; i < hp_.head_dim / 2; ++i)
      inv_freq_[size_t(i)] = 1.0f / std::pow(hp_.rope_base, float(2 * i) / float(hp_.head_dim));
  }

  const hparams& hp() const noexcept { return hp_; }
  int n_vocab() const noexcept { return hp_.n_vocab; }
  kv_cache& cache() noexcept { return main_.cache; }
  const kv_cache& cache() const noexcept { return main_.cache; }
  int threads() const noexcept { return opt_.threads; }
  // The forward pass's pool, lent to compression between forward calls (it is not reentrant).
  thread_pool& pool() noexcept { return *pool_; }

  // The engine's own sequence, which feed(tokens) extends.
  int n_past() const noexcept { return main_.n_past; }
  void reset() {
    main_.cache.clear();
    main_.n_past = 0;
  }

  // A copy of a sequence (teacher-forced scoring forks a turn to force two continuations from it).
  sequence fork(const sequence& s) const { return s; }

  // An empty sequence for this model, `capacity` tokens per KV head.
  sequence make_sequence(int capacity) const {
    return {kv_cache(hp_.n_layers, hp_.n_heads, hp_.n_kv_heads, hp_.head_dim, capacity), 0};
  }

  // Feeds tokens (in chunks of opt.batch), appending them to the cache. Returns the logits of the last token
  // ([n_vocab]), or of every token ([n_tokens][n_vocab]) when all_logits. capture_queries keeps the
  // post-RoPE queries of these tokens in each layer's sys_q ([n_heads][n_tokens][head_dim]).
  // on_chunk(done, total) reports progress after each chunk.
  std::vector<float> feed(std::span<const int32_t> tokens, bool all_logits = false, bool capture_queries = false,
                          const std::function<void(int, int)>& on_chunk = {}) {
    return feed(main_, tokens, all_logits, capture_queries, on_chunk);
  }
  // The same on any sequence.
  std::vector<float> feed(sequence& seq, std::span<const int32_t> tokens, bool all_logits = false,
                          bool capture_queries = false, const std::function<void(int, int)>& on_chunk = {}) {
    return feed(seq, tokens, all_logits, capture_options{capture_queries}, on_chunk);
  }
  // The same, keeping what `capture` asks of these tokens in each layer (kv_cache.hpp's sys_* fields).
  std::vector<float> feed(sequence& seq, std::span<const int32_t> tokens, bool all_logits,
                          const capture_options& capture, const std::function<void(int, int)>& on_chunk = {}) {
    const int n = int(tokens.size());
    if (n == 0) throw std::runtime_error("engine::feed: no tokens");
    check_tokens(tokens);
    check_compatible(seq);
    seq.cache.require_room(n);
    const bool stats = capture.column_sums || capture.last_rows > 0 || !capture.local_regions.empty();
    if (stats && seq.cache.max_len(0) != 0)
      throw std::logic_error("engine::feed: attention statistics are captured from an empty sequence only");
    const int rows = std::min(std::max(capture.last_rows, 0), n);
    if (capture.running_column_sums && stats)
      throw std::logic_error("engine::feed: running column sums and a prefill's statistics are exclusive");
    check_tiling(capture.local_regions, n);
    if (capture.running_column_sums)
      for (int l = 0; l < hp_.n_layers; ++l) {
        std::vector<float>& rc = seq.cache.layer(l).run_colsum;
        const size_t need = size_t(hp_.n_heads) * size_t(seq.cache.capacity());
        if (rc.size() != need) rc.assign(need, 0.0f);
      }
    for (int l = 0; capture.any() && l < hp_.n_layers; ++l) {
      kv_layer& cl = seq.cache.layer(l);
      if (capture.queries) cl.sys_q.assign(size_t(hp_.n_heads) * size_t(n) * size_t(hp_.head_dim), 0.0f);
      if (capture.column_sums) cl.sys_colsum.assign(size_t(hp_.n_heads) * size_t(n), 0.0f);
      if (rows > 0) cl.sys_rows.assign(size_t(hp_.n_heads) * size_t(rows) * size_t(n), 0.0f);
      cl.sys_rows_n = rows;
      if (!capture.local_regions.empty()) cl.sys_local_colsum.assign(size_t(hp_.n_heads) * size_t(n), 0.0f);
      cl.sys_local_regions = capture.local_regions;
    }

    std::vector<float> logits(size_t(all_logits ? n : 1) * size_t(hp_.n_vocab));
    for (int start = 0; start < n; start += opt_.batch) {
      const int count = std::min(opt_.batch, n - start);
      const bool last_chunk = start + count == n;
      forward_chunk(seq, tokens.subspan(size_t(start), size_t(count)), capture.any() ? start : -1, n, capture);
      if (all_logits)
        output_logits(0, count, logits.data() + size_t(start) * size_t(hp_.n_vocab), false);
      else if (last_chunk)
        output_logits(count - 1, 1, logits.data(), false);
      if (on_chunk) on_chunk(start + count, n);
    }
    return logits;
  }

  // One decode step of several sequences: tokens[i] is appended to *seqs[i]. Returns the logits
  // [seqs.size()][n_vocab], row i bit-identical to feed(*seqs[i], {tokens[i]}). The sequences must be distinct.
  std::vector<float> decode(std::span<sequence* const> seqs, std::span<const int32_t> tokens) {
    const int B = int(seqs.size());
    if (B == 0 || tokens.size() != seqs.size())
      throw std::runtime_error("engine::decode: need one token per sequence, got " + std::to_string(tokens.size()) +
                               " tokens for " + std::to_string(B) + " sequences");
    check_tokens(tokens);
    for (int i = 0; i < B; ++i) {
      if (seqs[size_t(i)] == nullptr) throw std::runtime_error("engine::decode: null sequence");
      check_compatible(*seqs[size_t(i)]);
      seqs[size_t(i)]->cache.require_room(1);
      for (int j = 0; j < i; ++j)
        if (seqs[size_t(j)] == seqs[size_t(i)])
          throw std::runtime_error("engine::decode: sequence " + std::to_string(i) + " appears twice");
    }
    embed(tokens);
    run_layers(B, /*rowwise=*/true, [&](int t) { return seqs[size_t(t)]->n_past; },
               [&](int l) {
                 for (int t = 0; t < B; ++t) append_kv(seqs[size_t(t)]->cache, l, t, 1);
               },
               [&](int l) { attention_rows(seqs, l); }, [](int) {});
    for (sequence* s : seqs) s->n_past += 1;
    std::vector<float> logits(size_t(B) * size_t(hp_.n_vocab));
    output_logits(0, B, logits.data(), true);
    return logits;
  }

 private:
  using mat_rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  void check_tokens(std::span<const int32_t> tokens) const {
    for (int32_t t : tokens)
      if (t < 0 || t >= hp_.n_vocab)
        throw std::runtime_error("engine: token id " + std::to_string(t) + " outside the vocabulary");
  }
  void check_compatible(const sequence& s) const {
    const kv_cache& c = s.cache;
    if (c.n_layers() != hp_.n_layers || c.n_heads() != hp_.n_heads || c.n_kv_heads() != hp_.n_kv_heads ||
        c.head_dim() != hp_.head_dim)
      throw std::runtime_error("engine: the sequence's cache was made for another model shape");
  }

  void embed(std::span<const int32_t> tokens) {
    const int T = int(tokens.size()), d = hp_.d_model;
    x_.resize(size_t(T) * d);  // [T, d_model] residual stream
    for (int t = 0; t < T; ++t)
      quant::dequantize_row(m_.token_embd().type, m_.token_embd().row(tokens[size_t(t)]), x_.data() + size_t(t) * d,
                            d);
  }

  // One chunk of T tokens of one sequence through every layer. q_capture_at >= 0: index of this chunk's first
  // token in the captured tokens (n_capture of them), what `capture` asks is kept.
  void forward_chunk(sequence& seq, std::span<const int32_t> tokens, int q_capture_at, int n_capture,
                     const capture_options& capture = {}) {
    const int T = int(tokens.size());
    const int hd = hp_.head_dim, q_dim = hp_.n_heads * hd;
    embed(tokens);
    run_layers(T, /*rowwise=*/false, [&](int t) { return seq.n_past + t; },
               [&](int l) { append_kv(seq.cache, l, 0, T); },
               [&](int l) {
                 kv_layer& cl = seq.cache.layer(l);
                 stats_sink sink;
                 if (capture.running_column_sums)  // cache row j is column j, rows `capacity` apart
                   sink = {cl.run_colsum.data(), nullptr, 0, seq.cache.capacity()};
                 else if (q_capture_at >= 0 && (capture.column_sums || cl.sys_rows_n > 0 ||
                                                !cl.sys_local_regions.empty()))
                   sink = {capture.column_sums ? cl.sys_colsum.data() : nullptr,
                           cl.sys_rows_n > 0 ? cl.sys_rows.data() : nullptr, cl.sys_rows_n, n_capture,
                           cl.sys_local_regions.empty() ? nullptr : cl.sys_local_colsum.data(),
                           cl.sys_local_regions};
                 attention(seq.cache, l, T, sink.n > 0 ? &sink : nullptr);
               },
               [&](int l) {
                 if (q_capture_at < 0 || !capture.queries) return;
                 std::vector<float>& sq = seq.cache.layer(l).sys_q;  // [n_heads, n_capture, hd]
                 for (int h = 0; h < hp_.n_heads; ++h)
                   for (int t = 0; t < T; ++t)
                     std::copy_n(q_.data() + size_t(t) * q_dim + size_t(h) * hd, hd,
                                 sq.data() + (size_t(h) * size_t(n_capture) + size_t(q_capture_at + t)) * size_t(hd));
               });
    seq.n_past += T;
  }

  // The layers over the T rows in x_ (already embedded). pos(t): RoPE position of row t; append(l) stores the
  // rows' K/V, attend(l) fills att_, capture(l) may keep the post-RoPE queries. rowwise: every product row by
  // row (the one-token arithmetic), for rows of different sequences.
  template <class Pos, class Append, class Attend, class Capture>
  void run_layers(int T, bool rowwise, Pos&& pos, Append&& append, Attend&& attend, Capture&& capture) {
    const int d = hp_.d_model, hd = hp_.head_dim, q_dim = hp_.n_heads * hd, kv_dim = hp_.n_kv_heads * hd;
    xn_.resize(size_t(T) * d);      // [T, d_model] normalised
    q_.resize(size_t(T) * q_dim);   // [T, n_heads*hd]
    k_.resize(size_t(T) * kv_dim);  // [T, n_kv*hd]
    v_.resize(size_t(T) * kv_dim);  // [T, n_kv*hd]
    att_.resize(size_t(T) * q_dim); // [T, n_heads*hd]
    gate_.resize(size_t(T) * hp_.d_ff);  // [T, d_ff]
    up_.resize(size_t(T) * hp_.d_ff);    // [T, d_ff]
    tmp_.resize(size_t(T) * d);          // [T, d_model]

    // The element-wise steps (RoPE, SiLU) of a prefill chunk are split over its tokens too: on one thread they
    // would hold the other threads at the next barrier. Each element is computed as it would be serially.
    auto per_token = [&](auto&& f) {
      if (T >= 16) pool_->parallel_for(T, f);
      else f(int64_t{0}, int64_t{T});
    };
    for (int l = 0; l < hp_.n_layers; ++l) {
      const layer_weights& w = m_.layer(l);
      rms_norm(x_.data(), w.attn_norm, xn_.data(), T, d);
      matmul({{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}}, xn_.data(), T, rowwise);
      per_token([&](int64_t t_begin, int64_t t_end) {
        for (int t = int(t_begin); t < int(t_end); ++t) {
          const int p = pos(t);
          for (int h = 0; h < hp_.n_heads; ++h) rope(q_.data() + size_t(t) * q_dim + size_t(h) * hd, p);
          for (int h = 0; h < hp_.n_kv_heads; ++h) rope(k_.data() + size_t(t) * kv_dim + size_t(h) * hd, p);
        }
      });
      capture(l);
      append(l);
      attend(l);
      matmul({{&w.wo, tmp_.data()}}, att_.data(), T, rowwise);
      for (size_t i = 0; i < size_t(T) * d; ++i) x_[i] += tmp_[i];

      rms_norm(x_.data(), w.ffn_norm, xn_.data(), T, d);
      matmul({{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}}, xn_.data(), T, rowwise);
      per_token([&](int64_t t_begin, int64_t t_end) {
        for (size_t i = size_t(t_begin) * hp_.d_ff; i < size_t(t_end) * hp_.d_ff; ++i) {
          const float g = gate_[i];
          gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];  // SiLU(gate) * up
        }
      });
      matmul({{&w.w_down, tmp_.data()}}, gate_.data(), T, rowwise);
      for (size_t i = 0; i < size_t(T) * d; ++i) x_[i] += tmp_[i];
    }
  }

  // Final norm and output projection of rows [first, first+count) of the last chunk: out[count][n_vocab].
  void output_logits(int first, int count, float* out, bool rowwise) {
    const int d = hp_.d_model;
    xn_.resize(size_t(count) * d);
    rms_norm(x_.data() + size_t(first) * d, m_.output_norm(), xn_.data(), count, d);
    matmul({{&m_.output(), out}}, xn_.data(), count, rowwise);
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

  // Rows [first, first+T) of k_/v_ go after each head's current length in `cache`.
  void append_kv(kv_cache& cache, int l, int first, int T) {
    const int hd = hp_.head_dim, kv_dim = hp_.n_kv_heads * hd;
    kv_layer& cl = cache.layer(l);
    for (int g = 0; g < hp_.n_kv_heads; ++g) {
      const int base = cl.len[size_t(g)];
      for (int t = 0; t < T; ++t) {
        const size_t src = size_t(first + t) * kv_dim + size_t(g) * hd;
        std::copy_n(k_.data() + src, hd, cache.k_row(l, g, base + t));
        std::copy_n(v_.data() + src, hd, cache.v_row(l, g, base + t));
      }
      cl.len[size_t(g)] = base + T;
    }
  }

  // Where a prefill of n captured tokens (the sequence started empty, so cache row k is token k) accumulates its
  // attention statistics, or, for running column sums, n = the cache's capacity and column j is cache row j;
  // each query head writes only its own rows, so the heads' threads never share a float.
  struct stats_sink {
    float* colsum = nullptr;  // [n_heads, n]
    float* rows = nullptr;    // [n_heads, n_rows, n]: rows of queries [n - n_rows, n)
    int n_rows = 0;
    int n = 0;
    float* local_colsum = nullptr;             // [n_heads, n]: rows renormalised to their query's region
    std::span<const fairkv::segment> regions;  // tiling [0, n) in order
  };

  static void check_tiling(std::span<const fairkv::segment> regions, int n) {
    int32_t pos = 0;
    for (const fairkv::segment& r : regions) {
      if (r.begin != pos || r.end <= r.begin)
        throw std::logic_error("engine::feed: capture_options::local_regions must tile the fed tokens in order");
      pos = r.end;
    }
    if (!regions.empty() && pos != n)
      throw std::logic_error("engine::feed: capture_options::local_regions cover " + std::to_string(pos) +
                             " tokens, not the " + std::to_string(n) + " fed");
  }

  // Causal GQA attention of the chunk's T queries over each KV head's own cache rows; writes att_[T][q_dim].
  void attention(const kv_cache& cache, int l, int T, const stats_sink* sink = nullptr) {
    // A decode step over a short cache is too little work to be worth a barrier.
    const bool parallel = int64_t(T) * cache.max_len(l) >= 2048;
    auto heads = [&](int64_t h_begin, int64_t h_end) {
      for (int h = int(h_begin); h < int(h_end); ++h) attend_head(cache, l, h, T, 0, sink);
    };
    if (parallel) pool_->parallel_for(hp_.n_heads, heads);
    else heads(0, hp_.n_heads);
  }

  // Row t of the batch attends over its own sequence's cache: the one-token case of attention(), per row.
  void attention_rows(std::span<sequence* const> seqs, int l) {
    const int64_t B = int64_t(seqs.size()), H = hp_.n_heads;
    int64_t work = 0;
    for (sequence* s : seqs) work += s->cache.max_len(l);
    auto rows = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) attend_head(seqs[size_t(i / H)]->cache, l, int(i % H), 1, int(i / H));
    };
    if (work >= 2048) pool_->parallel_for(B * H, rows);
    else rows(0, B * H);
  }

  // Query head h of rows [row0, row0+T) of q_ over KV head h/group of `cache`, whose last T rows are these
  // tokens' own keys (causal within them); writes the same rows of att_.
  void attend_head(const kv_cache& cache, int l, int h, int T, int row0, const stats_sink* sink = nullptr) {
    const int hd = hp_.head_dim, q_dim = hp_.n_heads * hd, group = hp_.n_heads / hp_.n_kv_heads;
    const float scale = 1.0f / std::sqrt(float(hd));
    const int g = h / group;
    const int L = cache.layer(l).len[size_t(g)];  // includes these T tokens
    const int past = L - T;
    thread_local mat_rm s;  // [T, L] scores, then probabilities
    s.resize(T, L);
    const size_t at = size_t(row0) * q_dim + size_t(h) * hd;
    Eigen::Map<const mat_rm, 0, Eigen::OuterStride<>> q(q_.data() + at, T, hd, Eigen::OuterStride<>(q_dim));
    Eigen::Map<const mat_rm> k(cache.k_row(l, g, 0), L, hd);  // [L, hd]
    Eigen::Map<const mat_rm> v(cache.v_row(l, g, 0), L, hd);  // [L, hd]
    s.noalias() = q * k.transpose();
    thread_local std::vector<float> region_logits;  // add_local_row's rare case
    for (int t = 0; t < T; ++t) {
      const int visible = past + t + 1;  // causal: the query at cache row past+t sees rows [0, past+t]
      auto row = s.row(t);
      // The row's max, split at the first key of this query's region (segment-local sums; 0 otherwise), so the
      // region's own max comes with it.
      int rb = 0;
      const bool local = sink != nullptr && sink->local_colsum != nullptr;
      if (local)
        rb = std::prev(std::upper_bound(sink->regions.begin(), sink->regions.end(), past + t,
                                        [](int x, const fairkv::segment& r) { return x < r.begin; }))->begin;
      float mx = -INFINITY, mr = -INFINITY;
      for (int j = 0; j < rb; ++j) mx = std::max(mx, row(j) * scale);
      for (int j = rb; j < visible; ++j) mr = std::max(mr, row(j) * scale);
      mx = std::max(mx, mr);
      const bool from_logits = local && mr < mx - 60.0f;
      if (from_logits) {
        region_logits.resize(size_t(visible));
        for (int j = rb; j < visible; ++j) region_logits[size_t(j)] = row(j) * scale;
      }
      float sum = 0.0f;
      for (int j = 0; j < visible; ++j) {
        const float e = std::exp(row(j) * scale - mx);
        row(j) = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (int j = 0; j < visible; ++j) row(j) *= inv;
      for (int j = visible; j < L; ++j) row(j) = 0.0f;
      if (sink != nullptr) {
        // Chunks arrive in order and rows within a chunk in order, so every column sum adds its queries in
        // ascending position, the order of fairkv's own recompute.
        const int i = past + t;  // this query's token index (= its cache row)
        if (sink->colsum != nullptr) {
          float* cs = sink->colsum + size_t(h) * size_t(sink->n);
          for (int j = 0; j < visible; ++j) cs[j] += row(j);
        }
        if (sink->local_colsum != nullptr)
          add_local_row(&row(0), from_logits ? region_logits.data() : nullptr, rb, i,
                        sink->local_colsum + size_t(h) * size_t(sink->n));
        const int first_row = sink->n - sink->n_rows;
        if (sink->rows != nullptr && i >= first_row)
          std::copy_n(&row(0), visible,
                      sink->rows + (size_t(h) * size_t(sink->n_rows) + size_t(i - first_row)) * size_t(sink->n));
      }
    }
    Eigen::Map<mat_rm, 0, Eigen::OuterStride<>> o(att_.data() + at, T, hd, Eigen::OuterStride<>(q_dim));
    o.noalias() = s * v;
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
  //  - rowwise: no GEMM even for many rows, so each row gets exactly the one-token arithmetic (batched decode).
  void matmul(std::initializer_list<matmul_job> jobs_in, const float* x, int T, bool rowwise) {
    const std::vector<matmul_job> jobs(jobs_in);
    const int64_t n_in = jobs.front().w->n_in, nb = n_in / quant::qk;
    bool any_block = false;
    for (const matmul_job& j : jobs) {
      if (j.w->n_in != n_in) throw std::logic_error("matmul: jobs with different input sizes");
      any_block = any_block || quant::is_block_quant(j.w->type);
    }
    const bool q8 = opt_.q8_activations && any_block;
    const bool gemm = !q8 && !rowwise && T >= gemm_min_tokens;
    // Rows per work item. A GEMM tile is expanded to floats once for all T tokens and x is packed once per
    // tile, so tiles are large: 96 = two of Eigen's 48-row AVX-512 panels (four 24-row AVX2 ones), 96 x 1536
    // floats = 576 KiB (measured on the 135M model's prefill at 1 thread, AVX-512: 32 rows 448 tok/s, 64 rows
    // 493, 96 rows 512). Without a GEMM a tile only splits the work between threads, and small tiles balance it.
    const int64_t tile = gemm ? 96 : 32;
    // Work items: (job, first row) tiles over every job's rows.
    std::vector<std::pair<int, int64_t>> items;
    for (size_t j = 0; j < jobs.size(); ++j)
      for (int64_t r0 = 0; r0 < jobs[j].w->n_out; r0 += tile) items.emplace_back(int(j), r0);
    if (q8) {
      xq_.resize(size_t(T) * size_t(nb));  // [T, n_in/32]
      for (int t = 0; t < T; ++t) quant::quantize_row_q8_act(x + size_t(t) * n_in, xq_.data() + size_t(t) * nb, n_in);
    }
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
        // y's tile transposed (rows x T, column-major in y): the expanded weights are the product's left side,
        // which Eigen packs cheaply from row-major storage, and x the right side, packed once per tile.
        using mat_cm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
        Eigen::Map<mat_cm, 0, Eigen::OuterStride<>> yt(y + r0, rows, T, Eigen::OuterStride<>(n_out));
        yt.noalias() = wm * xm.transpose();
      } else if (q8 && quant::is_block_quant(w.type)) {
        for (int64_t r = r0; r < r0 + rows; ++r)
          for (int t = 0; t < T; ++t)
            y[size_t(t) * n_out + r] = quant::vec_dot_row(w.type, w.row(r), nullptr, xq_.data() + size_t(t) * nb, n_in);
      } else {
        // quant::dot_rows tokens share each expanded weight block; a group of tokens stays in L1 while it meets
        // the tile's rows (each row then read from L1 too). Leftover tokens go one by one: same arithmetic.
        constexpr int NT = quant::dot_rows;
        const float* xr[NT];
        const float* sr[NT];
        float out[NT];
        for (int t = 0; t < T; t += NT) {
          const int nt = std::min(NT, T - t);
          for (int j = 0; j < nt; ++j) {
            xr[j] = x + size_t(t + j) * n_in;
            sr[j] = xsum_.data() + size_t(t + j) * nb;
          }
          for (int64_t r = r0; r < r0 + rows; ++r) {
            if (nt == NT) {
              quant::vec_dot_rows_f32<NT>(w.type, w.row(r), xr, sr, n_in, out);
            } else {
              for (int j = 0; j < nt; ++j) out[j] = quant::vec_dot_row_f32(w.type, w.row(r), xr[j], sr[j], n_in);
            }
            for (int j = 0; j < nt; ++j) y[size_t(t + j) * n_out + r] = out[j];
          }
        }
      }
    }
    });
  }
  static constexpr int gemm_min_tokens = 4;

  const model& m_;
  hparams hp_;
  forward_options opt_;
  std::unique_ptr<thread_pool> pool_;
  sequence main_;
  std::vector<float> inv_freq_;  // [head_dim/2]

  // Scratch of one chunk (reused across calls).
  std::vector<float> x_, xn_, q_, k_, v_, att_, gate_, up_, tmp_;
  std::vector<float> xsum_;              // [T, n_in/32] block sums of the activations
  std::vector<quant::block_q8_act> xq_;  // [T, n_in/32] quantised activations
};

}  // namespace llama
