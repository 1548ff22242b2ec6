// A host allocation that fails inside the library is status::out_of_memory (not insufficient_workspace, which
// means the caller's own buffer is too small). The allocation is made to fail deterministically: this file
// replaces the program's operator new with one that throws std::bad_alloc above a per-thread size while a test
// asks it to, and otherwise behaves as the standard one.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "fairkv/allocators/fair.hpp"
#include "fairkv/cpu/plan.hpp"
#include "fairkv/scorers/knorm.hpp"
#include "fairkv/selectors/per_head.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/kv_view.hpp"

namespace {
thread_local std::size_t fail_above = 0;  // 0: every allocation is served
}  // namespace

// Every unaligned form is replaced, so that whatever pairs the standard library uses (std::stable_sort's temporary
// buffer allocates with the nothrow form and frees with the plain one) allocate and free through the same malloc;
// a partial replacement is an alloc-dealloc mismatch under AddressSanitizer. Aligned forms stay the runtime's.
void* operator new(std::size_t n) {
  if (fail_above != 0 && n > fail_above) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return ::operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

TEST_CASE("cpu::plan: a failed allocation of the plan or its scratch is status::out_of_memory") {
  using namespace fairkv;
  constexpr std::int64_t B = 1, H = 2, L = 4096, D = 8;
  std::vector<float> k(static_cast<std::size_t>(B * H * L * D));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i % 97) / 97.f;
  layer_inputs<kv_view<const float>> in;
  in.keys = make_contiguous_view(static_cast<const float*>(k.data()), B, H, L, D);
  const policy<scorers::knorm, selectors::per_head, allocators::fair> pol{};
  const std::vector<segment> segments{{0, 1000}, {1000, 3000}};
  std::size_t bytes = 0;
  REQUIRE(cpu::plan(nullptr, bytes, pol, in, segments, {}, 0.5, keep_plan_view{}).ok());
  REQUIRE(bytes > 4096);

  keep_plan plan;
  fail_above = bytes - 1;  // the scratch (and anything larger) cannot be allocated
  const result r = cpu::plan(pol, in, segments, {}, 0.5, plan);
  fail_above = 0;
  CHECK(r.code() == status::out_of_memory);
  CHECK(std::string(r.message()).find("out of host memory") != std::string::npos);
  CHECK(to_string(status::out_of_memory) == "out of memory");

  // Once memory is available again the same call plans.
  REQUIRE(cpu::plan(pol, in, segments, {}, 0.5, plan).ok());
  CHECK(plan.count(0, 0) == keep_budget(L, 0.5));
}
