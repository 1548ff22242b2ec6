// The memory a strided view may touch, checked without trusting its fields: the views' validate() functions
// use these to reject aliasing strides and extents x strides that overflow or leave the address space, and
// compaction uses them to reject K and V that share memory. Views come from engines (and through them from
// files and users), so every product and sum here is overflow-checked: an overflowed span would let a view
// that reaches far outside its buffer pass validation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "fairkv/detail/checked_math.hpp"
#include "fairkv/status.hpp"

namespace fairkv::detail {

// One dimension of a view: `extent` elements, `stride` elements apart; the names are the view's field names,
// so a message can say which field is at fault.
struct view_dim {
  std::int64_t extent = 1;
  std::int64_t stride = 0;
  const char* extent_name = "";
  const char* stride_name = "";
};

inline constexpr int max_view_rank = 4;

// "[heads 3, tokens 5, head_dim 4]": the extents, for messages.
inline void format_extents(char* out, std::size_t size, const view_dim* dims, int n) noexcept {
  std::size_t used = 0;
  for (int i = 0; i < n && used < size; ++i) {
    const int w = std::snprintf(out + used, size - used, "%s%s %lld%s", i == 0 ? "[" : "", dims[i].extent_name,
                                static_cast<long long>(dims[i].extent), i + 1 == n ? "]" : ", ");
    if (w < 0) break;
    used += static_cast<std::size_t>(w);
  }
}

// Checks that no two elements of the dims alias and that the largest offset fits in int64; `span` = 1 + the
// largest element offset. Dims of extent 0 or 1 never step, so their strides do not matter (engines leave them
// 0). The test is the usual sufficient one: sorted by stride, each stride steps over the whole span of the
// smaller ones. It rejects some exotic non-aliasing layouts (strides 2 and 3 interleaving), never an aliasing one.
[[nodiscard]] inline result nested_span(const view_dim* in, int n, const char* name, std::int64_t& span) noexcept {
  view_dim d[max_view_rank];
  for (int i = 0; i < n; ++i) d[i] = in[i];
  // Insertion sort by stride, ties by extent (the longer of two equal strides comes last and is the one reported).
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && (d[j].stride < d[j - 1].stride ||
                              (d[j].stride == d[j - 1].stride && d[j].extent < d[j - 1].extent)); --j) {
      const view_dim t = d[j];
      d[j] = d[j - 1];
      d[j - 1] = t;
    }
  span = 1;
  for (int i = 0; i < n; ++i) {
    const view_dim& x = d[i];
    if (x.extent <= 1) continue;
    if (x.stride < span)
      return result::error(status::invalid_shape,
                           "%s has overlapping strides: %s = %lld is less than the %lld elements spanned by the "
                           "smaller strides (elements alias each other)",
                           name, x.stride_name, static_cast<long long>(x.stride), static_cast<long long>(span));
    std::int64_t step = 0;
    if (!checked_mul(x.stride, x.extent - 1, step) || !checked_add(step, span, span)) {
      char shape[128] = {};
      format_extents(shape, sizeof(shape), in, n);
      return result::error(status::invalid_shape,
                           "%s.%s = %lld times (%s - 1) = %lld overflows a 64-bit element offset; extents %s", name,
                           x.stride_name, static_cast<long long>(x.stride), x.extent_name,
                           static_cast<long long>(x.extent - 1), shape);
    }
  }
  return {};
}

// The bytes a validated view may touch: element (i_0, ..., i_n-1) starts at base + elem_bytes * sum(i_k s_k).
struct footprint {
  std::uintptr_t base = 0;
  std::int64_t elem_bytes = 0;
  int rank = 0;
  view_dim dims[max_view_rank] = {};

