// Must NOT compile: `paper_spans` makes the planner rewrite the segments the paper's way; it is reserved for
// fairkv::allocators::fair_paper, so a user allocator declaring it is refused instead of silently changing scoring.
#include <span>
#include "fairkv/fairkv.hpp"
struct my_paper {
  static constexpr bool uses_segments = true, uses_whitelist = true, segment_local = true, needs_own_allocation = false;
  static constexpr bool paper_spans = true;
  static constexpr const char* name = "my_paper";
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, my_paper> p;
