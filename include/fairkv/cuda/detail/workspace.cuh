// The CUDA backend's temp storage carver: the library's one carver (detail/workspace_carver.hpp) with 256-byte
// buffers, what cudaMalloc guarantees for the base and the widest vector access needs.
#pragma once

#include "fairkv/detail/workspace_carver.hpp"

namespace fairkv::cuda::detail {

using workspace_carver = fairkv::detail::workspace_carver<256>;

[[nodiscard]] inline void* align_base(void* p) noexcept { return workspace_carver::align_base(p); }

}  // namespace fairkv::cuda::detail