  [[nodiscard]] bool empty() const noexcept {
    for (int i = 0; i < rank; ++i)
      if (dims[i].extent <= 0) return true;
    return false;
  }
  // 1 + the largest element offset, and the bytes from base to the end of that element. Only for validated
  // views (they cannot overflow then).
  [[nodiscard]] std::int64_t elements() const noexcept {
    std::int64_t last = 0;
    for (int i = 0; i < rank; ++i)
      if (dims[i].extent > 1) last += dims[i].stride * (dims[i].extent - 1);
    return last + 1;
  }
  [[nodiscard]] std::int64_t bytes() const noexcept { return elements() * elem_bytes; }
};

// Checks that `span` elements from the footprint's base are addressable: the byte count fits in ptrdiff_t (so
// data + offset is defined) and does not wrap around the address space.
[[nodiscard]] inline result check_address_range(const footprint& f, std::int64_t span, const char* name) noexcept {
  std::int64_t bytes = 0;
  if (checked_mul(span, f.elem_bytes, bytes) && bytes <= PTRDIFF_MAX &&
      UINTPTR_MAX - f.base >= static_cast<std::uintptr_t>(bytes))
    return {};
  // Name the dimension that contributes most: that is the field an engine most likely got wrong.
  int worst = 0;
  long double worst_size = -1;
  for (int i = 0; i < f.rank; ++i) {
    const long double s = static_cast<long double>(f.dims[i].stride) * static_cast<long double>(f.dims[i].extent - 1);
    if (s > worst_size) {
      worst_size = s;
      worst = i;
    }
  }
  char shape[128] = {};
  format_extents(shape, sizeof(shape), f.dims, f.rank);
  return result::error(status::invalid_shape,
                       "%s spans %lld elements of %lld bytes, beyond the address space (largest term %s = %lld "
                       "times (%s - 1)); extents %s",
                       name, static_cast<long long>(span), static_cast<long long>(f.elem_bytes),
                       f.dims[worst].stride_name, static_cast<long long>(f.dims[worst].stride),
                       f.dims[worst].extent_name, shape);
}

// Depth-first search for integers c_k in [lo_c_k, hi_c_k] with sum(c_k * stride_k) in [lo, hi], dimensions
// sorted by decreasing stride; each level only tries the c_k from which the smaller dimensions can still reach
// the interval, so nested (validated) views take a handful of nodes.
struct lattice_search {
  struct dim {
    std::int64_t stride = 0, lo_c = 0, hi_c = 0;
  };
  dim d[max_view_rank] = {};
  int n = 0;
  std::int64_t reach_pos[max_view_rank + 1] = {};  // the largest positive sum dims k.. can add
  std::int64_t reach_neg[max_view_rank + 1] = {};  // the largest negative sum (as a positive number)
  int budget = 4096;                               // nodes; a validated pair needs a few per dimension

  // false when the bounds themselves overflow (then nothing can be decided).
  [[nodiscard]] bool prepare() noexcept {
    for (int i = 1; i < n; ++i)
      for (int j = i; j > 0 && d[j].stride > d[j - 1].stride; --j) {
        const dim t = d[j];
        d[j] = d[j - 1];
        d[j - 1] = t;
      }
    for (int k = n - 1; k >= 0; --k) {
      std::int64_t pos = 0, neg = 0;
      if (!checked_mul(d[k].stride, d[k].hi_c, pos) || !checked_add(pos, reach_pos[k + 1], reach_pos[k]) ||
          !checked_mul(d[k].stride, -d[k].lo_c, neg) || !checked_add(neg, reach_neg[k + 1], reach_neg[k]))
        return false;
    }
    return true;
  }
  // 1: found, 0: none exists, -1: gave up (overflow or budget).
  [[nodiscard]] int find(int k, std::int64_t lo, std::int64_t hi) noexcept {
    if (--budget < 0) return -1;
    if (k >= n || k >= max_view_rank) return lo <= 0 && 0 <= hi ? 1 : 0;
    const std::int64_t s = d[k].stride;
    // c * s must lie in [lo - reach_pos[k + 1], hi + reach_neg[k + 1]].
    std::int64_t lo_t = 0, hi_t = 0;
    if (!checked_add(lo, -reach_pos[k + 1], lo_t) || !checked_add(hi, reach_neg[k + 1], hi_t)) return -1;
    // ceil(lo_t / s) and floor(hi_t / s); `/` truncates towards zero.
    const std::int64_t c_lo = std::max(d[k].lo_c, lo_t / s + (lo_t % s != 0 && lo_t > 0 ? 1 : 0));
    const std::int64_t c_hi = std::min(d[k].hi_c, hi_t / s - (hi_t % s != 0 && hi_t < 0 ? 1 : 0));
    for (std::int64_t c = c_lo; c <= c_hi; ++c) {
      std::int64_t cs = 0, lo_c = 0, hi_c = 0;
      if (!checked_mul(c, s, cs) || !checked_add(lo, -cs, lo_c) || !checked_add(hi, -cs, hi_c)) return -1;
      const int r = find(k + 1, lo_c, hi_c);
      if (r != 0) return r;
    }
    return 0;
  }
};

