// One parity case, described with plain host types so that the CPU side (g++, Eigen) and the GPU side (nvcc)
// can share it: the same random case runs through fairkv::cpu and fairkv::cuda and the results are compared.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fairkv/allocators/debias.hpp"
#include "fairkv/allocators/fair.hpp"
#include "fairkv/allocators/fair_paper.hpp"
#include "fairkv/allocators/prioritized.hpp"
#include "fairkv/allocators/uniform.hpp"
#include "fairkv/allocators/whitelist.hpp"
#include "fairkv/budget.hpp"
#include "fairkv/dtype.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/request_batch.hpp"
#include "fairkv/layer_inputs.hpp"
#include "fairkv/policy.hpp"
#include "fairkv/scorers/external.hpp"
#include "fairkv/scorers/h2o.hpp"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/scorers/random.hpp"
#include "fairkv/scorers/snapkv.hpp"
#include "fairkv/scorers/streaming_llm.hpp"
#include "fairkv/scorers/tova.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/selectors/head_adaptive.hpp"
#include "fairkv/selectors/per_head.hpp"
#include "fairkv/selectors/union_heads.hpp"
#include "fairkv/views/kv_view.hpp"
#include "fairkv/views/paged_kv_view.hpp"
#include "fairkv/views/score_view.hpp"

