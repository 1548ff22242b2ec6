// The emulator's cub::BlockScan (1-D blocks, the exclusive sums fairkv uses): like CUB, its temp storage must
// not be reused before a __syncthreads; the aggregate goes to every thread.
#pragma once
#include "fairkv_emu.hpp"

namespace cub {

template <class T, int BLOCK_DIM_X, int ALGORITHM = 0, int BLOCK_DIM_Y = 1, int BLOCK_DIM_Z = 1>
class BlockScan {
  static_assert(BLOCK_DIM_Y == 1 && BLOCK_DIM_Z == 1, "fairkv_emu: only 1-D block scans are emulated");

 public:
  struct TempStorage {
    T in[BLOCK_DIM_X];
    T out[BLOCK_DIM_X];
    T total;
  };

  explicit BlockScan(TempStorage& storage) : s_(storage) {
    if (blockDim.x != static_cast<unsigned>(BLOCK_DIM_X) || blockDim.y != 1 || blockDim.z != 1)
      ::fairkv_emu::detail::fail("cub::BlockScan: the block is not BLOCK_DIM_X x 1 x 1 threads");
  }

  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    const unsigned i = threadIdx.x;
    s_.in[i] = input;
    __syncthreads();
    if (i == 0) {
      T acc{};
      for (int k = 0; k < BLOCK_DIM_X; ++k) {
        s_.out[k] = acc;
        acc += s_.in[k];
      }
      s_.total = acc;
    }
    __syncthreads();
    output = s_.out[i];
    block_aggregate = s_.total;
  }
  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }
  template <int ITEMS>
  void ExclusiveSum(T (&input)[ITEMS], T (&output)[ITEMS], T& block_aggregate) {
    T local{};
    for (int k = 0; k < ITEMS; ++k) local += input[k];
    T prefix;
    ExclusiveSum(local, prefix, block_aggregate);
    for (int k = 0; k < ITEMS; ++k) {
      const T v = input[k];  // input and output may be the same array
      output[k] = prefix;
      prefix += v;
    }
  }
  template <int ITEMS>
  void ExclusiveSum(T (&input)[ITEMS], T (&output)[ITEMS]) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
