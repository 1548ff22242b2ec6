// Stable in-place compaction of K and V on the device: slot j of every (batch, head) row receives the token
// plan.indices[j] (ascending, so indices[j] >= j), for dense/strided kv_views and paged views, any element type.
//
// Why not one thread per slot: slot j is the SOURCE of an earlier slot j' (indices[j'] = j) and the DESTINATION
// of slot j; if another block writes slot j before the block of j' has read it, the token is lost. The scheme
// here (docs/cuda-backend.md has the proof):
//   * a row is cut into chunks of C destination slots [j0, j1); chunks take tickets from an atomic counter, so a
//     chunk's predecessors have started before it (decoupled look-back style, no deadlock);
//   * a chunk first reads ALL its sources into shared memory, then publishes "read done";
//   * before writing its destinations it waits only for the earlier chunks whose sources meet [j0, j1)
//     (indices are ascending, so they form a range of chunks, found by binary search);
//   * sources of later chunks are >= their own destinations > j1 - 1, so this chunk never overwrites them.
// Every kept row is read once and written once (the bandwidth floor), with no copy through the workspace.
//
// The plan lives in device memory, so it is validated ON THE DEVICE by a kernel that runs first on the same
// stream: if it finds a bad plan (or bad page tables) it records the first error in the workspace and the
// compaction kernel writes nothing. read_compact_status() fetches that verdict (it synchronises the stream: call
// it off the hot path, e.g. in debug builds or tests). Host-visible arguments are checked before any launch.
#pragma once

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "fairkv/cuda/detail/launch.cuh"
#include "fairkv/cuda/detail/page_table_checks.cuh"
#include "fairkv/cuda/detail/tuning.cuh"
#include "fairkv/cuda/detail/workspace.cuh"
#include "fairkv/cuda/error.cuh"
#include "fairkv/keep_plan.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/footprint.hpp"
#include "fairkv/views/kv_view.hpp"
#include "fairkv/views/paged_kv_view.hpp"

