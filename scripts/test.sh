#!/usr/bin/env bash
# The project's test command: set up, configure, build everything (CUDA too where nvcc exists: GPU tests then
# skip visibly without a device), and run every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda=ON
  export PATH="/usr/local/cuda/bin:$PATH"
fi
BUILD=${FAIRKV_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFAIRKV_ENABLE_CUDA=$cuda
cmake --build "$BUILD" -j"${FAIRKV_JOBS:-2}"
ctest --test-dir "$BUILD" --output-on-failure
