// Must NOT compile: a member named `protect` is the allocator's protection (sinks, boundaries); one of another
// type would be ignored silently, so the concept refuses it.
#include <span>
#include "fairkv/fairkv.hpp"
struct sinks_as_int {
  static constexpr bool uses_segments = true, uses_whitelist = true, segment_local = true, needs_own_allocation = false;
  static constexpr const char* name = "sinks_as_int";
  int protect = 4;
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, sinks_as_int> p;