namespace fairkv::cuda {
namespace detail {

// One block per (batch, head) row. `tokens` < 0: take each sequence's length from the side (its page table, or a
// padded kv_view's lengths, which must lie inside the view before any row is addressed through them).
template <class Side>
__global__ void validate_plan_kernel(const_keep_plan_view plan, Side side, std::int64_t tokens, device_verdict* st) {
  const std::int64_t row = blockIdx.x, b = row / plan.heads, h = row % plan.heads;
  const std::int64_t len = tokens >= 0 ? tokens : side.tokens_of(b);
  if constexpr (requires { side.lengths; }) {
    if (len < 0 || len > side.tokens) {
      if (h == 0 && threadIdx.x == 0)
        report(st, view_bad_length, static_cast<int>(b), static_cast<int>(len), static_cast<int>(side.tokens));
      return;
    }
  }
  if (h == 0 && threadIdx.x == 0 && plan.lengths[b] != len)
    report(st, compact_length_mismatch, static_cast<int>(b), -1, static_cast<int>(len));
  const std::int32_t n = plan.counts[row];
  if (n < 0 || n > len || n > plan.capacity) {
    if (threadIdx.x == 0) report(st, compact_bad_count, static_cast<int>(b), static_cast<int>(h), n);
    return;
  }
  const std::int32_t* idx = plan.row(b, h);
  for (std::int32_t j = threadIdx.x; j < n; j += blockDim.x)
    if (idx[j] < 0 || idx[j] >= len || (j > 0 && idx[j] <= idx[j - 1]))
      report(st, compact_not_ascending, static_cast<int>(b), static_cast<int>(h), j);
}

// A row of one side seen as `Unit`s: 16-byte vectors (contiguous, aligned rows) or single elements with the
// dimension stride. Units are raw bits: the copy is bit-exact for every element type.
template <class Unit, class Side>
struct unit_side {
  Side side;
  std::int64_t unit_stride;  // in units
  [[nodiscard]] __device__ Unit& at(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t u) const {
    return reinterpret_cast<Unit*>(side.row(b, h, t))[u * unit_stride];
  }
};

// grid = rows * chunks_per_row blocks, each takes the next ticket. flags [rows * chunks_per_row]
template <class Unit, class SideK, class SideV>
__global__ void __launch_bounds__(compact_threads)
    compact_kernel(const_keep_plan_view plan, unit_side<Unit, SideK> k, unit_side<Unit, SideV> v, std::int32_t chunk,
                   std::int32_t units, std::int64_t chunks_per_row, device_verdict* st, int* flags) {
  Unit* buf_k = dynamic_shared<Unit>();  // [chunk, units]
  Unit* buf_v = buf_k + static_cast<std::int64_t>(chunk) * units;  // [chunk, units]
  __shared__ std::int64_t item;
  if (threadIdx.x == 0) item = atomicAdd(&st->ticket, 1);
  __syncthreads();
  if (*static_cast<volatile int*>(&st->code) != verdict_ok) return;  // the plan failed validation: write nothing
  const std::int64_t it = item;
  const std::int64_t row = it / chunks_per_row, c = it % chunks_per_row;
  const std::int64_t b = row / plan.heads, h = row % plan.heads;
  const std::int64_t n = plan.counts[row];
  const std::int64_t j0 = c * chunk;
  const std::int32_t* idx = plan.indices + row * plan.capacity;
  auto publish = [&] {
    __threadfence();
    ::cuda::atomic_ref<int, ::cuda::thread_scope_device>(flags[it]).store(1, ::cuda::memory_order_release);
  };
  if (j0 >= n) {
    if (threadIdx.x == 0) publish();
    return;
  }
  const std::int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
  if (idx[j1 - 1] == j1 - 1) {  // ascending and indices[j] >= j: the whole chunk is an unmoved prefix
    if (threadIdx.x == 0) publish();
    return;
  }
  const std::int64_t rows_here = j1 - j0;
  for (std::int64_t u = threadIdx.x; u < rows_here * units; u += compact_threads) {
    const std::int64_t r = u / units, w = u % units;
    const std::int64_t src = idx[j0 + r];
    buf_k[r * units + w] = k.at(b, h, src, w);
    buf_v[r * units + w] = v.at(b, h, src, w);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    publish();
    // Earlier chunks of this row whose sources reach into [j0, j1) must have read them before we overwrite.
    // Chunk c' < c (always full) reads [idx[c' C], idx[c' C + C - 1]]; both ends ascend with c', so the chunks
    // that meet [j0, j1) form the range [lo, end), found by two binary searches (a row has up to thousands of
    // chunks, and only one or two of them overlap at ratio 0.5).
    std::int64_t lo = 0, hi = c;  // lo: first c' with idx[last of c'] >= j0 (c if none)
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) / 2;
      if (idx[(mid + 1) * chunk - 1] >= j0) hi = mid; else lo = mid + 1;
    }
    std::int64_t a = lo, end = c;  // end: one past the last c' with idx[first of c'] < j1
    while (a < end) {
      const std::int64_t mid = (a + end) / 2;
      if (idx[mid * chunk] < j1) a = mid + 1; else end = mid;
    }
    for (std::int64_t cp = lo; cp < end; ++cp) {
      ::cuda::atomic_ref<int, ::cuda::thread_scope_device> f(flags[row * chunks_per_row + cp]);
      while (f.load(::cuda::memory_order_acquire) == 0) {
      }
    }
    __threadfence();
  }
  __syncthreads();
  for (std::int64_t u = threadIdx.x; u < rows_here * units; u += compact_threads) {
    const std::int64_t r = u / units, w = u % units;
    const std::int64_t j = j0 + r;
    if (idx[j] == j) continue;
    k.at(b, h, j, w) = buf_k[r * units + w];
    v.at(b, h, j, w) = buf_v[r * units + w];
  }
}

struct compact_workspace {
  device_verdict* state = nullptr;  // [1]
  int* flags = nullptr;            // [rows * chunks_per_row]
  int* page_owner = nullptr;       // [num_pages] paged views: the position that claimed each page, plus one
};

inline std::size_t compact_layout(void* base, compact_workspace& w, std::int64_t items, std::int64_t pages) noexcept {
  workspace_carver c(base);
  c.carve(w.state, 1);
  c.carve(w.flags, static_cast<std::size_t>(items));
  c.carve(w.page_owner, static_cast<std::size_t>(pages));
  return c.bytes();
}

// The compaction kernel's own shared memory (its ticket), counted against the device's per-block limit.
inline constexpr std::size_t compact_static_smem = 16;

// Rows per chunk: as many K and V rows as compact_smem_bytes holds, between 1 and 64.
[[nodiscard]] inline std::int32_t chunk_rows(std::int64_t row_bytes) noexcept {
  const std::int64_t c = compact_smem_bytes / (2 * row_bytes);
  return static_cast<std::int32_t>(c < 1 ? 1 : (c > 64 ? 64 : c));
}

template <class T, class Side>
[[nodiscard]] bool vector_rows(const Side& s) noexcept {
  constexpr std::int64_t e = sizeof(T);
  bool ok = s.stride_dim == 1 && (s.head_dim * e) % 16 == 0 && reinterpret_cast<std::uintptr_t>(s.data) % 16 == 0 &&
            (s.stride_head * e) % 16 == 0;
  if constexpr (requires { s.stride_page; })
    ok = ok && (s.stride_page * e) % 16 == 0 && (s.stride_slot * e) % 16 == 0;
  else
    ok = ok && (s.stride_token * e) % 16 == 0 && (s.stride_batch * e) % 16 == 0;
  return ok;
}

