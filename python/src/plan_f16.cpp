// plan_keys<half_t>: see plan_keys.hpp.
#include "plan_keys.hpp"

template fairkv::result fairkv::python::plan_keys<fairkv::half_t>(const plan_request&, keep_plan&) noexcept;
