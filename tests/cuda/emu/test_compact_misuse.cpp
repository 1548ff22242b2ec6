// fairkv::cuda::compact's host-side checks (issue 10): hostile strides and K and V sharing memory are refused
// before any launch, with the CPU oracle's status and message. They run before anything touches the device, so
// the emulated build tests them with plain host memory (suite cuda_host); nothing may be written.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fairkv/cpu/compact.hpp"
#include "fairkv/cuda/compact.cuh"

using namespace fairkv;

namespace {

// One sequence of `length` tokens per head, keeping the odd ones.
keep_plan odd_tokens(std::int64_t heads, std::int64_t length) {
  keep_plan p;
  p.resize(1, heads, length);
  const keep_plan_view v = p.view();
  v.lengths[0] = static_cast<std::int32_t>(length);
  for (std::int64_t h = 0; h < heads; ++h) {
    std::int32_t n = 0;
    for (std::int32_t t = 1; t < length; t += 2) v.row(0, h)[n++] = t;
    v.counts[h] = n;
  }
  return p;
}

void same_refusal(const result& gpu, const result& cpu, status code, const char* needle) {
  INFO("cuda: " << std::string(gpu.message()));
  INFO("cpu:  " << std::string(cpu.message()));
  CHECK(gpu.code() == code);
  CHECK(cpu.code() == code);
  CHECK(std::string(gpu.message()) == std::string(cpu.message()));
  CHECK(std::string(gpu.message()).find(needle) != std::string::npos);
}

}  // namespace

TEST_SUITE("cuda_host") {
  TEST_CASE("cuda host checks: compact refuses overlapping K and V and hostile strides as the CPU does") {
    const std::int64_t H = 2, L = 8, D = 4;
    std::vector<float> buf(static_cast<std::size_t>(2 * H * L * D));
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
    const auto before = buf;
    const keep_plan plan = odd_tokens(H, L);
    const auto kv = make_contiguous_view(buf.data(), 1, H, L, D);
    std::size_t bytes = 0;

    // Dense: the same view, V one token into K, and a stride whose span overflows.
    for (const kv_view<float>& values : {kv, make_contiguous_view(buf.data() + D, 1, H, L, D)}) {
      same_refusal(fairkv::cuda::compact(nullptr, bytes, plan.view(), kv, values),
                   cpu::compact(plan.view(), kv, values), status::invalid_argument, "keys and values overlap");
    }
    kv_view<float> hostile = make_contiguous_view(buf.data() + H * L * D, 1, H, L, D);
    hostile.stride_head = INT64_MAX / 2;
    same_refusal(fairkv::cuda::compact(nullptr, bytes, plan.view(), kv, hostile),
                 cpu::compact(plan.view(), kv, hostile), status::invalid_shape, "values");

    // Paged: the same pool for K and V, overlapping pages, a page_size whose pool overflows.
    const std::vector<std::int32_t> indptr{0, 4}, indices{3, 0, 2, 1}, last{2};
    const keep_plan paged_plan = odd_tokens(H, L);
    auto same_pool = make_paged_view(page_layout::nhd, buf.data(), buf.data(), 4, 2, H, D, 1, indptr.data(),
                                     indices.data(), last.data());
    same_refusal(fairkv::cuda::compact(nullptr, bytes, paged_plan.view(), same_pool),
                 cpu::compact(paged_plan.view(), same_pool), status::invalid_argument,
                 "view.k_data and view.v_data overlap");
    auto aliasing = make_paged_view(page_layout::hnd, buf.data(), buf.data() + 64, 4, 2, H, D, 1, indptr.data(),
                                    indices.data(), last.data());
    aliasing.stride_page = 8;
    same_refusal(fairkv::cuda::compact(nullptr, bytes, paged_plan.view(), aliasing),
                 cpu::compact(paged_plan.view(), aliasing), status::invalid_shape, "stride_page");
    auto huge_page = make_paged_view(page_layout::nhd, buf.data(), buf.data() + 64, 4, INT64_C(1) << 62, H, D, 1,
                                     indptr.data(), indices.data(), last.data());
    same_refusal(fairkv::cuda::compact(nullptr, bytes, paged_plan.view(), huge_page),
                 cpu::compact(paged_plan.view(), huge_page), status::invalid_shape, "page_size");
    CHECK(std::memcmp(buf.data(), before.data(), buf.size() * sizeof(float)) == 0);

    // Interleaved K and V with equal strides ([tokens][2][heads][head_dim]) pass the host checks: the size query
    // answers.
    const kv_view<float> k_rows{buf.data(), 1, H, L, D, 0, D, 2 * H * D, 1};
    const kv_view<float> v_rows{buf.data() + H * D, 1, H, L, D, 0, D, 2 * H * D, 1};
    bytes = 0;
    const result sized = fairkv::cuda::compact(nullptr, bytes, plan.view(), k_rows, v_rows);
    INFO(std::string(sized.message()));
    CHECK(sized.ok());
    CHECK(bytes > 0);
  }
}
