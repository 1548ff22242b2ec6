// main_cuda.cu compiled by the host compiler against fairkv's CUDA emulator (tests/cuda/emu): the paged engine
// loop through the CUDA backend's kernels on machines without a GPU.
#include "main_cuda.cu"
