// Must NOT compile: the external source is filled by the backends from layer_inputs::scores and reserved for
// fairkv::scorers::external; a user struct claiming it would be handed the caller's scores and never be called.
#include "fairkv/fairkv.hpp"
struct my_external {
  static constexpr fairkv::score_source source = fairkv::score_source::external;
  static constexpr const char* name = "my_external";
  [[nodiscard]] float operator()(const fairkv::token_info&) const noexcept { return 1.f; }
};
fairkv::policy<my_external, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
