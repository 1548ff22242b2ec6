// Must NOT compile: selection kinds are a closed set implemented by each backend; a user struct claiming
// per_head would silently run the built-in per-head top-k.
#include "fairkv/fairkv.hpp"
struct my_selector {
  static constexpr fairkv::selection_kind kind = fairkv::selection_kind::per_head;
  static constexpr const char* name = "my_selector";
};
fairkv::policy<fairkv::scorers::knorm, my_selector, fairkv::allocators::uniform> p;