// Launches validation + compaction for sides K and V (same element type T).
template <class T, class SideK, class SideV>
[[nodiscard]] result launch_compact(void* d_temp, std::size_t& bytes, const_keep_plan_view plan, const SideK& k,
                                    const SideV& v, std::int64_t head_dim, std::int64_t tokens,
                                    cudaStream_t stream) noexcept {
  const std::int64_t row_bytes = head_dim * static_cast<std::int64_t>(sizeof(T));
  if (plan.capacity < 0)
    return result::error(status::invalid_plan, "plan.capacity = %lld is negative",
                         static_cast<long long>(plan.capacity));
  const std::int32_t chunk = chunk_rows(row_bytes);
  const std::int64_t cpr = (plan.capacity + chunk - 1) / chunk;
  const std::int64_t items = plan.rows() * cpr;
  if (items > INT32_MAX)
    return result::error(status::not_supported, "the plan has too many rows x capacity for one launch");
  std::int64_t pages = 0;
  if constexpr (requires { k.indptr; }) pages = k.num_pages;
  compact_workspace w;
  const std::size_t needed = compact_layout(nullptr, w, items, pages);
  if (d_temp == nullptr) {
    bytes = needed;
    return {};
  }
  if (bytes < needed)
    return result::error(status::insufficient_workspace, "temp_storage_bytes = %zu but the compaction needs %zu",
                         bytes, needed);
  // One K and one V row at least (a chunk of rows when they fit compact_smem_bytes), opting in above 48 KiB.
  using raw = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;
  const bool vec = vector_rows<T>(k) && vector_rows<T>(v);
  const auto units = static_cast<std::int32_t>(vec ? row_bytes / 16 : head_dim);
  const std::size_t smem = 2u * static_cast<std::size_t>(chunk) * static_cast<std::size_t>(units) *
                           (vec ? sizeof(uint4) : sizeof(raw));
  if (vec)
    FAIRKV_TRY(reserve_dynamic_smem(compact_kernel<uint4, SideK, SideV>, smem, compact_static_smem, "the compaction kernel"));
  else
    FAIRKV_TRY(reserve_dynamic_smem(compact_kernel<raw, SideK, SideV>, smem, compact_static_smem, "the compaction kernel"));
  void* base = align_base(d_temp);
  compact_layout(base, w, items, pages);
  FAIRKV_CUDA_TRY(cudaMemsetAsync(base, 0, needed - workspace_carver::alignment, stream));
  if (plan.rows() == 0) return {};  // nothing to validate or move
  // Validated even when nothing can move (capacity 0), so read_compact_status reports a bad plan as the CPU does.
  FAIRKV_TRY(launch(validate_plan_kernel<SideK>, static_cast<unsigned>(plan.rows()), 256, 0, stream, plan, k, tokens,
                    w.state));
  if constexpr (requires { v.lengths; })  // a padded V with its own lengths array: the plan against it too
    if (v.lengths != k.lengths)
      FAIRKV_TRY(launch(validate_plan_kernel<SideV>, static_cast<unsigned>(plan.rows()), 256, 0, stream, plan, v,
                        tokens, w.state));
  if constexpr (requires { k.indptr; })
    FAIRKV_TRY(launch(validate_pages_kernel<T>, 64, 256, 0, stream, k, w.state, w.page_owner));
  if (items == 0) return {};
  if (vec)
    return launch(compact_kernel<uint4, SideK, SideV>, static_cast<unsigned>(items), compact_threads, smem, stream, plan,
                  unit_side<uint4, SideK>{k, 1}, unit_side<uint4, SideV>{v, 1}, chunk, units, cpr, w.state, w.flags);
  return launch(compact_kernel<raw, SideK, SideV>, static_cast<unsigned>(items), compact_threads, smem, stream, plan,
                unit_side<raw, SideK>{k, k.stride_dim}, unit_side<raw, SideV>{v, v.stride_dim}, chunk, units, cpr,
                w.state, w.flags);
}

[[nodiscard]] inline result check_plan_extents(const_keep_plan_view plan, std::int64_t batch, std::int64_t heads,
                                               const char* name) noexcept {
  if (plan.indices == nullptr || plan.counts == nullptr || plan.lengths == nullptr)
    return result::error(status::null_pointer, "plan: indices, counts and lengths must be non-null");
  if (batch != plan.batch || heads != plan.heads)
    return result::error(status::invalid_plan, "%s is [batch %lld, heads %lld] but the plan is [%lld, %lld]", name,
                         static_cast<long long>(batch), static_cast<long long>(heads),
                         static_cast<long long>(plan.batch), static_cast<long long>(plan.heads));
  return {};
}

}  // namespace detail

