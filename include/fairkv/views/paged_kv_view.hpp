// A non-owning view of a paged KV cache in the FlashInfer / vLLM domain model: one page pool per K and V,
// explicit strides, and per-sequence page tables given by indptr / indices / last_page_len.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "fairkv/config.hpp"
#include "fairkv/detail/checked_math.hpp"
#include "fairkv/dtype.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/footprint.hpp"

namespace fairkv {

enum class page_layout : std::uint8_t {
  nhd,  // [num_pages, page_size, heads, head_dim]
  hnd,  // [num_pages, heads, page_size, head_dim]
};

// One side (K or V) of a paged view: the accessor a scorer or a compaction loop walks.
template <class T>
struct paged_side {
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  T* data = nullptr;                        // page pool, layout given by the strides
  std::int64_t num_pages = 0;
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t page_size = 0;
  std::int64_t stride_page = 0;             // in elements
  std::int64_t stride_slot = 0;
  std::int64_t stride_head = 0;
  std::int64_t stride_dim = 1;
  const std::int32_t* indptr = nullptr;     // [batch + 1]
  const std::int32_t* indices = nullptr;    // [indptr[batch]]
  const std::int32_t* last_page_len = nullptr;  // [batch]

  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr std::int64_t tokens_of(std::int64_t b) const noexcept {
    const std::int64_t pages = indptr[b + 1] - indptr[b];
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[b];
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr T* row(std::int64_t b, std::int64_t h, std::int64_t t) const noexcept {
    const std::int64_t page = indices[indptr[b] + t / page_size];
    return data + page * stride_page + (t % page_size) * stride_slot + h * stride_head;
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr bool rows_contiguous() const noexcept { return stride_dim == 1; }
};

template <class T>
struct paged_kv_view {
  static_assert(is_element_type_v<std::remove_const_t<T>>,
                "fairkv::paged_kv_view<T>: T must be float, fairkv::half_t or fairkv::bfloat16_t");
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  T* k_data = nullptr;                      // [num_pages, page_size, heads, head_dim] (NHD) or
  T* v_data = nullptr;                      // [num_pages, heads, page_size, head_dim] (HND); same for V
  std::int64_t num_pages = 0;
  std::int64_t page_size = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t stride_page = 0;             // in elements: K's pool, and V's unless v_strides says otherwise
  std::int64_t stride_slot = 0;
  std::int64_t stride_head = 0;
  std::int64_t stride_dim = 1;
  std::int64_t batch = 0;
  const std::int32_t* indptr = nullptr;         // [batch + 1] offsets of each sequence's pages in `indices`
  const std::int32_t* indices = nullptr;        // [indptr[batch]] page ids, in token order
  const std::int32_t* last_page_len = nullptr;  // [batch] filled slots of the last page, 1..page_size
  // V's pool strides where they differ from K's (a pool that pads or orders V its own way, as vLLM's and
  // FlashInfer's allow): page, slot, head, dim. All zero (the default): V has K's strides.
  std::int64_t v_strides[4] = {0, 0, 0, 0};

  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr bool v_has_own_strides() const noexcept {
    return v_strides[0] != 0 || v_strides[1] != 0 || v_strides[2] != 0 || v_strides[3] != 0;
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr paged_side<T> keys() const noexcept {
    return side(k_data, stride_page, stride_slot, stride_head, stride_dim);
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr paged_side<T> values() const noexcept {
    return v_has_own_strides() ? side(v_data, v_strides[0], v_strides[1], v_strides[2], v_strides[3])
                               : side(v_data, stride_page, stride_slot, stride_head, stride_dim);
  }
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr std::int64_t tokens_of(std::int64_t b) const noexcept {
    return keys().tokens_of(b);
  }
  // The same view, read-only (what out-of-place compaction reads from).
  [[nodiscard]] constexpr paged_kv_view<const value_type> as_const() const noexcept {
    return {k_data, v_data, num_pages, page_size, heads, head_dim, stride_page, stride_slot, stride_head, stride_dim,
            batch, indptr, indices, last_page_len, {v_strides[0], v_strides[1], v_strides[2], v_strides[3]}};
  }

 private:
  // K and V share the page table; the pools and, optionally, their strides differ.
  [[nodiscard]] FAIRKV_HOST_DEVICE constexpr paged_side<T> side(T* pool, std::int64_t sp, std::int64_t ss,
                                                                std::int64_t sh, std::int64_t sd) const noexcept {
    return {pool, num_pages, batch, heads, head_dim, page_size, sp, ss, sh, sd, indptr, indices, last_page_len};
  }
};

// Densely packed pools in the given layout.
template <class T>
[[nodiscard]] constexpr paged_kv_view<T> make_paged_view(page_layout layout, T* k_data, T* v_data,
                                                         std::int64_t num_pages, std::int64_t page_size,
                                                         std::int64_t heads, std::int64_t head_dim,
                                                         std::int64_t batch, const std::int32_t* indptr,
                                                         const std::int32_t* indices,
                                                         const std::int32_t* last_page_len) noexcept {
  // Saturated like make_contiguous_view: an overflowing product is rejected by validate() naming the stride.
  using detail::saturating_mul;
  paged_kv_view<T> v{k_data, v_data, num_pages, page_size, heads, head_dim,
                     saturating_mul(saturating_mul(page_size, heads), head_dim),
                     0, 0, 1, batch, indptr, indices, last_page_len};
  if (layout == page_layout::nhd) {
    v.stride_slot = saturating_mul(heads, head_dim);
    v.stride_head = head_dim;
  } else {
    v.stride_head = saturating_mul(page_size, head_dim);
    v.stride_slot = head_dim;
  }
  return v;
}

namespace detail {
// The page pool [num_pages, page_size, heads, head_dim] with its strides, named as the fields.
template <class T>
[[nodiscard]] footprint footprint_of(const paged_side<T>& v) noexcept {
  return {reinterpret_cast<std::uintptr_t>(v.data),
          static_cast<std::int64_t>(sizeof(T)),
          4,
          {{v.num_pages, v.stride_page, "num_pages", "stride_page"},
           {v.page_size, v.stride_slot, "page_size", "stride_slot"},
           {v.heads, v.stride_head, "heads", "stride_head"},
           {v.head_dim, v.stride_dim, "head_dim", "stride_dim"}}};
}
}  // namespace detail

// What can be checked without reading the page tables (which the CUDA backend keeps in device memory): pointers
// non-null, positive extents and strides, no two pool elements aliasing (pages, slots, heads and dims in any
// order, as for kv_view: overlapping pages would make compaction copy onto its own source), and a pool whose
// every offset is computable without overflow.
template <class T>
[[nodiscard]] result validate_layout(const paged_side<T>& v, const char* name) noexcept {
  if (v.data == nullptr) return result::error(status::null_pointer, "%s.data is null", name);
  if (v.indptr == nullptr || v.indices == nullptr || v.last_page_len == nullptr)
    return result::error(status::null_pointer, "%s: indptr, indices and last_page_len must all be non-null", name);
  if (v.batch <= 0 || v.num_pages <= 0 || v.page_size <= 0 || v.heads <= 0 || v.head_dim <= 0)
    return result::error(status::invalid_shape,
                         "%s: batch, num_pages, page_size, heads and head_dim must be positive", name);
  if (v.stride_page <= 0 || v.stride_slot <= 0 || v.stride_head <= 0 || v.stride_dim <= 0)
    return result::error(status::invalid_shape, "%s: strides must be positive", name);
  const detail::footprint f = detail::footprint_of(v);
  std::int64_t span = 0;
  FAIRKV_TRY(detail::nested_span(f.dims, f.rank, name, span));
  return detail::check_address_range(f, span, name);
}

// Host-side validation of one side's page tables: they are read before anything is written.
template <class T>
[[nodiscard]] result validate(const paged_side<T>& v, const char* name) noexcept {
  FAIRKV_TRY(validate_layout(v, name));
  if (v.indptr[0] != 0) return result::error(status::invalid_shape, "%s.indptr[0] must be 0", name);
  for (std::int64_t b = 0; b < v.batch; ++b) {
    if (v.indptr[b + 1] < v.indptr[b])
      return result::error(status::invalid_shape, "%s.indptr decreases at %lld", name, static_cast<long long>(b));
    const std::int64_t pages = v.indptr[b + 1] - v.indptr[b];
    if (pages > 0 && (v.last_page_len[b] < 1 || v.last_page_len[b] > v.page_size))
      return result::error(status::invalid_shape, "%s.last_page_len[%lld] = %d is outside [1, page_size %lld]",
                           name, static_cast<long long>(b), v.last_page_len[b], static_cast<long long>(v.page_size));
    // tokens_of() computes this unchecked (it runs in kernels); a page table listing a page many times could
    // still make it overflow for a huge page_size.
    std::int64_t tokens = 0;
    if (pages > 0 && (!detail::checked_mul(pages - 1, v.page_size, tokens) ||
                      !detail::checked_add(tokens, v.last_page_len[b], tokens)))
      return result::error(status::invalid_shape,
                           "%s: sequence %lld has %lld pages of page_size %lld, more tokens than a 64-bit count holds",
                           name, static_cast<long long>(b), static_cast<long long>(pages),
                           static_cast<long long>(v.page_size));
  }
  for (std::int64_t i = 0; i < v.indptr[v.batch]; ++i)
    if (v.indices[i] < 0 || v.indices[i] >= v.num_pages)
      return result::error(status::out_of_range, "%s.indices[%lld] = %d is outside [0, num_pages %lld)", name,
                           static_cast<long long>(i), v.indices[i], static_cast<long long>(v.num_pages));
  return {};
}

// Both pools without reading the page tables: each pool's layout (V's with its own strides where it has them) and
// K and V disjoint (exactly, so FlashInfer's interleaved [pages][2][...] pool passes; views/footprint.hpp).
template <class T>
[[nodiscard]] result validate_layout(const paged_kv_view<T>& v, const char* name) noexcept {
  if (v.v_data == nullptr) return result::error(status::null_pointer, "%s.v_data is null", name);
  if (v.k_data == nullptr) return result::error(status::null_pointer, "%s.k_data is null", name);
  FAIRKV_TRY(validate_layout(v.keys(), name));
  char pool[64];
  std::snprintf(pool, sizeof(pool), "%s.v_data", name);
  const detail::footprint k = detail::footprint_of(v.keys()), vf = detail::footprint_of(v.values());
  if (v.v_has_own_strides()) {
    if (v.v_strides[0] <= 0 || v.v_strides[1] <= 0 || v.v_strides[2] <= 0 || v.v_strides[3] <= 0)
      return result::error(status::invalid_shape,
                           "%s.v_strides: give all four (page, slot, head, dim) positive, or all zero for K's; got "
                           "%lld, %lld, %lld, %lld",
                           name, static_cast<long long>(v.v_strides[0]), static_cast<long long>(v.v_strides[1]),
                           static_cast<long long>(v.v_strides[2]), static_cast<long long>(v.v_strides[3]));
    char side[80];
    std::snprintf(side, sizeof(side), "%s (V's own strides)", name);
    FAIRKV_TRY(validate_layout(v.values(), side));
  } else {
    FAIRKV_TRY(detail::check_address_range(vf, k.elements(), pool));
  }
  char k_pool[64];
  std::snprintf(k_pool, sizeof(k_pool), "%s.k_data", name);
  return detail::check_disjoint(k, k_pool, vf, pool);
}

// Out-of-place compaction (compact_into) reads `from` and writes `to`. Either both views describe one pool (the same
// K and V memory, shape and strides: their page ids compare, and the backend checks no page is in both tables), or
// `to` must not overlap `from` anywhere: two pools' memory.
template <class T>
[[nodiscard]] bool same_pool(const paged_kv_view<const T>& from, const paged_kv_view<T>& to) noexcept {
  const auto same = [](const paged_side<const T>& a, const paged_side<T>& b) {
    return a.data == b.data && a.num_pages == b.num_pages && a.page_size == b.page_size &&
           a.stride_page == b.stride_page && a.stride_slot == b.stride_slot && a.stride_head == b.stride_head &&
           a.stride_dim == b.stride_dim;
  };
  return same(from.keys(), to.keys()) && same(from.values(), to.values());
}
template <class T>
[[nodiscard]] result check_pools_apart(const paged_kv_view<const T>& from, const paged_kv_view<T>& to) noexcept {
  using detail::check_disjoint, detail::footprint_of;
  FAIRKV_TRY(check_disjoint(footprint_of(from.keys()), "from.k_data", footprint_of(to.keys()), "to.k_data"));
  FAIRKV_TRY(check_disjoint(footprint_of(from.keys()), "from.k_data", footprint_of(to.values()), "to.v_data"));
  FAIRKV_TRY(check_disjoint(footprint_of(from.values()), "from.v_data", footprint_of(to.keys()), "to.k_data"));
  return check_disjoint(footprint_of(from.values()), "from.v_data", footprint_of(to.values()), "to.v_data");
}

template <class T>
[[nodiscard]] result validate(const paged_kv_view<T>& v, const char* name) noexcept {
  FAIRKV_TRY(validate_layout(v, name));
  FAIRKV_TRY(validate(v.keys(), name));
  const std::int64_t nnz = v.indptr[v.batch];
  // A page listed twice (or shared by two sequences, as prefix caching does) would make the in-place compaction
  // of one sequence overwrite another's tokens. Every paged compaction runs this and engines hold page tables of a
  // million pages, so not pairwise: one bit per pool page, O(nnz + num_pages / 64); or, where the pool is much
  // larger than the table (a view may claim a pool of 2^40 pages), the table's (page, position) pairs sorted,
  // O(nnz log nnz). Scratch: min(num_pages / 8, 8 nnz) bytes. Either way the first repeat is reported.
  std::int64_t repeat = -1;
  if ((v.num_pages + 63) / 64 <= nnz) {
    const auto words = static_cast<std::size_t>((v.num_pages + 63) / 64);
    std::vector<std::uint64_t> seen;
    try {
      seen.resize(words);
    } catch (...) {
      return result::error(status::out_of_memory, "%s: checking %lld pool pages for duplicates needs %lld bytes",
                           name, static_cast<long long>(v.num_pages), static_cast<long long>(words * 8));
    }
    for (std::int64_t k = 0; k < nnz && repeat < 0; ++k) {
      const auto page = static_cast<std::uint64_t>(v.indices[k]);  // in [0, num_pages): validate(keys) checked it
      const std::uint64_t bit = std::uint64_t{1} << (page % 64);
      if (seen[page / 64] & bit) repeat = k;
      seen[page / 64] |= bit;
    }
  } else if (nnz > 1) {
    const auto n = static_cast<std::size_t>(nnz);
    std::vector<std::uint64_t> keyed;
    try {
      keyed.resize(n);
    } catch (...) {
      return result::error(status::out_of_memory, "%s: checking %lld listed pages for duplicates needs %lld bytes",
                           name, static_cast<long long>(nnz), static_cast<long long>(nnz * 8));
    }
    // page in the high half, position in the low: sorted, a page's listings are adjacent and in position order.
    for (std::size_t k = 0; k < n; ++k)
      keyed[k] = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(v.indices[k])) << 32) | k;
    std::sort(keyed.begin(), keyed.end());
    for (std::size_t k = 1; k < n; ++k)
      if (keyed[k] >> 32 == keyed[k - 1] >> 32) {
        const auto pos = static_cast<std::int64_t>(keyed[k] & 0xffffffffu);  // a later listing of its page
        if (repeat < 0 || pos < repeat) repeat = pos;
      }
  }
  if (repeat < 0) return {};
  std::int64_t first = 0;
  while (v.indices[first] != v.indices[repeat]) ++first;
  return result::error(status::invalid_shape, "%s.indices lists page %d twice (positions %lld and %lld)", name,
                       v.indices[repeat], static_cast<long long>(first), static_cast<long long>(repeat));
}

}  // namespace fairkv
