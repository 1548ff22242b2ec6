// Must NOT compile: compaction writes the cache, a view of const elements is refused.
#include "fairkv/fairkv.hpp"
int main() {
  const float k[8] = {};
  fairkv::keep_plan plan;
  auto v = fairkv::make_contiguous_view(k, 1, 1, 2, 4);
  return static_cast<int>(fairkv::cpu::compact(plan.view(), v, v).code());
}
