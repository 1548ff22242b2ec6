// Must NOT compile: a user struct with SnapKV's parameters and source is still not SnapKV; the backends would
// run SnapKV for it whatever it meant, so only fairkv::scorers::snapkv may declare window_attention.
#include <cstdint>
#include "fairkv/fairkv.hpp"
struct my_snapkv {
  static constexpr fairkv::score_source source = fairkv::score_source::window_attention;
  static constexpr const char* name = "my_snapkv";
  std::int32_t window = 8;
  std::int32_t kernel = 3;
};
fairkv::policy<my_snapkv, fairkv::selectors::per_head, fairkv::allocators::uniform> p;
