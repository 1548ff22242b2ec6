// Out-of-place paged compaction, for pages that other sequences or a prefix cache also read: in-place compaction
// would rewrite them under their other readers. The kept tokens of sequence b are read through `from`'s page table
// and written, in order, to slots [0, count(b, h)) of the pages `to` lists for b, which the engine allocated for the
// compressed copy. An engine compresses a shared system prompt once this way and points every request that shares
// it at the copy (docs/integration.md, "Shared prefix pages").
//
// `from` is only read: its tables may list a page for several sequences. `to` is written: it must list no page
// twice and nothing of `from` (one pool: no page in both tables; two pools: disjoint memory). Everything is
// validated before the first write; `from` is never written, so the plan stays unspent and may be applied again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fairkv/cpu/compact.hpp"
#include "fairkv/cpu/executor.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/paged_kv_view.hpp"

namespace fairkv::cpu {
namespace detail {

template <class From, class To>
void copy_row(const_keep_plan_view plan, const From& from, const To& to, std::int64_t b, std::int64_t h) noexcept {
  const std::int32_t* idx = plan.row(b, h);
  const std::int32_t n = plan.count(b, h);
  for (std::int32_t j = 0; j < n; ++j) {
    auto* dst = to.row(b, h, j);
    const auto* src = from.row(b, h, idx[j]);
    if (from.stride_dim == 1 && to.stride_dim == 1) {
      std::memcpy(dst, src, static_cast<std::size_t>(to.head_dim) * sizeof(*dst));
    } else {
      for (std::int64_t d = 0; d < to.head_dim; ++d) dst[d * to.stride_dim] = src[d * from.stride_dim];
    }
  }
}

// `to` writes none of `from`'s memory.
template <class T>
[[nodiscard]] result check_apart(const paged_kv_view<const T>& from, const paged_kv_view<T>& to) noexcept {
  if (!same_pool(from, to)) return check_pools_apart(from, to);
  // One pool: page ids compare. One bit per page of the pool (validate() bounded every id by num_pages).
  std::vector<std::uint64_t> listed;
  try {
    listed.resize(static_cast<std::size_t>((from.num_pages + 63) / 64));
  } catch (...) {
    return result::error(status::out_of_memory, "compact_into: a bitmap of %lld pool pages could not be allocated",
                         static_cast<long long>(from.num_pages));
  }
  for (std::int64_t i = 0; i < from.indptr[from.batch]; ++i)
    listed[static_cast<std::size_t>(from.indices[i]) / 64] |= std::uint64_t{1} << (from.indices[i] % 64);
  for (std::int64_t i = 0; i < to.indptr[to.batch]; ++i)
    if (listed[static_cast<std::size_t>(to.indices[i]) / 64] >> (to.indices[i] % 64) & 1u)
      return result::error(status::invalid_argument,
                           "to.indices[%lld] = page %d is also in from's table: the copy would overwrite tokens it "
                           "reads (give the compressed copy pages of its own)",
                           static_cast<long long>(i), to.indices[i]);
  return {};
}

}  // namespace detail

// `ex` copies the (batch, head) rows as parallel tasks (each row once, whatever the executor does).
template <executor E, class T>
[[nodiscard]] result compact_into(const E& ex, const_keep_plan_view plan, const paged_kv_view<const T>& from,
                                  const paged_kv_view<T>& to) noexcept {
  static_assert(!std::is_const_v<T>, "fairkv::cpu::compact_into writes `to`: pass a view of non-const elements");
  FAIRKV_TRY(validate(plan, "plan"));
  // `from`: layouts and page ids in range; a page listed twice is allowed (it is only read).
  FAIRKV_TRY(validate_layout(from, "from"));
  FAIRKV_TRY(validate(from.keys(), "from"));
  FAIRKV_TRY(validate(to, "to"));  // every page of `to` once
  FAIRKV_TRY(detail::check_extents(plan, from.keys(), "from"));
  if (to.batch != plan.batch || to.heads != plan.heads || to.head_dim != from.head_dim)
    return result::error(
        status::invalid_shape, "to is [batch %lld, heads %lld, head_dim %lld] but from is [%lld, %lld, %lld]",
        static_cast<long long>(to.batch), static_cast<long long>(to.heads), static_cast<long long>(to.head_dim),
        static_cast<long long>(from.batch), static_cast<long long>(from.heads), static_cast<long long>(from.head_dim));
  for (std::int64_t b = 0; b < plan.batch; ++b) {
    std::int64_t longest = 0;
    for (std::int64_t h = 0; h < plan.heads; ++h) longest = std::max<std::int64_t>(longest, plan.count(b, h));
    if (to.tokens_of(b) < longest)
      return result::error(status::invalid_shape,
                           "to: sequence %lld has room for %lld tokens but its longest head keeps %lld (size its pages "
                           "with compacted_pages)",
                           static_cast<long long>(b), static_cast<long long>(to.tokens_of(b)),
                           static_cast<long long>(longest));
  }
  // An applied plan's indices describe the cache after an in-place compaction, not `from`.
  FAIRKV_TRY(detail::check_not_applied(plan));
  FAIRKV_TRY(detail::check_apart(from, to));
  const std::int64_t rows = plan.batch * plan.heads;
  detail::for_shares_exactly_once(ex, detail::task_count(ex, rows), rows, [&](std::int64_t, std::int64_t i) {
    detail::copy_row(plan, from.keys(), to.keys(), i / plan.heads, i % plan.heads);
    detail::copy_row(plan, from.values(), to.values(), i / plan.heads, i % plan.heads);
  });
  return {};
}
template <class T>
[[nodiscard]] result compact_into(const_keep_plan_view plan, const paged_kv_view<const T>& from,
                                  const paged_kv_view<T>& to) noexcept {
  return compact_into(serial_executor{}, plan, from, to);
}

}  // namespace fairkv::cpu
