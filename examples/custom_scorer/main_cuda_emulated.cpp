// main_cuda.cu compiled by the host compiler against fairkv's CUDA emulator (tests/cuda/emu): the same source, so
// the test suite runs the custom scorer through the CUDA backend's kernels on machines without a GPU. The
// emulator is not a GPU; nvcc's own requirement (FAIRKV_HOST_DEVICE) is checked by the nvcc build of main_cuda.cu.
#include "main_cuda.cu"