// Dense, strided or padded K and V (they may have different strides, e.g. transposed V; a padded view's lengths
// are device memory, checked on the device against the plan's). Two-phase temp storage.
template <class T>
[[nodiscard]] result compact(void* d_temp_storage, std::size_t& temp_storage_bytes, const_keep_plan_view plan,
                             kv_view<T> keys, kv_view<T> values, cudaStream_t stream = nullptr) noexcept {
  static_assert(!std::is_const_v<T>, "fairkv::cuda::compact writes the cache: pass views of non-const elements");
  FAIRKV_TRY(detail::check_plan_extents(plan, keys.batch, keys.heads, "keys"));
  FAIRKV_TRY(validate(keys, "keys"));
  FAIRKV_TRY(validate(values, "values"));
  // As on the CPU: K and V sharing memory would be moved twice (and the chunks' read-before-write order only holds
  // within one view).
  FAIRKV_TRY(fairkv::detail::check_disjoint(fairkv::detail::footprint_of(keys), "keys",
                                            fairkv::detail::footprint_of(values), "values"));
  FAIRKV_TRY(detail::check_plan_extents(plan, values.batch, values.heads, "values"));
  if (keys.tokens != values.tokens || keys.head_dim != values.head_dim)
    return result::error(status::invalid_shape, "keys are [tokens %lld, head_dim %lld] but values are [%lld, %lld]",
                         static_cast<long long>(keys.tokens), static_cast<long long>(keys.head_dim),
                         static_cast<long long>(values.tokens), static_cast<long long>(values.head_dim));
  // A padded batch: each sequence's length is read from the views' device lengths (checked against the plan's).
  const bool padded = keys.lengths != nullptr || values.lengths != nullptr;
  return detail::launch_compact<T>(d_temp_storage, temp_storage_bytes, plan, keys, values, keys.head_dim,
                                   padded ? -1 : keys.tokens, stream);
}

// Paged K and V: tokens move within each sequence's own pages; the page tables are device memory and are
// validated on the device. Pages past the new (longest per-head) count can then be freed by the engine.
template <class T>
[[nodiscard]] result compact(void* d_temp_storage, std::size_t& temp_storage_bytes, const_keep_plan_view plan,
                             const paged_kv_view<T>& view, cudaStream_t stream = nullptr) noexcept {
  static_assert(!std::is_const_v<T>, "fairkv::cuda::compact writes the cache: pass a view of non-const elements");
  FAIRKV_TRY(detail::check_plan_extents(plan, view.batch, view.heads, "view"));
  // The CPU's checks that need no page table: extents, aliasing and overflowing strides, K and V pools disjoint.
  FAIRKV_TRY(validate_layout(view, "view"));
  return detail::launch_compact<T>(d_temp_storage, temp_storage_bytes, plan, view.keys(), view.values(),
                                   view.head_dim, -1, stream);
}

// The device-side validation verdict of the last compact() that used this temp storage. Synchronises `stream`.
[[nodiscard]] inline result read_compact_status(const void* d_temp_storage, cudaStream_t stream = nullptr) noexcept {
  detail::device_verdict st{};
  FAIRKV_CUDA_TRY(cudaMemcpyAsync(&st, detail::align_base(const_cast<void*>(d_temp_storage)), sizeof(st),
                                  cudaMemcpyDeviceToHost, stream));
  FAIRKV_CUDA_TRY(cudaStreamSynchronize(stream));
  switch (st.code) {
    case detail::verdict_ok: return {};
    case detail::compact_length_mismatch:
      return result::error(status::invalid_plan, "view sequence %d has %d tokens but the plan was made for another length",
                           st.a, st.c);
    case detail::view_bad_length:
      return result::error(status::invalid_shape, "view: lengths[%d] = %d is outside [0, tokens %d]", st.a, st.b,
                           st.c);
    case detail::compact_bad_count:
      return result::error(status::invalid_plan, "plan: count of (batch %d, head %d) = %d exceeds its length", st.a,
                           st.b, st.c);
    case detail::compact_not_ascending:
      return result::error(status::invalid_plan,
                           "plan: indices of (batch %d, head %d) are not strictly ascending inside the sequence at %d",
                           st.a, st.b, st.c);
    case detail::table_bad_indptr:
    case detail::table_bad_page:
    case detail::table_duplicate_page:
    case detail::table_bad_last_page_len: return detail::table_error(st, "view");
    case detail::compact_page_in_source:
      return result::error(status::invalid_argument,
                           "to.indices[%d] = page %d is also in from's table: the copy would overwrite tokens it reads",
                           st.a, st.b);
    case detail::compact_no_room:
      return result::error(status::invalid_shape,
                           "to: sequence %d has room for %d tokens but its longest head keeps %d", st.a, st.b, st.c);
    default: return result::error(status::internal_error, "unknown compaction status %d", st.code);
  }
}

}  // namespace fairkv::cuda
