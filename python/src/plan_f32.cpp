// plan_keys<float>: see plan_keys.hpp.
#include "plan_keys.hpp"

template fairkv::result fairkv::python::plan_keys<float>(const plan_request&, keep_plan&) noexcept;
