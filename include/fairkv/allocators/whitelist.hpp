#pragma once

#include "fairkv/allocators/uniform.hpp"

namespace fairkv::allocators {

// Force-keep the caller's positions (shared by all heads); they consume the budget, the rest goes by score.
// More positions than the budget is an error (status::budget_exceeded), never a silent truncation.
using whitelist = basic_uniform<true>;
static_assert(SegmentAllocator<whitelist>);

}  // namespace fairkv::allocators
