// Must NOT compile: a keys scorer is called with key_row<T, C> for every element type T and both strides C (the
// backends pick the contiguous row where the layout allows); one that takes key_row<float> only would fail inside
// the planner for half caches or contiguous rows, so the concept refuses it.
#include "fairkv/fairkv.hpp"
struct float_rows_only {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "float_rows_only";
  float operator()(const fairkv::key_row<float>& k, fairkv::token_info) const { return k[0]; }
};
fairkv::policy<float_rows_only, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
