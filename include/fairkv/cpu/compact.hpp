// Stable in-place compaction: slot j of every (batch, head) row receives the token plan.indices[j]. Indices are
// strictly ascending, so a source is never overwritten before it is read and kept tokens keep their order.
// Slots at and after the new count are left as they were (the engine shortens its lengths to plan.counts).
// Everything is validated before the first write.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fairkv/cpu/executor.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/footprint.hpp"
#include "fairkv/views/kv_view.hpp"
#include "fairkv/views/paged_kv_view.hpp"

namespace fairkv::cpu {
namespace detail {

template <class Side>
void move_row(const_keep_plan_view plan, const Side& side, std::int64_t b, std::int64_t h) noexcept {
  const std::int32_t* idx = plan.row(b, h);
  const std::int32_t n = plan.count(b, h);
  for (std::int32_t j = 0; j < n; ++j) {
    if (idx[j] == j) continue;  // a kept prefix does not move
    auto* dst = side.row(b, h, j);
    const auto* src = side.row(b, h, idx[j]);
    if (side.stride_dim == 1) {
      std::memcpy(dst, src, static_cast<std::size_t>(side.head_dim) * sizeof(*dst));
    } else {
      for (std::int64_t d = 0; d < side.head_dim; ++d) dst[d * side.stride_dim] = src[d * side.stride_dim];
    }
  }
}

// Every (batch, head) row moves only its own elements (K and V are disjoint, a page belongs to one sequence and a
// head's slots in it to that head), so the rows are independent tasks. A row moved twice would be corrupted (its
// second move reads slots the first one wrote) and a row not moved leaves the cache half compacted, so every row is
// moved exactly once whatever the executor does (for_shares_exactly_once): compaction cannot fail once it starts.
template <executor E, class Side>
void move_rows(const E& ex, const_keep_plan_view plan, const Side& keys, const Side& values) noexcept {
  const std::int64_t rows = plan.batch * plan.heads;
  for_shares_exactly_once(ex, task_count(ex, rows), rows, [&](std::int64_t, std::int64_t i) {
    move_row(plan, keys, i / plan.heads, i % plan.heads);
    move_row(plan, values, i / plan.heads, i % plan.heads);
  });
}

template <class View>
[[nodiscard]] result check_extents(const_keep_plan_view plan, const View& v, const char* name) noexcept {
  if (v.batch != plan.batch || v.heads != plan.heads)
    return result::error(status::invalid_plan, "%s is [batch %lld, heads %lld] but the plan is [%lld, %lld]", name,
                         static_cast<long long>(v.batch), static_cast<long long>(v.heads),
                         static_cast<long long>(plan.batch), static_cast<long long>(plan.heads));
  for (std::int64_t b = 0; b < plan.batch; ++b)
    if (v.tokens_of(b) != plan.lengths[b])
      return result::error(status::invalid_plan, "%s sequence %lld has %lld tokens but the plan was made for %d", name,
                           static_cast<long long>(b), static_cast<long long>(v.tokens_of(b)), plan.lengths[b]);
  return {};
}

// The plan's state (keep_plan.hpp): a spent plan is refused before anything is written, and a plan is spent once
// its rows have moved.
[[nodiscard]] inline result check_not_applied(const_keep_plan_view plan) noexcept {
  if (plan.state != nullptr && plan.state->applied)
    return result::error(status::invalid_plan,
                         "this plan was already applied: compacting again would move already-compacted rows (plan "
                         "again for the compacted cache, or copy the plan before compacting to apply it to another "
                         "copy of the cache)");
  return {};
}
inline void mark_applied(const_keep_plan_view plan) noexcept {
  if (plan.state != nullptr) plan.state->applied = true;
}

}  // namespace detail

// `ex` (cpu/executor.hpp) moves the (batch, head) rows as parallel tasks; the result is the serial one, also when
// the executor throws, drops or repeats tasks (the calling thread moves the rows it did not).
template <executor E, class T>
[[nodiscard]] result compact(const E& ex, const_keep_plan_view plan, kv_view<T> keys, kv_view<T> values) noexcept {
  static_assert(!std::is_const_v<T>, "fairkv::cpu::compact writes the cache: pass views of non-const elements");
  FAIRKV_TRY(validate(plan, "plan"));
  FAIRKV_TRY(validate(keys, "keys"));
  FAIRKV_TRY(validate(values, "values"));
  // The same memory twice (or K and V overlapping) would be moved twice and corrupt both.
  FAIRKV_TRY(fairkv::detail::check_disjoint(fairkv::detail::footprint_of(keys), "keys",
                                            fairkv::detail::footprint_of(values), "values"));
  FAIRKV_TRY(validate_host_lengths(keys, "keys"));
  FAIRKV_TRY(validate_host_lengths(values, "values"));
  FAIRKV_TRY(detail::check_extents(plan, keys, "keys"));
  FAIRKV_TRY(detail::check_extents(plan, values, "values"));
  FAIRKV_TRY(detail::check_not_applied(plan));
  detail::move_rows(ex, plan, keys, values);
  detail::mark_applied(plan);
  return {};
}
template <class T>
[[nodiscard]] result compact(const_keep_plan_view plan, kv_view<T> keys, kv_view<T> values) noexcept {
  return compact(serial_executor{}, plan, keys, values);
}

// Paged: moves K and V within each sequence's own pages (validate() also refuses K and V pools that overlap).
// Pages past the new length can be freed by the engine (see compacted_pages); head_adaptive plans leave ragged
// per-head counts, the longest one decides.
template <executor E, class T>
[[nodiscard]] result compact(const E& ex, const_keep_plan_view plan, const paged_kv_view<T>& view) noexcept {
  static_assert(!std::is_const_v<T>, "fairkv::cpu::compact writes the cache: pass a view of non-const elements");
  FAIRKV_TRY(validate(plan, "plan"));
  FAIRKV_TRY(validate(view, "view"));
  FAIRKV_TRY(detail::check_extents(plan, view.keys(), "view"));
  FAIRKV_TRY(detail::check_not_applied(plan));
  detail::move_rows(ex, plan, view.keys(), view.values());
  detail::mark_applied(plan);
  return {};
}
template <class T>
[[nodiscard]] result compact(const_keep_plan_view plan, const paged_kv_view<T>& view) noexcept {
  return compact(serial_executor{}, plan, view);
}

// Pages sequence b still needs after compaction, and the fill of its last page. An engine frees pages with the
// answer, so a wrong one is a use-after-free in the engine: the plan, b and page_size are checked, and `usage` is
// written only on success.
struct page_usage {
  std::int64_t pages = 0;
  std::int64_t last_page_len = 0;
};
[[nodiscard]] inline result compacted_pages(const_keep_plan_view plan, std::int64_t b, std::int64_t page_size,
                                            page_usage& usage) noexcept {
  // Only sequence b's counts are read: an engine asks once per sequence, so checking the whole plan here would
  // make freeing a batch's pages quadratic in the batch.
  if (plan.counts == nullptr || plan.lengths == nullptr)
    return result::error(status::null_pointer, "plan: counts and lengths must be non-null");
  if (b < 0 || b >= plan.batch)
    return result::error(status::out_of_range, "sequence %lld is outside the plan's batch of %lld",
                         static_cast<long long>(b), static_cast<long long>(plan.batch));
  if (page_size <= 0)
    return result::error(status::invalid_argument, "page_size = %lld must be positive",
                         static_cast<long long>(page_size));
  std::int64_t longest = 0;
  for (std::int64_t h = 0; h < plan.heads; ++h) {
    const std::int64_t n = plan.count(b, h);
    if (n < 0 || n > plan.lengths[b])
      return result::error(status::invalid_plan, "plan: count of (batch %lld, head %lld) = %lld is outside [0, %lld]",
                           static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(n),
                           static_cast<long long>(plan.lengths[b]));
    longest = longest > n ? longest : n;
  }
  if (longest == 0) {
    usage = {};
    return {};
  }
  const std::int64_t pages = (longest - 1) / page_size + 1;  // no overflow for any count
  usage = {pages, longest - (pages - 1) * page_size};
  return {};
}

}  // namespace fairkv::cpu
