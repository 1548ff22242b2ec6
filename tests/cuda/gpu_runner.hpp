// The GPU half of the parity suite, compiled by nvcc (gpu_runner.cu) and called from the doctest cases, which are
// compiled by the host compiler together with the CPU oracle (Eigen never goes through nvcc).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "fairkv/keep_plan.hpp"
#include "fairkv/status.hpp"
#include "parity_case.hpp"

namespace fairkv_test {

struct device_info {
  bool available = false;
  std::string description;  // the device's name, or why there is none
};
[[nodiscard]] const device_info& probe_device();  // cached: cudaGetDeviceCount + cudaGetDeviceProperties

// Host-only entry points: they never touch the device (dummy device pointers), so they run without a GPU.
[[nodiscard]] fairkv::result gpu_can_implement(const host_case& c);
[[nodiscard]] fairkv::result gpu_size_query(const host_case& c, std::size_t& bytes);
// cuda::plan's size query with the allocator only the CPU implements: allocators::debias.
[[nodiscard]] fairkv::result gpu_plan_cpu_only(const host_case& c);
[[nodiscard]] int cuda_max_segments();                            // fairkv::cuda::max_segments
// cuda::planner<...>::can_implement of the case's kv_view (no lengths on it) given host `lengths` (host only).
[[nodiscard]] fairkv::result gpu_plan_with_lengths(const host_case& c, const std::vector<std::int32_t>& lengths);
// cuda::planner<...>::can_implement on the case (the handle's own entry point; host only).
[[nodiscard]] fairkv::result gpu_planner_can_implement(const host_case& c);

// Device entry points: upload, run on a stream (optionally captured into a CUDA graph and replayed), download.
[[nodiscard]] fairkv::result gpu_plan(const host_case& c, fairkv::keep_plan& out, bool graph = false);
// The case's per-request lists (host_case::requests) in one cuda::plan call; handle: through a planner,
// initialize() on the stream and run() twice.
[[nodiscard]] fairkv::result gpu_plan_requests(const host_case& c, fairkv::keep_plan& out, bool handle = false);
// cuda::can_implement with the case's per-request lists (host only).
[[nodiscard]] fairkv::result gpu_can_implement_requests(const host_case& c);
// cuda::plan over paged keys: the case's policy, lists (one, or per request) and scorer inputs, the keys read
// through `pages`' pools and tables (its K pool holds the keys). `lengths` is the host copy handed to the planner
// (normally each sequence's length in the table), `window` the query / attention rows given. `verdict`:
// read_plan_status afterwards.
[[nodiscard]] fairkv::result gpu_plan_paged(const host_case& c, const paged_case& pages,
                                            const std::vector<std::int32_t>& lengths, std::int64_t window,
                                            fairkv::keep_plan& out, fairkv::result& verdict);
// cuda::plan over the case's own K as a padded kv_view: `device_lengths` are the view's lengths (uploaded),
// `lengths` the host copy handed to the planner; otherwise as gpu_plan_paged.
[[nodiscard]] fairkv::result gpu_plan_padded(const host_case& c, const std::vector<std::int32_t>& device_lengths,
                                             const std::vector<std::int32_t>& lengths, std::int64_t window,
                                             fairkv::keep_plan& out, fairkv::result& verdict);
// cuda::planner as a handle: initialize() once, then run() twice on one stream (the output is overwritten with
// garbage in between), each plan downloaded.
[[nodiscard]] fairkv::result gpu_plan_handle(const host_case& c, fairkv::keep_plan& first, fairkv::keep_plan& second);
// cuda::score of the case's scorer on its inputs: scores[(b * heads + h) * tokens + t].
[[nodiscard]] fairkv::result gpu_score(const host_case& c, std::vector<float>& scores);
// Compacts the case's K and V (k and v: the case's bytes in, the compacted bytes out) with `plan`; `lengths`: as
// a padded batch whose device lengths (both views') are these. Returns read_compact_status.
[[nodiscard]] fairkv::result gpu_compact(const host_case& c, const fairkv::keep_plan& plan,
                                         std::vector<unsigned char>& k, std::vector<unsigned char>& v,
                                         const std::vector<std::int32_t>* lengths = nullptr);
[[nodiscard]] fairkv::result gpu_compact_paged(const paged_case& c, const fairkv::keep_plan& plan,
                                               std::vector<unsigned char>& k_pool,
                                               std::vector<unsigned char>& v_pool);
// cuda::compact_into within the case's pools: read through c's tables (which may share pages), written through
// to's (indptr, indices, last_page_len of a case over the same pools).
[[nodiscard]] fairkv::result gpu_compact_into(const paged_case& c, const paged_case& to, const fairkv::keep_plan& plan,
                                              std::vector<unsigned char>& k_pool,
                                              std::vector<unsigned char>& v_pool);

}  // namespace fairkv_test
