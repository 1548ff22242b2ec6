// Out-of-place paged compaction on the device, cpu::compact_into's semantics (fairkv/cpu/compact_into.hpp): the kept
// tokens of sequence b, read through `from`'s page table (whose pages other sequences may list too), written in
// order to slots [0, count(b, h)) of `to`'s pages. `from` is never written. The page tables live in device memory
// and are validated there (read_compact_status reports what failed); nothing is copied once validation fails.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "fairkv/cuda/compact.cuh"
#include "fairkv/cuda/detail/launch.cuh"
#include "fairkv/cuda/detail/workspace.cuh"
#include "fairkv/keep_plan.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/footprint.hpp"
#include "fairkv/views/paged_kv_view.hpp"

namespace fairkv::cuda {
namespace detail {

// mark[page] = 1 for every page `from` lists (in range; validate_pages_kernel reports the others).
template <class T>
__global__ void mark_source_pages_kernel(paged_side<T> from, int* mark) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < from.indptr[from.batch];
       i += stride)
    if (from.indices[i] >= 0 && from.indices[i] < from.num_pages) mark[from.indices[i]] = 1;
}

// A destination page that is also a source page (one pool).
template <class T>
__global__ void check_source_pages_kernel(paged_side<T> to, const int* mark, device_verdict* st) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < to.indptr[to.batch];
       i += stride) {
    const std::int32_t page = to.indices[i];
    if (page >= 0 && page < to.num_pages && mark[page] != 0)
      report(st, compact_page_in_source, static_cast<int>(i), page, -1);
  }
}

// Every destination sequence holds its longest head's kept tokens. One thread per sequence.
template <class T>
__global__ void check_room_kernel(const_keep_plan_view plan, paged_side<T> to, device_verdict* st) {
  const std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (b >= plan.batch) return;
  std::int32_t longest = 0;
  for (std::int64_t h = 0; h < plan.heads; ++h) {
    const std::int32_t n = plan.counts[b * plan.heads + h];
    longest = n > longest ? n : longest;
  }
  if (to.tokens_of(b) < longest)
    report(st, compact_no_room, static_cast<int>(b), static_cast<int>(to.tokens_of(b)), longest);
}

// One block per (row, chunk of `chunk` slots): slot j of `to` receives token indices[j] of `from`, unit by unit.
// Source and destination are disjoint, so the blocks need no order among themselves.
template <class Unit, class FromK, class FromV, class ToK, class ToV>
__global__ void __launch_bounds__(compact_threads)
    copy_kernel(const_keep_plan_view plan, FromK fk, FromV fv, ToK tk, ToV tv, std::int64_t k_unit_stride,
                std::int64_t v_unit_stride, std::int64_t tk_unit_stride, std::int64_t tv_unit_stride,
                std::int32_t chunk, std::int32_t units, std::int64_t chunks_per_row, const device_verdict* st) {
  if (*static_cast<const volatile int*>(&st->code) != verdict_ok) return;  // validation failed: write nothing
  const std::int64_t row = blockIdx.x / chunks_per_row, c = blockIdx.x % chunks_per_row;
  const std::int64_t b = row / plan.heads, h = row % plan.heads, n = plan.counts[row];
  const std::int64_t j0 = c * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
  const std::int32_t* idx = plan.indices + row * plan.capacity;
  for (std::int64_t u = threadIdx.x; u < (j1 - j0) * units; u += compact_threads) {
    const std::int64_t j = j0 + u / units, w = u % units, src = idx[j];
    reinterpret_cast<Unit*>(tk.row(b, h, j))[w * tk_unit_stride] =
        reinterpret_cast<const Unit*>(fk.row(b, h, src))[w * k_unit_stride];
    reinterpret_cast<Unit*>(tv.row(b, h, j))[w * tv_unit_stride] =
        reinterpret_cast<const Unit*>(fv.row(b, h, src))[w * v_unit_stride];
  }
}

struct compact_into_workspace {
  device_verdict* state = nullptr;  // [1]
  int* owner = nullptr;            // [to.num_pages] the destination's page claims (a page listed twice)
  int* mark = nullptr;             // [from.num_pages] one pool: the source's pages
};

inline std::size_t compact_into_layout(void* base, compact_into_workspace& w, std::int64_t to_pages,
                                       std::int64_t from_pages) noexcept {
  workspace_carver c(base);
  c.carve(w.state, 1);
  c.carve(w.owner, static_cast<std::size_t>(to_pages));
  c.carve(w.mark, static_cast<std::size_t>(from_pages));
  return c.bytes();
}

}  // namespace detail

