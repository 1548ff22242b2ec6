// The paged engine loop (engine.hpp) on the CPU backend: plan every request of the batch in one cpu::plan call over
// the engine's paged keys (request_batch), compact the pool in place.
#include "engine.hpp"
#include "fairkv/fairkv.hpp"

int main() {
  return paged_engine::run("cpu", [](paged_engine::engine& e, const std::vector<paged_engine::request>& reqs,
                                     std::vector<std::int32_t>& counts) -> fairkv::result {
    const paged_engine::request_lists lists(reqs);
    const fairkv::layer_inputs<fairkv::paged_side<const float>> in{e.view().as_const().keys()};
    fairkv::keep_plan plan;
    FAIRKV_TRY(fairkv::cpu::plan(paged_engine::policy{}, in, lists.batch(), plan));
    FAIRKV_TRY(fairkv::cpu::compact(plan.view(), e.view()));
    counts.assign(plan.view().counts, plan.view().counts + e.batch() * paged_engine::kv_heads);
    return {};
  });
}
