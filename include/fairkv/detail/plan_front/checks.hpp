// The request checks every planner makes after validation and sizing (detail/validate.hpp does the rest): the
// caller's workspace and the output plan, with one set of messages for every backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fairkv/keep_plan.hpp"
#include "fairkv/status.hpp"

namespace fairkv::detail {

// `name` is the backend's spelling of the size argument (workspace_bytes, temp_storage_bytes).
[[nodiscard]] inline result check_workspace(const char* name, std::size_t given, std::size_t needed) noexcept {
  if (given < needed)
    return result::error(status::insufficient_workspace, "%s = %zu but the plan needs %zu", name, given, needed);
  return {};
}

// The plan must have room for every (sequence, head) row of the longest sequence.
[[nodiscard]] inline result check_output_plan(const keep_plan_view& out, std::int64_t batch, std::int64_t heads,
                                              std::int64_t max_tokens) noexcept {
  if (out.indices == nullptr || out.counts == nullptr || out.lengths == nullptr)
    return result::error(status::null_pointer, "the output plan's indices, counts and lengths must be non-null");
  if (out.batch != batch || out.heads != heads || out.capacity < max_tokens)
    return result::error(status::invalid_shape,
                         "the output plan is [batch %lld, heads %lld, capacity %lld] but the keys need "
                         "[%lld, %lld, >= %lld]",
                         static_cast<long long>(out.batch), static_cast<long long>(out.heads),
                         static_cast<long long>(out.capacity), static_cast<long long>(batch),
                         static_cast<long long>(heads), static_cast<long long>(max_tokens));
  return {};
}

}  // namespace fairkv::detail
