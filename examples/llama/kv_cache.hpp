// The KV cache in the layout fairkv views directly (docs/llama-runner.md, "Forward pass"): per layer K and V as
// float [n_kv_heads][capacity][head_dim], keys after RoPE, and a length per head, because head-adaptive
// eviction leaves heads with different numbers of tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fairkv/segments.hpp"
#include "fairkv/views/kv_view.hpp"

namespace llama {

struct kv_layer {
  std::vector<float> k;        // [n_kv_heads, capacity, head_dim], post-RoPE
  std::vector<float> v;        // [n_kv_heads, capacity, head_dim]
  std::vector<int32_t> len;    // [n_kv_heads] filled tokens of each head
  std::vector<float> sys_q;    // [n_heads, n_sys, head_dim] post-RoPE queries of the system turn (optional)
  // Attention statistics of the system turn, accumulated by the prefill's own softmax (optional), so compression
  // need not recompute attention from sys_q:
  std::vector<float> sys_colsum;  // [n_heads, n_sys] sum over every system-turn query of A[q, k] (H2O)
  std::vector<float> sys_rows;    // [n_heads, sys_rows_n, n_sys] softmaxed rows of the last sys_rows_n queries
                                  // (SnapKV's window, TOVA's last row), zero beyond each row's causal end
  int sys_rows_n = 0;
  // Segment-local H2O (fair): [n_heads, n_sys] the same sums with each query's row renormalised to the keys of
  // its own region (fairkv::scoring_regions), and the regions, which tile [0, n_sys).
  std::vector<float> sys_local_colsum;
  std::vector<fairkv::segment> sys_local_regions;
  // H2O online (capture_options::running_column_sums): [n_heads, capacity] sum, over every query fed since the
  // owner last cleared it, of that query's attention to cache row j. Rows move with compaction only if the owner
  // moves them; the chat session clears them at every compaction instead ("since the last compaction").
  std::vector<float> run_colsum;
};

// [rows][capacity][width] -> [rows][new_capacity][width], zero beyond the old rows: a per-head buffer with room
// for more tokens (the cache's K and V, and what a chat keeps beside them).
inline std::vector<float> relayout(const std::vector<float>& old, int rows, int capacity, int new_capacity, int width) {
  std::vector<float> out(size_t(rows) * size_t(new_capacity) * size_t(width), 0.0f);
  const size_t from = size_t(capacity) * size_t(width), to = size_t(new_capacity) * size_t(width);
  for (size_t r = 0; r < size_t(rows); ++r) std::copy_n(old.data() + r * from, from, out.data() + r * to);
  return out;
}

class kv_cache {
 public:
  kv_cache() = default;
  kv_cache(int n_layers, int n_heads, int n_kv_heads, int head_dim, int capacity)
      : n_heads_(n_heads), n_kv_heads_(n_kv_heads), head_dim_(head_dim), capacity_(capacity) {
    layers_.resize(size_t(n_layers));
    for (kv_layer& l : layers_) {
      l.k.assign(size_t(n_kv_heads) * size_t(capacity) * size_t(head_dim), 0.0f);
      l.v.assign(size_t(n_kv_heads) * size_t(capacity) * size_t(head_dim), 0.0f);
      l.len.assign(size_t(n_kv_heads), 0);
    }
  }

  int n_layers() const noexcept { return int(layers_.size()); }
  int n_heads() const noexcept { return n_heads_; }
  int n_kv_heads() const noexcept { return n_kv_heads_; }
  int head_dim() const noexcept { return head_dim_; }
  int capacity() const noexcept { return capacity_; }

  kv_layer& layer(int l) { return layers_.at(size_t(l)); }
  const kv_layer& layer(int l) const { return layers_.at(size_t(l)); }

  // Row t of head h: [head_dim] floats.
  float* k_row(int l, int h, int t) { return layers_[size_t(l)].k.data() + offset(h, t); }
  float* v_row(int l, int h, int t) { return layers_[size_t(l)].v.data() + offset(h, t); }
  const float* k_row(int l, int h, int t) const { return layers_[size_t(l)].k.data() + offset(h, t); }
  const float* v_row(int l, int h, int t) const { return layers_[size_t(l)].v.data() + offset(h, t); }

