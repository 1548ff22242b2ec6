// Portability macros shared by the host-only core and the CUDA backend.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FAIRKV_HOST_DEVICE __host__ __device__
#else
#define FAIRKV_HOST_DEVICE
#endif

namespace fairkv {

// Lets an unspecialised template fail with a message that names the offending type (CUTLASS style).
template <class...>
inline constexpr bool dependent_false = false;

}  // namespace fairkv
