// Must NOT compile: the allocator's flags are branched on with if constexpr, so each must be a constant bool; a
// plain static member is refused by the concept.
#include <span>
#include "fairkv/fairkv.hpp"
struct runtime_flag {
  static inline bool uses_segments = true;  // not constexpr
  static constexpr bool uses_whitelist = false, segment_local = true, needs_own_allocation = false;
  static constexpr const char* name = "runtime_flag";
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, runtime_flag> p;