namespace fairkv_test {

// A user-defined key scorer: the first element of the key, so a test controls scores exactly (ties, NaN, -0,
// +-inf) and both backends must agree bit for bit.
struct first_element {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "first_element";
  template <class Row>
  [[nodiscard]] FAIRKV_HOST_DEVICE float operator()(const Row& k, const fairkv::token_info&) const noexcept {
    return k[0];
  }
};
static_assert(fairkv::Scorer<first_element>);

enum class scorer_id { knorm, first_element, streaming_llm, snapkv, tova, h2o, external, random };
enum class selector_id { per_head, union_heads, head_adaptive };
enum class allocator_id { uniform, whitelist, fair, fair_with_whitelist, debias, fair_paper, prioritized };
enum class dtype_id { f32, f16, bf16 };
enum class layout_id { contiguous, capacity, token_major, strided_dim };
enum class attention_input { queries, rows, column_sums, local_column_sums };

[[nodiscard]] inline bool is_attention(scorer_id s) noexcept {
  return s == scorer_id::snapkv || s == scorer_id::tova || s == scorer_id::h2o;
}
[[nodiscard]] inline std::int64_t dtype_bytes(dtype_id d) noexcept { return d == dtype_id::f32 ? 4 : 2; }

struct host_case {
  std::string name;
  scorer_id scorer = scorer_id::knorm;
  selector_id selector = selector_id::per_head;
  allocator_id allocator = allocator_id::uniform;
  dtype_id dtype = dtype_id::f32;
  layout_id layout = layout_id::contiguous;
  attention_input attn = attention_input::queries;
  std::int64_t batch = 1, heads = 1, q_heads = 1, tokens = 1, head_dim = 1, capacity = 1, q_tokens = 0;
  double ratio = 0.5;
  std::optional<fairkv::keep_target> target;  // set: planned with this target (a token budget), not `ratio`
  float alpha = 0.2f;
  std::int32_t window = 16;
  std::uint32_t seed = 0;                       // random
  std::vector<fairkv::segment> segments;
  std::vector<std::int32_t> whitelist;
  fairkv::allocators::protection protect{};     // fair, fair_with_whitelist, fair_paper: sinks and boundaries
  std::vector<fairkv::segment_priority> priorities;  // prioritized: one per segment (empty: the defaults)
  fairkv::segment_priority remainder_priority{};
  std::vector<unsigned char> k_bytes, v_bytes;  // element storage in `layout`, `dtype`
  std::vector<float> queries;                   // [batch, q_heads, q_tokens, head_dim]
  std::vector<float> attention;                 // [batch, q_heads, tokens (rows), tokens]
  std::vector<float> column_sums;               // [batch, q_heads, tokens]
  std::vector<float> local_column_sums;         // [batch, q_heads, tokens]: rows renormalised to their region
  std::vector<float> scores;                    // external: [batch, heads, tokens] or token-major [batch, tokens, heads]
  bool scores_token_major = false;
  std::int64_t score_tokens = 0;                // the scores view's tokens extent; 0: the cache's
  // Per-request lists (fairkv::request_batch): set when `targets` is not empty; `segments` and `whitelist` then
  // hold every sequence's lists back to back, split by these offsets.
  std::vector<std::int32_t> seg_indptr, wl_indptr;
  std::vector<fairkv::keep_target> targets;
  [[nodiscard]] fairkv::request_batch requests() const {
    return {seg_indptr, segments, wl_indptr, whitelist, targets};
  }
};

// `f(target)` with the case's keep target: the keep_target where one is set, else the ratio as a double, so both
// overloads of every planner entry point are exercised.
template <class F>
decltype(auto) with_target(const host_case& c, F&& f) {
  if (c.target) return f(*c.target);
  return f(c.ratio);
}

// The external scores' view for a base pointer (host or device).
[[nodiscard]] inline fairkv::score_view make_scores(const host_case& c, const float* base) {
  const std::int64_t B = c.batch, H = c.heads, L = c.score_tokens != 0 ? c.score_tokens : c.tokens;
  if (c.scores_token_major) return {base, B, H, L, L * H, 1, H};
  return fairkv::make_contiguous_scores(base, B, H, L);
}

// The element view of K or V for a base pointer (host or device): the layout decides the strides.
template <class T>
[[nodiscard]] fairkv::kv_view<T> make_view(const host_case& c, T* base) {
  const std::int64_t B = c.batch, H = c.heads, L = c.tokens, D = c.head_dim, C = c.capacity;
  switch (c.layout) {
    case layout_id::contiguous: return fairkv::make_contiguous_view(base, B, H, L, D);
    case layout_id::capacity: return fairkv::make_capacity_view(base, B, H, L, C, D);
    case layout_id::token_major:  // llama.cpp rows [B][L][H * D]
      return {base, B, H, L, D, L * H * D, D, H * D, 1};
    case layout_id::strided_dim:  // every element followed by a pad element: [B, H, L, D, 2]
      return {base, B, H, L, D, H * L * D * 2, L * D * 2, D * 2, 2};
  }
  return {};
}
[[nodiscard]] inline std::int64_t storage_elements(const host_case& c) {
  const std::int64_t B = c.batch, H = c.heads, L = c.tokens, D = c.head_dim;
  switch (c.layout) {
    case layout_id::contiguous: return B * H * L * D;
    case layout_id::capacity: return B * H * c.capacity * D;
    case layout_id::token_major: return B * L * H * D;
    case layout_id::strided_dim: return B * H * L * D * 2;
  }
  return 0;
}

template <class F>
decltype(auto) with_dtype(dtype_id d, F&& f) {
  switch (d) {
    case dtype_id::f16: return f(fairkv::half_t{});
    case dtype_id::bf16: return f(fairkv::bfloat16_t{});
    default: return f(float{});
  }
}

// Runtime ids -> a compile-time policy; `f(policy, dtype tag)`. Attention and position scorers are compiled for
// float keys only (keeps the number of instantiations, and the build time on 2 cores, small).
template <class F>
fairkv::result with_policy(const host_case& c, F&& f) {
  using namespace fairkv;
  auto with_alloc = [&](auto scorer, auto selector) -> result {
    auto go = [&](auto alloc) -> result {
      const policy pol{scorer, selector, alloc};
      using S = decltype(scorer);
      if constexpr (S::source == score_source::keys) {
        return with_dtype(c.dtype, [&](auto tag) { return f(pol, tag); });
      } else {
        if (c.dtype != dtype_id::f32) return result::error(status::not_supported, "test: not compiled for this dtype");
        return f(pol, float{});
      }
    };
    switch (c.allocator) {
      case allocator_id::uniform: return go(allocators::uniform{});
      case allocator_id::whitelist: return go(allocators::whitelist{});
      case allocator_id::fair: return go(allocators::fair{c.protect});
      case allocator_id::fair_with_whitelist: return go(allocators::fair_with_whitelist{c.protect});
      case allocator_id::debias: break;  // only checked for the CUDA backend's not_supported (see the tests)
      case allocator_id::fair_paper: return go(allocators::fair_paper{c.protect});
      case allocator_id::prioritized:
        return go(allocators::prioritized{c.priorities, c.remainder_priority, c.protect});
    }
    return result::error(status::not_supported, "test: allocator not compiled");
  };
  auto with_selector = [&](auto scorer) -> result {
    switch (c.selector) {
      case selector_id::per_head: return with_alloc(scorer, selectors::per_head{});
      case selector_id::union_heads: return with_alloc(scorer, selectors::union_heads{});
      case selector_id::head_adaptive: return with_alloc(scorer, selectors::head_adaptive{c.alpha});
    }
    return result::error(status::not_supported, "test: selector");
  };
  switch (c.scorer) {
    case scorer_id::knorm: return with_selector(scorers::knorm{});
    case scorer_id::first_element: return with_selector(first_element{});
    case scorer_id::streaming_llm: return with_selector(scorers::streaming_llm<>{});
    case scorer_id::snapkv: {
      scorers::snapkv<16> s{};
      s.window = c.window;
      return with_selector(s);
    }
    case scorer_id::tova: return with_selector(scorers::tova{});
    case scorer_id::h2o: return with_selector(scorers::h2o{});
    case scorer_id::external: return with_selector(scorers::external{});
    case scorer_id::random: {
      scorers::random s{};
      s.seed = c.seed;
      return with_selector(s);
    }
  }
  return result::error(status::not_supported, "test: scorer");
}

// A paged cache (FlashInfer / vLLM model) for the compaction parity: shuffled page ids, NHD or HND pools.
struct paged_case {
  dtype_id dtype = dtype_id::f32;
  fairkv::page_layout layout = fairkv::page_layout::nhd;
  std::int64_t batch = 1, heads = 1, head_dim = 1, page_size = 1, num_pages = 1;
  std::vector<std::int32_t> indptr, indices, last_page_len;  // [batch + 1], [indptr[batch]], [batch]
  std::vector<unsigned char> k_pool, v_pool;                  // [num_pages, page_size, heads, head_dim] or HND
  bool v_other_layout = false;  // V's pool in the other layout, through the view's v_strides
};

template <class T>
[[nodiscard]] fairkv::paged_kv_view<T> make_paged(const paged_case& c, T* k, T* v, const std::int32_t* indptr,
                                                  const std::int32_t* indices, const std::int32_t* last) {
  auto view = fairkv::make_paged_view(c.layout, k, v, c.num_pages, c.page_size, c.heads, c.head_dim, c.batch, indptr,
                                      indices, last);
  if (c.v_other_layout) {
    const auto other = fairkv::make_paged_view(
        c.layout == fairkv::page_layout::nhd ? fairkv::page_layout::hnd : fairkv::page_layout::nhd, k, v,
        c.num_pages, c.page_size, c.heads, c.head_dim, c.batch, indptr, indices, last);
    const std::int64_t strides[4] = {other.stride_page, other.stride_slot, other.stride_head, other.stride_dim};
    for (int i = 0; i < 4; ++i) view.v_strides[i] = strides[i];
  }
  return view;
}

// The layer inputs for base pointers (host or device) of the case's buffers.
template <class T>
[[nodiscard]] fairkv::layer_inputs<fairkv::kv_view<const T>> make_inputs(const host_case& c, const T* keys,
                                                                          const float* queries, const float* attention,
                                                                          const float* column_sums,
                                                                          const float* scores = nullptr,
                                                                          const float* local_column_sums = nullptr) {
  fairkv::layer_inputs<fairkv::kv_view<const T>> in{make_view(c, keys)};
  if (c.scorer == scorer_id::external && scores != nullptr) in.scores = make_scores(c, scores);
  if (is_attention(c.scorer)) {
    if (c.attn == attention_input::queries) {
      in.queries = fairkv::make_contiguous_view(queries, c.batch, c.q_heads, c.q_tokens, c.head_dim);
    } else if (c.attn == attention_input::rows) {
      in.attention = attention;
      in.attention_rows = c.tokens;
      in.attention_q_heads = c.q_heads;
    } else if (c.attn == attention_input::column_sums) {
      in.attention_column_sums = column_sums;
      in.attention_q_heads = c.q_heads;
    } else {
      in.attention_local_column_sums = local_column_sums;
      in.attention_q_heads = c.q_heads;
    }
  }
  return in;
}

// The case's inputs over keys of a ragged batch, sequences up to c.tokens long (the longest): paged keys, or the
// case's own K as a padded kv_view (with lengths). The same buffers, read as a ragged batch reads them: the
// window's queries and the attention rows are the first `window` of each (head, sequence) stored (window at most
// the shortest sequence), and the attention's leading dimension is c.tokens.
template <class Keys>
[[nodiscard]] fairkv::layer_inputs<Keys> make_ragged_inputs(const host_case& c, const Keys& keys, std::int64_t window,
                                                            const float* queries, const float* attention,
                                                            const float* column_sums, const float* scores,
                                                            const float* local_column_sums) {
  using T = typename Keys::value_type;
  const auto dense = make_inputs<T>(c, static_cast<const T*>(nullptr), queries, attention, column_sums, scores,
                                    local_column_sums);
  fairkv::layer_inputs<Keys> in{keys};
  in.queries = dense.queries;
  if (in.queries.data != nullptr) in.queries.tokens = window;
  in.attention = dense.attention;
  in.attention_rows = dense.attention != nullptr ? window : 0;
  in.attention_ld = c.tokens;
  in.attention_column_sums = dense.attention_column_sums;
  in.attention_local_column_sums = dense.attention_local_column_sums;
  in.attention_q_heads = dense.attention_q_heads;
  in.scale = dense.scale;
  in.scores = dense.scores;
  return in;
}

}  // namespace fairkv_test