// Two-phase temp storage, as compact(). Host checks (extents, layouts, two pools' memory) return an error here;
// the page tables' checks run on `stream` and read_compact_status(d_temp_storage) reports them.
template <class T>
[[nodiscard]] result compact_into(void* d_temp_storage, std::size_t& temp_storage_bytes, const_keep_plan_view plan,
                                  const paged_kv_view<const T>& from, const paged_kv_view<T>& to,
                                  cudaStream_t stream = nullptr) noexcept {
  static_assert(!std::is_const_v<T>, "fairkv::cuda::compact_into writes `to`: pass a view of non-const elements");
  using namespace detail;
  FAIRKV_TRY(check_plan_extents(plan, from.batch, from.heads, "from"));
  if (to.batch != plan.batch || to.heads != plan.heads || to.head_dim != from.head_dim)
    return result::error(
        status::invalid_shape, "to is [batch %lld, heads %lld, head_dim %lld] but from is [%lld, %lld, %lld]",
        static_cast<long long>(to.batch), static_cast<long long>(to.heads), static_cast<long long>(to.head_dim),
        static_cast<long long>(from.batch), static_cast<long long>(from.heads), static_cast<long long>(from.head_dim));
  if (plan.capacity < 0)
    return result::error(status::invalid_plan, "plan.capacity = %lld is negative",
                         static_cast<long long>(plan.capacity));
  FAIRKV_TRY(validate_layout(from, "from"));
  FAIRKV_TRY(validate_layout(to, "to"));
  const bool one_pool = same_pool(from, to);
  if (!one_pool) FAIRKV_TRY(check_pools_apart(from, to));
  const std::int64_t row_bytes = to.head_dim * static_cast<std::int64_t>(sizeof(T));
  const std::int32_t chunk = chunk_rows(row_bytes);
  const std::int64_t cpr = (plan.capacity + chunk - 1) / chunk, blocks = plan.rows() * cpr;
  if (blocks > INT32_MAX)
    return result::error(status::not_supported, "the plan has too many rows x capacity for one launch");
  compact_into_workspace w;
  const std::size_t needed = compact_into_layout(nullptr, w, to.num_pages, one_pool ? from.num_pages : 0);
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = needed;
    return {};
  }
  if (temp_storage_bytes < needed)
    return result::error(status::insufficient_workspace, "temp_storage_bytes = %zu but the compaction needs %zu",
                         temp_storage_bytes, needed);
  void* base = align_base(d_temp_storage);
  compact_into_layout(base, w, to.num_pages, one_pool ? from.num_pages : 0);
  FAIRKV_CUDA_TRY(cudaMemsetAsync(base, 0, needed - workspace_carver::alignment, stream));
  if (plan.rows() == 0) return {};
  FAIRKV_TRY(launch(validate_plan_kernel<paged_side<const T>>, static_cast<unsigned>(plan.rows()), 256, 0, stream, plan,
                    from.keys(), std::int64_t{-1}, w.state));
  FAIRKV_TRY(
      launch(validate_pages_kernel<const T>, 64, 256, 0, stream, from.keys(), w.state, static_cast<int*>(nullptr)));
  FAIRKV_TRY(launch(validate_pages_kernel<T>, 64, 256, 0, stream, to.keys(), w.state, w.owner));
  if (one_pool) {
    FAIRKV_TRY(launch(mark_source_pages_kernel<const T>, 64, 256, 0, stream, from.keys(), w.mark));
    FAIRKV_TRY(
        launch(check_source_pages_kernel<T>, 64, 256, 0, stream, to.keys(), static_cast<const int*>(w.mark), w.state));
  }
  FAIRKV_TRY(launch(check_room_kernel<T>, static_cast<unsigned>((plan.batch + 255) / 256), 256, 0, stream, plan,
                    to.keys(), w.state));
  if (blocks == 0) return {};
  const auto fk = from.keys(), fv = from.values();
  const auto tk = to.keys(), tv = to.values();
  const bool vec = vector_rows<T>(fk) && vector_rows<T>(fv) && vector_rows<T>(tk) && vector_rows<T>(tv);
  const auto g = static_cast<unsigned>(blocks);
  if (vec) {
    const auto units = static_cast<std::int32_t>(row_bytes / 16);
    return launch(copy_kernel<uint4, paged_side<const T>, paged_side<const T>, paged_side<T>, paged_side<T>>, g,
                  compact_threads, 0, stream, plan, fk, fv, tk, tv, std::int64_t{1}, std::int64_t{1}, std::int64_t{1},
                  std::int64_t{1}, chunk, units, cpr, static_cast<const device_verdict*>(w.state));
  }
  using raw = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;
  return launch(copy_kernel<raw, paged_side<const T>, paged_side<const T>, paged_side<T>, paged_side<T>>, g,
                compact_threads, 0, stream, plan, fk, fv, tk, tv, fk.stride_dim, fv.stride_dim, tk.stride_dim,
                tv.stride_dim, chunk, static_cast<std::int32_t>(to.head_dim), cpr,
                static_cast<const device_verdict*>(w.state));
}

}  // namespace fairkv::cuda