// Whether some element of `a` may share a byte with some element of `b` (both validated). Views whose byte
// ranges are disjoint never do. When the ranges intersect and both views have the same element size and the
// same stride in every dimension that steps in both (interleaved K and V, e.g. [tokens][2][heads][head_dim] or
// FlashInfer's [pages][2][page_size][heads][head_dim]), the answer is exact: elements meet iff some index
// difference c_k in (-extent_b, extent_a) puts sum(c_k * stride_k) * elem_bytes within elem_bytes - 1 of the
// distance between the bases. Any other intersecting pair (different strides, or a search that gives up) is
// reported as overlapping: a conservative answer, documented in docs/integration.md.
[[nodiscard]] inline bool may_overlap(const footprint& a, const footprint& b) noexcept {
  if (a.empty() || b.empty()) return false;
  const std::int64_t a_bytes = a.bytes(), b_bytes = b.bytes();
  if (a.base >= b.base + static_cast<std::uintptr_t>(b_bytes) ||
      b.base >= a.base + static_cast<std::uintptr_t>(a_bytes))
    return false;
  if (a.elem_bytes != b.elem_bytes || a.rank != b.rank) return true;
  lattice_search s;
  for (int i = 0; i < a.rank; ++i) {
    const view_dim &x = a.dims[i], &y = b.dims[i];
    if (x.extent <= 1 && y.extent <= 1) continue;  // steps in neither view: its stride is irrelevant
    if (x.extent > 1 && y.extent > 1 && x.stride != y.stride) return true;
    std::int64_t stride = 0;
    if (!checked_mul(x.extent > 1 ? x.stride : y.stride, a.elem_bytes, stride) || stride <= 0) return true;
    s.d[s.n++] = {stride, -(y.extent - 1), x.extent - 1};
  }
  if (!s.prepare()) return true;
  // |b.base - a.base| is below the larger span (the ranges intersect), so it fits in int64.
  const std::int64_t delta = b.base >= a.base ? static_cast<std::int64_t>(b.base - a.base)
                                              : -static_cast<std::int64_t>(a.base - b.base);
  std::int64_t lo = 0, hi = 0;
  if (!checked_add(delta, -(a.elem_bytes - 1), lo) || !checked_add(delta, a.elem_bytes - 1, hi)) return true;
  return s.find(0, lo, hi) != 0;
}

// The compaction-side check: `a` and `b` (K and V) must not share memory, or the in-place moves of one would
// overwrite tokens of the other before they are read (and shared elements would move twice).
[[nodiscard]] inline result check_disjoint(const footprint& a, const char* a_name, const footprint& b,
                                           const char* b_name) noexcept {
  if (!may_overlap(a, b)) return {};
  return result::error(status::invalid_argument,
                       "%s and %s overlap in memory (%lld bytes at %p and %lld bytes at %p): compaction would move "
                       "shared elements twice; give them disjoint memory or interleave them with equal strides",
                       a_name, b_name, static_cast<long long>(a.bytes()), reinterpret_cast<const void*>(a.base),
                       static_cast<long long>(b.bytes()), reinterpret_cast<const void*>(b.base));
}

}  // namespace fairkv::detail
