// Must NOT compile: allocators are passed by value into kernels, so they must be trivially copyable.
#include <span>
#include "fairkv/fairkv.hpp"
struct owning {
  static constexpr bool uses_segments = true, uses_whitelist = false, segment_local = true, needs_own_allocation = false;
  static constexpr const char* name = "owning";
  owning() = default;
  owning(const owning&) {}  // user-provided copy: not trivially copyable
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, owning> p;
