// Must NOT compile: every scorer needs `static constexpr const char* name`.
#include "fairkv/fairkv.hpp"
struct nameless {
  static constexpr fairkv::score_source source = fairkv::score_source::position;
  float operator()(fairkv::token_info i) const { return static_cast<float>(i.index); }
};
fairkv::policy<nameless, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
