// Must NOT compile: a const keep_plan hands out a read-only view; writing a count through it is refused.
#include "fairkv/fairkv.hpp"
int main() {
  const fairkv::keep_plan plan;
  plan.view().counts[0] = 1;
  return 0;
}
