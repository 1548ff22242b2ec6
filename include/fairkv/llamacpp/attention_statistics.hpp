// What an attention scorer reads about one layer of a llama.cpp sequence: one statistic of its prefill, as a
// closed set of types. Each alternative names its own layout and checks its own size, so a caller cannot hand
// over a statistic with the wrong shape or two statistics at once (layer_inputs' nullable fields allow both).
//
// Every statistic covers the n cells being compressed and the model's n_head query heads. A llama.cpp application
// gets them from its prefill through ggml's eval callback (fairkv-llamacpp's prefill_capture.hpp shows how); key
// and position scorers need none of them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>

#include "fairkv/layer_inputs.hpp"
#include "fairkv/views/kv_view.hpp"

namespace fairkv::llamacpp {

// No statistic: knorm, streaming_llm, random.
struct no_statistics {
  static constexpr const char* name = "none";
};

// Post-RoPE queries of the prefill, [n][n_head * head_dim] as llama.cpp lays out a Q row: the reference path, from
// which every attention scorer recomputes what it needs.
struct query_rows {
  static constexpr const char* name = "queries";
  std::span<const float> data;
  int n_head = 0;
};

// Each key's softmax attention summed over every causal query, [n_head][n]: what plain H2O reads.
struct column_sums {
  static constexpr const char* name = "column_sums";
  std::span<const float> data;
  int n_head = 0;
};

// The same sums with each query's row renormalised to the scoring region it lies in, [n_head][n]: what H2O reads
// under a segment-local allocator. Only valid for the regions fairkv::scoring_regions gives for the policy and
// segments being compressed; the caller accumulated them for those regions.
struct local_column_sums {
  static constexpr const char* name = "local_column_sums";
  std::span<const float> data;
  int n_head = 0;
};

// The last `rows` softmax rows of the prefill, [n_head][rows][n]: SnapKV reads its window's rows, TOVA the last.
struct last_rows {
  static constexpr const char* name = "last_rows";
  std::span<const float> data;
  int n_head = 0;
  int rows = 0;
};

using attention_statistics = std::variant<no_statistics, query_rows, column_sums, local_column_sums, last_rows>;

[[nodiscard]] inline const char* name_of(const attention_statistics& s) {
  return std::visit([](const auto& x) { return x.name; }, s);
}

namespace detail {

inline std::string size_error(const char* what, std::size_t got, std::size_t want, const char* layout) {
  return std::string(what) + " holds " + std::to_string(got) + " floats, not " + std::to_string(want) + " (" + layout +
         ")";
}

}  // namespace detail

// Binds `s` into `in` for a sequence of n cells whose keys have head_dim values per head; empty on success, else
// why the statistic does not fit (and `in` is unchanged).
template <class K>
[[nodiscard]] std::string bind_statistics(const attention_statistics& s, std::int64_t n, std::int64_t head_dim,
                                          layer_inputs<K>& in) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, no_statistics>) {
          return {};
        } else {
          if (x.n_head < 1) return std::string(T::name) + ": n_head " + std::to_string(x.n_head) + " < 1";
          const std::size_t cells = std::size_t(x.n_head) * std::size_t(n);
          if constexpr (std::is_same_v<T, query_rows>) {
            if (x.data.size() != cells * std::size_t(head_dim))
              return detail::size_error(T::name, x.data.size(), cells * std::size_t(head_dim),
                                        "[n][n_head * head_dim]");
            const std::int64_t row = std::int64_t(x.n_head) * head_dim;
            in.queries = kv_view<const float>{x.data.data(), 1, x.n_head, n, head_dim, 0, head_dim, row, 1};
          } else if constexpr (std::is_same_v<T, last_rows>) {
            if (x.rows < 1) return std::string(T::name) + ": rows " + std::to_string(x.rows) + " < 1";
            if (x.data.size() != cells * std::size_t(x.rows))
              return detail::size_error(T::name, x.data.size(), cells * std::size_t(x.rows), "[n_head][rows][n]");
            in.attention = x.data.data();
            in.attention_rows = x.rows;
            in.attention_ld = n;
            in.attention_q_heads = x.n_head;
          } else {
            if (x.data.size() != cells) return detail::size_error(T::name, x.data.size(), cells, "[n_head][n]");
            if constexpr (std::is_same_v<T, column_sums>)
              in.attention_column_sums = x.data.data();
            else
              in.attention_local_column_sums = x.data.data();
            in.attention_q_heads = x.n_head;
          }
          return {};
        }
      },
      s);
}

}  // namespace fairkv::llamacpp
