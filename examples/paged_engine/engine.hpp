// A minimal paged engine loop, vLLM-shaped, shared by the CPU (main.cpp) and CUDA (main_cuda.cu) programs:
// requests with different system prompts hold K/V in blocks of one pool (a block table per request, in
// FlashInfer's CSR form), fairkv compresses them all in one batched call (each with its own segments, whitelist
// and target), the engine takes back the freed blocks, and one decode step attends over the compacted blocks
// with a plain reference attention. The same requests compressed one by one must give the same answers, bit for
// bit: batching requests changes nothing about any of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

// The library's backend-independent parts only: main.cpp adds the CPU backend, main_cuda.cu the CUDA one.
#include "fairkv/allocators/fair.hpp"
#include "fairkv/budget.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/paged_release.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/request_batch.hpp"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/selectors/per_head.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/paged_kv_view.hpp"

namespace paged_engine {

inline constexpr std::int64_t kv_heads = 2, q_heads = 4, head_dim = 16, block_size = 4;

// The fairness policy every request is compressed with: K-Norm scores, each instruction segment keeps the same
// fraction of its tokens, whitelisted tokens are kept and paid for.
using policy =
    fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, fairkv::allocators::fair_with_whitelist>;

struct request {
  std::string name;
  std::int32_t tokens = 0;                // the system prompt, prefilled
  std::vector<fairkv::segment> segments;  // its instruction lines
  std::vector<std::int32_t> whitelist;    // e.g. the defense line's first tokens
  fairkv::keep_target target;
  std::uint32_t seed = 0;  // its K, V and decode query (the same whichever batch it is in)
};

// The engine's memory: one K pool and one V pool of blocks [num_blocks, block_size, kv_heads, head_dim] (vLLM's
// NHD block layout), a block table per request and the pool's free list.
struct engine {
  std::int64_t num_blocks = 0;
  std::vector<float> k_pool, v_pool;
  std::vector<std::int32_t> indptr{0}, blocks, last_block_len;  // block tables, CSR
  std::vector<std::int32_t> free_blocks;
  [[nodiscard]] std::int64_t batch() const { return static_cast<std::int64_t>(last_block_len.size()); }
  [[nodiscard]] fairkv::paged_kv_view<float> view() {
    return fairkv::make_paged_view(fairkv::page_layout::nhd, k_pool.data(), v_pool.data(), num_blocks, block_size,
                                   kv_heads, head_dim, batch(), indptr.data(), blocks.data(), last_block_len.data());
  }
};

// Admits the requests: blocks from a shuffled free list (so tables are scattered as in a long-running server),
// each request's prefill writing its own K and V.
inline engine admit(const std::vector<request>& reqs, std::int64_t num_blocks, std::uint32_t pool_seed) {
  engine e;
  e.num_blocks = num_blocks;
  const auto elems = static_cast<std::size_t>(num_blocks * block_size * kv_heads * head_dim);
  e.k_pool.assign(elems, 0.f);
  e.v_pool.assign(elems, 0.f);
  e.free_blocks.resize(static_cast<std::size_t>(num_blocks));
  std::iota(e.free_blocks.begin(), e.free_blocks.end(), 0);
  std::mt19937 shuffle(pool_seed);
  std::shuffle(e.free_blocks.begin(), e.free_blocks.end(), shuffle);
  for (const request& r : reqs) {
    const std::int64_t n = (r.tokens + block_size - 1) / block_size;
    for (std::int64_t i = 0; i < n; ++i) {
      e.blocks.push_back(e.free_blocks.back());
      e.free_blocks.pop_back();
    }
    e.indptr.push_back(static_cast<std::int32_t>(e.blocks.size()));
    e.last_block_len.push_back(static_cast<std::int32_t>(r.tokens - (n - 1) * block_size));
  }
  auto v = e.view();
  for (std::size_t b = 0; b < reqs.size(); ++b) {
    std::mt19937 rng(reqs[b].seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (std::int64_t t = 0; t < reqs[b].tokens; ++t)
      for (std::int64_t h = 0; h < kv_heads; ++h) {
        const float scale = 0.5f + static_cast<float>((t * 7 + h) % 5);  // norms differ: K-Norm has a choice
        for (std::int64_t d = 0; d < head_dim; ++d) {
          v.keys().row(static_cast<std::int64_t>(b), h, t)[d] = scale * normal(rng);
          v.values().row(static_cast<std::int64_t>(b), h, t)[d] = normal(rng);
        }
      }
  }
  return e;
}

// After a compaction under `plan`: the engine's new block tables and free list (fairkv::release_pages).
inline fairkv::result take_back_blocks(engine& e, fairkv::const_keep_plan_view plan, std::int64_t& freed_total) {
  const std::int64_t B = e.batch();
  std::vector<std::int32_t> indptr(static_cast<std::size_t>(B + 1)), blocks(e.blocks.size()),
      last(static_cast<std::size_t>(B)), freed_indptr(static_cast<std::size_t>(B + 1)), freed(e.blocks.size());
  FAIRKV_TRY(fairkv::release_pages(plan, e.view(),
                                   {indptr.data(), blocks.data(), last.data(), freed_indptr.data(), freed.data()}));
  blocks.resize(static_cast<std::size_t>(indptr.back()));
  freed.resize(static_cast<std::size_t>(freed_indptr.back()));
  e.free_blocks.insert(e.free_blocks.end(), freed.begin(), freed.end());
  freed_total = static_cast<std::int64_t>(freed.size());
  e.indptr = std::move(indptr);
  e.blocks = std::move(blocks);
  e.last_block_len = std::move(last);
  return {};
}

// One decode step of request b: its query (from its seed) attends, per query head, over the tokens its KV head
// kept (the first counts[b * kv_heads + h] slots of its blocks). Plain softmax attention in double.
inline std::vector<double> decode(engine& e, std::int64_t b, const request& r,
                                  const std::vector<std::int32_t>& counts) {
  std::mt19937 rng(r.seed ^ 0x9e3779b9u);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto v = e.view();
  std::vector<double> out(static_cast<std::size_t>(q_heads * head_dim), 0.0);
  for (std::int64_t qh = 0; qh < q_heads; ++qh) {
    std::vector<double> q(static_cast<std::size_t>(head_dim));
    for (double& x : q) x = normal(rng);
    const std::int64_t h = qh / (q_heads / kv_heads), n = counts[static_cast<std::size_t>(b * kv_heads + h)];
    std::vector<double> logits(static_cast<std::size_t>(n));
    for (std::int64_t t = 0; t < n; ++t) {
      double dot = 0.0;
      for (std::int64_t d = 0; d < head_dim; ++d) dot += q[static_cast<std::size_t>(d)] * v.keys().row(b, h, t)[d];
      logits[static_cast<std::size_t>(t)] = dot / std::sqrt(static_cast<double>(head_dim));
    }
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (double& l : logits) sum += (l = std::exp(l - mx));
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t d = 0; d < head_dim; ++d)
        out[static_cast<std::size_t>(qh * head_dim + d)] +=
            logits[static_cast<std::size_t>(t)] / sum * v.values().row(b, h, t)[d];
  }
  return out;
}

// What a backend does for the engine: compress every request of `e` in one call (its own lists and target from
// `reqs`), in place in the pool, and return the plan's counts ([batch * kv_heads]) on the host.
using compress_fn =
    std::function<fairkv::result(engine& e, const std::vector<request>& reqs, std::vector<std::int32_t>& counts)>;

// The request batch of `reqs`, in CSR form, over storage the caller keeps alive.
struct request_lists {
  std::vector<std::int32_t> seg_indptr{0}, wl_indptr{0};
  std::vector<fairkv::segment> segments;
  std::vector<std::int32_t> whitelist;
  std::vector<fairkv::keep_target> targets;
  explicit request_lists(const std::vector<request>& reqs) {
    for (const request& r : reqs) {
      segments.insert(segments.end(), r.segments.begin(), r.segments.end());
      whitelist.insert(whitelist.end(), r.whitelist.begin(), r.whitelist.end());
      seg_indptr.push_back(static_cast<std::int32_t>(segments.size()));
      wl_indptr.push_back(static_cast<std::int32_t>(whitelist.size()));
      targets.push_back(r.target);
    }
  }
  [[nodiscard]] fairkv::request_batch batch() const { return {seg_indptr, segments, wl_indptr, whitelist, targets}; }
};

// Three requests with different system prompts: their own lengths, instruction lines, defenses and budgets.
inline std::vector<request> demo_requests() {
  return {
      {"support bot", 37, {{0, 9}, {9, 21}, {21, 37}}, {0, 1, 2}, fairkv::keep_target::of_ratio(0.5), 11},
      {"code reviewer", 64, {{0, 30}, {30, 41}, {41, 64}}, {30, 31}, fairkv::keep_target::of_tokens(20), 22},
      {"translator", 23, {{3, 12}, {12, 23}}, {}, fairkv::keep_target::of_ratio(0.3), 33},
  };
}

// The loop: admit, compress all requests in one call, take the freed blocks back, decode; then every request on
// its own through the same backend. Prints what happened; 0 when every answer equals its one-by-one answer.
inline int run(const char* backend, const compress_fn& compress) {
  const std::vector<request> reqs = demo_requests();
  engine batched = admit(reqs, 64, 7);
  std::vector<std::int32_t> counts;
  fairkv::result r = compress(batched, reqs, counts);
  if (!r.ok()) {
    std::fprintf(stderr, "paged_engine (%s): batched compression failed: %s\n", backend, r.message());
    return 1;
  }
  std::int64_t freed = 0;
  const std::int64_t free_before = static_cast<std::int64_t>(batched.free_blocks.size());
  std::vector<std::int32_t> lengths;
  for (const request& q : reqs) lengths.push_back(q.tokens);
  fairkv::keep_plan held;  // counts and lengths are all release_pages reads
  held.resize(batched.batch(), kv_heads, 1);
  for (std::size_t i = 0; i < counts.size(); ++i) held.view().counts[i] = counts[i];
  for (std::size_t b = 0; b < lengths.size(); ++b) held.view().lengths[b] = lengths[b];
  if (!(r = take_back_blocks(batched, held.view(), freed)).ok()) {
    std::fprintf(stderr, "paged_engine (%s): release_pages: %s\n", backend, r.message());
    return 1;
  }
  std::printf("paged_engine (%s): %zu requests compressed in one call; %lld blocks freed (free list %lld -> %lld)\n",
              backend, reqs.size(), static_cast<long long>(freed), static_cast<long long>(free_before),
              static_cast<long long>(batched.free_blocks.size()));
  int failures = 0;
  for (std::size_t b = 0; b < reqs.size(); ++b) {
    const auto bi = static_cast<std::int64_t>(b);
    const std::vector<double> answer = decode(batched, bi, reqs[b], counts);
    // The same request alone: its own engine (same prefill, another block layout), compressed by itself.
    engine alone = admit({reqs[b]}, 64, 1000 + static_cast<std::uint32_t>(b));
    std::vector<std::int32_t> alone_counts;
    if (!(r = compress(alone, {reqs[b]}, alone_counts)).ok()) {
      std::fprintf(stderr, "paged_engine (%s): %s alone: %s\n", backend, reqs[b].name.c_str(), r.message());
      return 1;
    }
    const std::vector<double> single = decode(alone, 0, reqs[b], alone_counts);
    const bool same =
        answer == single && std::equal(alone_counts.begin(), alone_counts.end(), counts.begin() + bi * kv_heads);
    failures += same ? 0 : 1;
    std::printf("  %-13s %2d tokens -> %2d kept per head, %lld blocks; answer %s the one-by-one answer\n",
                reqs[b].name.c_str(), reqs[b].tokens, counts[static_cast<std::size_t>(bi * kv_heads)],
                static_cast<long long>(batched.indptr[b + 1] - batched.indptr[b]), same ? "equals" : "DIFFERS FROM");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace paged_engine