  // Longest head of a layer (the space a batch of new tokens must fit after).
  int max_len(int l) const {
    const auto& len = layers_.at(size_t(l)).len;
    return len.empty() ? 0 : *std::max_element(len.begin(), len.end());
  }

  // Raises the capacity to `new_capacity` tokens per head, keeping every row (a cache that grows with the
  // conversation instead of allocating its largest size up front). All new buffers are allocated before any is
  // swapped in, so an allocation failure leaves the cache as it was; the peak is the old and the new cache together.
  void grow(int new_capacity) {
    if (new_capacity <= capacity_) return;
    struct moved {
      std::vector<float> k, v, run_colsum;
    };
    std::vector<moved> next(layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i) {
      const kv_layer& l = layers_[i];
      next[i].k = relayout(l.k, n_kv_heads_, capacity_, new_capacity, head_dim_);
      next[i].v = relayout(l.v, n_kv_heads_, capacity_, new_capacity, head_dim_);
      if (!l.run_colsum.empty()) next[i].run_colsum = relayout(l.run_colsum, n_heads_, capacity_, new_capacity, 1);
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i].k.swap(next[i].k);
      layers_[i].v.swap(next[i].v);
      if (!layers_[i].run_colsum.empty()) layers_[i].run_colsum.swap(next[i].run_colsum);
    }
    capacity_ = new_capacity;
  }

  void require_room(int n_new) const {
    for (int l = 0; l < n_layers(); ++l)
      if (max_len(l) + n_new > capacity_)
        throw std::runtime_error("KV cache full: " + std::to_string(max_len(l)) + " + " + std::to_string(n_new) +
                                 " tokens exceed the capacity of " + std::to_string(capacity_) +
                                 " (raise it or shorten the prompt)");
  }

  // Per-head lengths of every layer ([n_layers][n_kv_heads]): what a compressed, ragged cache holds.
  std::vector<std::vector<int32_t>> lengths() const {
    std::vector<std::vector<int32_t>> out;
    out.reserve(layers_.size());
    for (const kv_layer& l : layers_) out.push_back(l.len);
    return out;
  }
  // The captured queries and attention statistics are only needed to score the system turn.
  void drop_queries() {
    for (kv_layer& l : layers_) drop_captures(l);
  }
  static void drop_captures(kv_layer& l) {
    l.sys_q.clear();
    l.sys_q.shrink_to_fit();
    l.sys_colsum.clear();
    l.sys_colsum.shrink_to_fit();
    l.sys_rows.clear();
    l.sys_rows.shrink_to_fit();
    l.sys_rows_n = 0;
    l.sys_local_colsum.clear();
    l.sys_local_colsum.shrink_to_fit();
    l.sys_local_regions.clear();
  }
  void clear() {
    for (kv_layer& l : layers_) {
      std::fill(l.len.begin(), l.len.end(), 0);
      l.sys_q.clear();
      l.sys_colsum.clear();
      l.sys_rows.clear();
      l.sys_rows_n = 0;
      l.sys_local_colsum.clear();
      l.sys_local_regions.clear();
    }
  }

  // fairkv views of one layer with `tokens` rows per head: {batch 1, n_kv_heads, tokens, head_dim},
  // strides {.., capacity*head_dim, head_dim, 1}. The caller passes the common length (all heads equal
  // right after a prefill, which is when the runner compresses).
  fairkv::kv_view<float> k_view(int l, int tokens) { return view(layers_.at(size_t(l)).k.data(), tokens); }
  fairkv::kv_view<float> v_view(int l, int tokens) { return view(layers_.at(size_t(l)).v.data(), tokens); }

 private:
  size_t offset(int h, int t) const noexcept {
    return (size_t(h) * size_t(capacity_) + size_t(t)) * size_t(head_dim_);
  }
  fairkv::kv_view<float> view(float* data, int tokens) const noexcept {
    return fairkv::make_capacity_view(data, 1, n_kv_heads_, tokens, capacity_, head_dim_);
  }

  int n_heads_ = 0;
  int n_kv_heads_ = 0;
  int head_dim_ = 0;
  int capacity_ = 0;
  std::vector<kv_layer> layers_;
};

}  // namespace llama
