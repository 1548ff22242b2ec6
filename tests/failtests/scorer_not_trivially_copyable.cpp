// Must NOT compile: scorers are passed by value into GPU kernels, so they must be trivially copyable.
#include "fairkv/fairkv.hpp"
struct owning {
  static constexpr fairkv::score_source source = fairkv::score_source::position;
  static constexpr const char* name = "owning";
  owning() = default;
  owning(const owning&) {}  // user-provided copy: not trivially copyable
  float operator()(fairkv::token_info i) const { return static_cast<float>(i.index); }
};
fairkv::policy<owning, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
