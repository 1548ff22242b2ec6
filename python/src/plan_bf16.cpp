// plan_keys<bfloat16_t>: see plan_keys.hpp.
#include "plan_keys.hpp"

template fairkv::result fairkv::python::plan_keys<fairkv::bfloat16_t>(const plan_request&, keep_plan&) noexcept;
