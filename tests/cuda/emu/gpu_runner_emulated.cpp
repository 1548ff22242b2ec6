// The parity suite's GPU side, compiled by the host compiler against the CUDA emulator (fairkv_emu.hpp): the
// same source as the real one, so the emulated run exercises exactly the kernels and launches nvcc builds.
#include "../gpu_runner.cu"
