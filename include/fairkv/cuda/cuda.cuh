// Umbrella header of the CUDA backend (needs nvcc, C++20): plan, planner, score, compact, compact_into,
// can_implement, from_cuda.
// See docs/cuda-backend.md for the design, the limits and the build flags.
#pragma once

#include "fairkv/cuda/compact.cuh"
#include "fairkv/cuda/compact_into.cuh"
#include "fairkv/cuda/error.cuh"
#include "fairkv/cuda/plan.cuh"
#include "fairkv/cuda/score.cuh"
