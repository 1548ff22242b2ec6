#include <cstdio>
#include <vector>

#include <fairkv/fairkv.hpp>

int main() {
  std::vector<float> k(4 * 3, 1.f);
  for (int t = 0; t < 4; ++t) k[3 * t] = static_cast<float>(t);
  fairkv::keep_plan plan;
  const auto r = fairkv::cpu::plan(fairkv::policy<fairkv::scorers::knorm, fairkv::selectors::per_head,
                                                  fairkv::allocators::uniform>{},
                                   fairkv::keys_only(fairkv::make_contiguous_view(k.data(), 1, 1, 4, 3)), {}, {}, 0.5,
                                   plan);
  std::printf("consumer: %s, kept %d tokens\n", r.message(), r ? plan.count(0, 0) : -1);
  return r && plan.kept(0, 0) == std::vector<int>{0, 1} ? 0 : 1;
}
