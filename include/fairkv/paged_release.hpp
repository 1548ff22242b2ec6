// What a paged engine does after a compaction: its new page table and the pages it may free. Compaction moves every
// kept token of a sequence to the front of that sequence's own pages, in order, so the sequence keeps the first
// ceil(longest count / page_size) pages of its list (head_adaptive plans leave ragged per-head counts; the longest
// decides) and every later page is free. release_pages writes, for the whole batch at once, the compacted table in
// FlashInfer's CSR form (indptr, indices, last_page_len) and the freed pages per sequence, so the engine updates its
// block table and free list without deriving them. Host code for both backends: after a CUDA plan, copy its counts
// and lengths ([batch * heads] and [batch] int32) to the host and pass them (indices may then be null).
//
// Release the pages only after the compaction has run (on CUDA: after the stream has executed it): compaction reads
// tokens from the pages this frees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "fairkv/keep_plan.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/paged_kv_view.hpp"

namespace fairkv {

// Engine-owned outputs. Capacities: indptr and freed_indptr batch + 1, last_page_len batch, indices and freed as many
// entries as the view's table lists (view.indptr[batch]). They may be the view's own arrays (everything is read
// before anything is written), but not overlap each other.
struct paged_release {
  std::int32_t* indptr = nullptr;   // [batch + 1] the compacted table's offsets
  std::int32_t* indices = nullptr;  // the compacted table: each sequence's first pages, in order (null: not written)
  std::int32_t* last_page_len = nullptr;  // [batch] in [1, page_size], 0 for a sequence that keeps no token
  std::int32_t* freed_indptr = nullptr;   // [batch + 1] offsets of each sequence's freed pages in `freed`
  // The pages each sequence no longer needs, its last page first: the order vLLM's block manager frees a request's
  // blocks in (tail first), so a prefix cache evicts them before the prefix they extend.
  std::int32_t* freed = nullptr;
};

namespace detail {
[[nodiscard]] inline bool ranges_overlap(const std::int32_t* a, std::int64_t na, const std::int32_t* b,
                                         std::int64_t nb) noexcept {
  if (a == nullptr || b == nullptr || na <= 0 || nb <= 0) return false;
  const auto lo_a = reinterpret_cast<std::uintptr_t>(a), lo_b = reinterpret_cast<std::uintptr_t>(b);
  const auto hi_a = lo_a + static_cast<std::uintptr_t>(na) * sizeof(std::int32_t);
  const auto hi_b = lo_b + static_cast<std::uintptr_t>(nb) * sizeof(std::int32_t);
  return lo_a < hi_b && lo_b < hi_a;
}
}  // namespace detail

// The compacted page table and the freed pages of every sequence of `view` under `plan` (the plan the compaction
// applied, spent or not: its counts are what this reads). On error nothing is written.
template <class T>
[[nodiscard]] result release_pages(const_keep_plan_view plan, const paged_kv_view<T>& view,
                                   const paged_release& out) noexcept {
  if (plan.counts == nullptr || plan.lengths == nullptr)
    return result::error(status::null_pointer, "plan: counts and lengths must be non-null");
  if (out.indptr == nullptr || out.last_page_len == nullptr || out.freed_indptr == nullptr || out.freed == nullptr)
    return result::error(status::null_pointer,
                         "release: indptr, last_page_len, freed_indptr and freed must be non-null");
  FAIRKV_TRY(validate(view, "view"));
  if (plan.batch != view.batch || plan.heads != view.heads)
    return result::error(status::invalid_shape, "plan is [batch %lld, heads %lld] but view is [%lld, %lld]",
                         static_cast<long long>(plan.batch), static_cast<long long>(plan.heads),
                         static_cast<long long>(view.batch), static_cast<long long>(view.heads));
  const std::int64_t B = view.batch, nnz = view.indptr[B];
  // Outputs overlapping each other would be written twice.
  const struct {
    const std::int32_t* p;
    std::int64_t n;
    const char* name;
  } outs[] = {{out.indptr, B + 1, "indptr"},
              {out.indices, nnz, "indices"},
              {out.last_page_len, B, "last_page_len"},
              {out.freed_indptr, B + 1, "freed_indptr"},
              {out.freed, nnz, "freed"}};
  for (std::size_t i = 0; i < std::size(outs); ++i)
    for (std::size_t j = i + 1; j < std::size(outs); ++j)
      if (detail::ranges_overlap(outs[i].p, outs[i].n, outs[j].p, outs[j].n))
        return result::error(status::invalid_argument, "release: %s and %s overlap", outs[i].name, outs[j].name);

  std::vector<std::int32_t> kept_pages, last, table;
  try {
    kept_pages.resize(static_cast<std::size_t>(B));
    last.resize(static_cast<std::size_t>(B));
    table.assign(view.indices, view.indices + nnz);
  } catch (...) {
    return result::error(status::out_of_memory, "release: %lld pages of scratch could not be allocated",
                         static_cast<long long>(nnz));
  }
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = view.tokens_of(b);
    if (plan.lengths[b] != L)
      return result::error(status::invalid_plan, "plan was made for %d tokens of sequence %lld, the view holds %lld",
                           plan.lengths[b], static_cast<long long>(b), static_cast<long long>(L));
    std::int64_t longest = 0;
    for (std::int64_t h = 0; h < plan.heads; ++h) {
      const std::int64_t n = plan.count(b, h);
      if (n < 0 || n > L)
        return result::error(status::invalid_plan, "plan: count of (batch %lld, head %lld) = %lld is outside [0, %lld]",
                             static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(n),
                             static_cast<long long>(L));
      longest = n > longest ? n : longest;
    }
    const std::int64_t pages = longest == 0 ? 0 : (longest - 1) / view.page_size + 1;
    kept_pages[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(pages);
    last[static_cast<std::size_t>(b)] =
        static_cast<std::int32_t>(longest - (pages > 0 ? (pages - 1) * view.page_size : 0));
  }
  std::vector<std::int32_t> old_indptr(view.indptr, view.indptr + B + 1);

  // Everything is read; now the outputs (which may be the view's own arrays).
  std::int64_t kept_at = 0, freed_at = 0;
  out.indptr[0] = 0;
  out.freed_indptr[0] = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t first = old_indptr[static_cast<std::size_t>(b)],
                       end = old_indptr[static_cast<std::size_t>(b) + 1];
    const std::int64_t keep = kept_pages[static_cast<std::size_t>(b)];
    if (out.indices != nullptr)
      for (std::int64_t i = 0; i < keep; ++i) out.indices[kept_at + i] = table[static_cast<std::size_t>(first + i)];
    for (std::int64_t i = end - 1; i >= first + keep; --i) out.freed[freed_at++] = table[static_cast<std::size_t>(i)];
    kept_at += keep;
    out.indptr[b + 1] = static_cast<std::int32_t>(kept_at);
    out.freed_indptr[b + 1] = static_cast<std::int32_t>(freed_at);
    out.last_page_len[b] = last[static_cast<std::size_t>(b)];
  }
  return {};
}

}  // namespace fairkv
