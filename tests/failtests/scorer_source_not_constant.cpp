// Must NOT compile: the planners branch on `source` with if constexpr, so it must be a constant expression.
#include "fairkv/fairkv.hpp"
struct runtime_source {
  static inline fairkv::score_source source = fairkv::score_source::position;  // not constexpr
  static constexpr const char* name = "runtime_source";
  float operator()(fairkv::token_info i) const { return static_cast<float>(i.index); }
};
fairkv::policy<runtime_source, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
