// Must NOT compile: the attention sources are computed by the backends and reserved for the built-in scorers; a
// user struct claiming last_attention would silently get TOVA.
#include "fairkv/fairkv.hpp"
struct my_tova {
  static constexpr fairkv::score_source source = fairkv::score_source::last_attention;
  static constexpr const char* name = "my_tova";
};
fairkv::policy<my_tova, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
