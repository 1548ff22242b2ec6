// A consumer of fairkv::core alone (no Eigen), as a CUDA-only engine is: the policies, views, keep plans and
// the host planning front end that the CUDA backend includes compile and run without the CPU backend.
#include <cstdio>
#include <vector>

#include <fairkv/allocators/fair.hpp>
#include <fairkv/detail/plan_front.hpp>
#include <fairkv/keep_plan.hpp>
#include <fairkv/policy.hpp>
#include <fairkv/scorers/knorm.hpp>
#include <fairkv/segments.hpp>
#include <fairkv/selectors/per_head.hpp>
#include <fairkv/views/kv_view.hpp>

int main() {
  using policy = fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head, fairkv::allocators::fair>;
  std::vector<float> k(10 * 4, 0.5f);
  const auto view = fairkv::make_contiguous_view(static_cast<const float*>(k.data()), 1, 1, 10, 4);
  const std::vector<fairkv::segment> segments{{6, 9}, {1, 3}};
  const fairkv::result shape = fairkv::validate(view, "keys");
  const fairkv::result segs = fairkv::validate_segments(segments, view.tokens);
  const fairkv::result overlap = fairkv::validate_segments(std::vector<fairkv::segment>{{0, 4}, {3, 5}}, 10);
  fairkv::keep_plan plan;
  plan.resize(1, 1, view.tokens);
  std::printf("consumer (core only): keys %s, segments %s, overlap: %s, budget %lld of 10\n", shape.message(),
              segs.message(), overlap.message(), static_cast<long long>(fairkv::keep_budget(10, 0.5)));
  const bool ok = shape.ok() && segs.ok() && overlap.code() == fairkv::status::overlapping_segments &&
                  fairkv::keep_budget(10, 0.5) == 5 && plan.capacity() == 10 &&
                  policy::selector_type::kind == fairkv::selection_kind::per_head;
  return ok ? 0 : 1;
}
