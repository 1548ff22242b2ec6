// Must NOT compile: an allocator needs `static constexpr const char* name` (the planner's messages name it), and
// the concept says so instead of the planner failing on A::name deep inside.
#include <span>
#include "fairkv/fairkv.hpp"
struct nameless {
  static constexpr bool uses_segments = true, uses_whitelist = false, segment_local = true, needs_own_allocation = false;
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, nameless> p;
