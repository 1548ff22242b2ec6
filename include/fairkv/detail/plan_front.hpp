// The host-side front end that every planner runs before it scores and selects (cpu/plan.hpp, cuda/plan.cuh):
//   validate the request (detail/validate.hpp) -> size and check the workspace and the output plan (checks.hpp)
//   -> per sequence: groups and runs (groups.hpp) -> forced tokens, whitelist then protection (budgets.hpp)
//   -> attention-region geometry (attention_geometry.hpp) -> budgets per (head, group), checked (budgets.hpp).
// One implementation, so the backends agree on every group, budget, status and message; a backend adds only its
// own storage (a workspace on the CPU, kernel parameters on CUDA) and its own limits.
#pragma once

#include "fairkv/detail/plan_front/attention_geometry.hpp"
#include "fairkv/detail/plan_front/budgets.hpp"
#include "fairkv/detail/plan_front/checks.hpp"
#include "fairkv/detail/plan_front/groups.hpp"
#include "fairkv/detail/search.hpp"
#include "fairkv/detail/validate.hpp"
#include "fairkv/detail/workspace_carver.hpp"
