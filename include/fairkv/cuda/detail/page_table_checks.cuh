// The device's verdict on what the host cannot read: page tables and plans in device memory. Kernels record the
// first error they find (report); the backends read it back with read_compact_status / read_plan_status, and the
// kernels that would act on a bad input check it first and do nothing.
#pragma once

#include <cstdint>

#include "fairkv/status.hpp"
#include "fairkv/views/paged_kv_view.hpp"

namespace fairkv::cuda::detail {

enum verdict_code : int {
  verdict_ok = 0,
  compact_length_mismatch = 1,  // plan.lengths[b] != the view's tokens of sequence b (b, -, tokens)
  compact_bad_count = 2,        // counts outside [0, length]                                (b, h, count)
  compact_not_ascending = 3,    // indices not strictly ascending inside [0, length)         (b, h, j)
  table_bad_indptr = 4,         // paged: indptr[0] != 0 or decreasing                       (b, -, -)
  table_bad_page = 5,           // paged: a page id outside [0, num_pages)                   (i, page, -)
  table_duplicate_page = 6,     // paged: a page listed twice                                (i, j, page)
  table_bad_last_page_len = 7,  // paged: last_page_len outside [1, page_size]             (b, len, -)
  compact_page_in_source = 8,   // compact_into: a destination page is also a source page     (i, page, -)
  compact_no_room = 9,          // compact_into: a destination sequence shorter than its plan (b, room, longest)
  keys_length_mismatch = 10,    // plan over paged keys: the table's length of sequence b differs from the host's
                                // (b, host length, table length)
  view_bad_length = 11,         // compaction of a padded kv_view: lengths[b] outside [0, tokens] (b, length, tokens)
};

struct device_verdict {
  int code, a, b, c;  // first error found by the validation kernel (verdict_code + its arguments)
  int ticket;         // compaction: chunk tickets handed out so far
};

inline void __device__ report(device_verdict* st, int code, int a, int b, int c) {
  if (atomicCAS(&st->code, 0, code) == 0) {
    st->a = a;
    st->b = b;
    st->c = c;
  }
}

// Page tables (what paged_kv_view's host validate() checks, on the device). Grid-stride over the pages.
// owner [num_pages], zeroed: owner[page] = 1 + the first position that claimed the page, so a second claim finds
// the duplicate in one atomic (linear in the table, where comparing every pair was quadratic).
template <class T>
__global__ void validate_pages_kernel(paged_side<T> s, device_verdict* st, int* owner) {
  const std::int64_t tid = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  if (tid == 0 && s.indptr[0] != 0) report(st, table_bad_indptr, 0, -1, -1);
  for (std::int64_t b = tid; b < s.batch; b += stride) {
    if (s.indptr[b + 1] < s.indptr[b]) report(st, table_bad_indptr, static_cast<int>(b), -1, -1);
    if (s.indptr[b + 1] > s.indptr[b] && (s.last_page_len[b] < 1 || s.last_page_len[b] > s.page_size))
      report(st, table_bad_last_page_len, static_cast<int>(b), s.last_page_len[b], -1);
  }
  const std::int64_t nnz = s.indptr[s.batch];
  for (std::int64_t i = tid; i < nnz; i += stride) {
    const std::int32_t page = s.indices[i];
    if (page < 0 || page >= s.num_pages) {
      report(st, table_bad_page, static_cast<int>(i), page, -1);
      continue;
    }
    // A page shared by two positions would let one sequence's compaction overwrite another's tokens (owner null: a
    // table that is only read, where sharing is allowed).
    if (owner == nullptr) continue;
    const int first = atomicCAS(&owner[page], 0, static_cast<int>(i) + 1);
    if (first != 0) {
      const int j = first - 1, k = static_cast<int>(i);
      report(st, table_duplicate_page, j < k ? j : k, j < k ? k : j, page);
    }
  }
}

// The page table's verdicts in words, for the view the caller calls `name`; ok for every other code.
[[nodiscard]] inline result table_error(const device_verdict& st, const char* name) noexcept {
  switch (st.code) {
    case table_bad_indptr:
      return result::error(status::invalid_shape, "%s.indptr is not 0-based and non-decreasing (at %d)", name, st.a);
    case table_bad_page:
      return result::error(status::out_of_range, "%s.indices[%d] = %d is outside [0, num_pages)", name, st.a, st.b);
    case table_duplicate_page:
      return result::error(status::invalid_shape, "%s.indices lists page %d twice (positions %d and %d)", name, st.c,
                           st.a, st.b);
    case table_bad_last_page_len:
      return result::error(status::invalid_shape, "%s.last_page_len[%d] = %d is outside [1, page_size]", name, st.a,
                           st.b);
    default: return {};
  }
}

}  // namespace fairkv::cuda::detail
