// Must NOT compile: an allocator's allocate() must return fairkv::result.
#include <span>
#include "fairkv/fairkv.hpp"
struct not_an_allocator {
  static constexpr bool uses_segments = true, uses_whitelist = false, segment_local = true, needs_own_allocation = false;
  static constexpr const char* name = "not_an_allocator";
  int allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const { return 0; }
};
fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, not_an_allocator> p;
