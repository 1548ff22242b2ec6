// Positive control for the failtests: the same command line compiles valid policies, built-in and user-written
// (a keys scorer generic over the row type, an allocator with its own protection), so a failtest cannot pass by a
// broken command or by a concept that refuses everything.
#include <span>
#include "fairkv/fairkv.hpp"
fairkv::policy<fairkv::scorers::snapkv<16>, fairkv::selectors::per_head, fairkv::allocators::fair_with_whitelist> p;

struct first_element {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "first_element";
  template <class Row>
  FAIRKV_HOST_DEVICE float operator()(const Row& k, const fairkv::token_info&) const noexcept {
    return k[0];
  }
};
struct protected_uniform {
  static constexpr bool uses_segments = false, uses_whitelist = false, segment_local = false, needs_own_allocation = false;
  static constexpr const char* name = "protected_uniform";
  fairkv::allocators::protection protect{};
  fairkv::result allocate(const fairkv::allocation_context&, std::span<std::int64_t>) const noexcept { return {}; }
};
fairkv::policy<first_element, fairkv::selectors::head_adaptive, protected_uniform> q;
int main() { return 0; }
