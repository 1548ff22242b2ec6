// Must NOT compile: selectors are passed by value into kernels, so they must be trivially copyable.
#include "fairkv/fairkv.hpp"
struct owning {
  static constexpr fairkv::selection_kind kind = fairkv::selection_kind::per_head;
  static constexpr const char* name = "owning";
  owning() = default;
  owning(const owning&) {}  // user-provided copy: not trivially copyable
};
fairkv::policy<fairkv::scorers::knorm, owning, fairkv::allocators::uniform> p;
