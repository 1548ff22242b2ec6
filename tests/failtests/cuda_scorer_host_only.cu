// Must NOT compile with nvcc: the CUDA backend calls a keys scorer's operator() inside its scoring kernel, so the
// operator must be FAIRKV_HOST_DEVICE; a host-only one is refused (the CPU backend would accept it). This is the
// rule examples/custom_scorer and the README state.
#include <cstddef>
#include <cstdint>

#include "fairkv/allocators/uniform.hpp"
#include "fairkv/cuda/cuda.cuh"
#include "fairkv/policy.hpp"
#include "fairkv/selectors/per_head.hpp"

struct host_only {
  static constexpr fairkv::score_source source = fairkv::score_source::keys;
  static constexpr const char* name = "host_only";
  template <class Row>
  float operator()(const Row& k, const fairkv::token_info&) const noexcept {  // no FAIRKV_HOST_DEVICE
    return k[0];
  }
};
static_assert(fairkv::Scorer<host_only>);  // the concept cannot see execution spaces; nvcc does

fairkv::result plan_it(void* temp, std::size_t& bytes, fairkv::kv_view<const float> keys, fairkv::keep_plan_view out) {
  using P = fairkv::policy<host_only, fairkv::selectors::per_head, fairkv::allocators::uniform>;
  return fairkv::cuda::plan(temp, bytes, P{}, fairkv::keys_only(keys), {}, {}, 0.5, out);
}
