// The emulator's cub::BlockReduce (1-D blocks): as in CUB the result is defined in thread 0 only, so every other
// thread gets garbage (NaN, or the type's lowest value) and a kernel that reads it elsewhere fails its parity.
#pragma once
#include <functional>
#include <limits>

#include "fairkv_emu.hpp"

namespace cub {

template <class T, int BLOCK_DIM_X, int ALGORITHM = 0, int BLOCK_DIM_Y = 1, int BLOCK_DIM_Z = 1>
class BlockReduce {
  static_assert(BLOCK_DIM_Y == 1 && BLOCK_DIM_Z == 1, "fairkv_emu: only 1-D block reductions are emulated");

 public:
  struct TempStorage {
    T v[BLOCK_DIM_X];
  };

  explicit BlockReduce(TempStorage& storage) : s_(storage) {
    if (blockDim.x != static_cast<unsigned>(BLOCK_DIM_X) || blockDim.y != 1 || blockDim.z != 1)
      ::fairkv_emu::detail::fail("cub::BlockReduce: the block is not BLOCK_DIM_X x 1 x 1 threads");
  }

  template <class Op>
  T Reduce(T input, Op op) {
    s_.v[threadIdx.x] = input;
    __syncthreads();
    if (threadIdx.x != 0) {
      if constexpr (std::numeric_limits<T>::has_quiet_NaN) return std::numeric_limits<T>::quiet_NaN();
      else return std::numeric_limits<T>::lowest();
    }
    T acc = s_.v[0];
    for (int k = 1; k < BLOCK_DIM_X; ++k) acc = op(acc, s_.v[k]);
    return acc;
  }
  T Sum(T input) { return Reduce(input, std::plus<T>{}); }

 private:
  TempStorage& s_;
};

}  // namespace cub
