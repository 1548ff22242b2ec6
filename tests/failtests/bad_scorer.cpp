// Must NOT compile: the scorer has no `source`, so fairkv::policy rejects it with a readable message.
#include "fairkv/fairkv.hpp"
struct not_a_scorer {
  float operator()(fairkv::token_info) const { return 0.f; }
};
fairkv::policy<not_a_scorer, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
