#!/usr/bin/env bash
# The one prepared GPU check of the CUDA backend (docs/cuda-backend.md).
#
#   bash scripts/gpu_check.sh build   # on a machine with nvcc + the project's dependencies (no GPU needed):
#                                     # configures build-cuda, builds the CUDA tests and benchmark (static cudart)
#                                     # and copies the binaries to build-gpu-bin/ (ignored by git)
#   bash scripts/gpu_check.sh run     # on the GPU machine: runs the parity suite, the quick parity suite under
#                                     # compute-sanitizer (memcheck, racecheck, synccheck) and the benchmark,
#                                     # printing everything and a summary; exit status 0 only if all passed
#   bash scripts/gpu_check.sh all     # both, on a machine that has a GPU and the whole toolchain
#
# With the device tool (its machine has nvcc and CMake but not Eigen/doctest, so the binaries travel):
#   bash scripts/gpu_check.sh build
#   run(command="bash scripts/gpu_check.sh run", carry=["build-gpu-bin"], timeout_s=540)
# Then record the output (with the GPU's name) in docs/benchmarks.md.
set -u
cd "$(dirname "$0")/.."
mode=${1:-run}
BIN=${FAIRKV_GPU_BIN:-build-gpu-bin}
BUILD=${FAIRKV_CUDA_BUILD:-build-cuda}

build() {
  local nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  echo "== build with $nvcc"
  cmake -S . -B "$BUILD" -DFAIRKV_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${FAIRKV_CUDA_ARCHS:-80;90}" || return 1
  cmake --build "$BUILD" -j"${FAIRKV_JOBS:-2}" --target fairkv_cuda_header_check fairkv_cuda_tests fairkv_bench_cuda \
    fairkv_paged_engine_cuda || return 1
  mkdir -p "$BIN"
  cp "$BUILD/tests/cuda/fairkv_cuda_tests" "$BUILD/bench/cuda/fairkv_bench_cuda" \
    "$BUILD/examples/paged_engine/fairkv_paged_engine_cuda" "$BIN/" || return 1
  ls -l "$BIN"
}

declare -a summary=()
step() {  # step NAME TIMEOUT COMMAND...
  local name=$1 limit=$2
  shift 2
  echo
  echo "== $name: $*"
  local t0=$SECONDS log
  log=$(mktemp)
  timeout "$limit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local verdict=PASS
  [ $rc -ne 0 ] && verdict="FAIL (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"
  # A GPU check that found no GPU has checked nothing: say so and fail.
  if grep -q "SKIPPED: no CUDA device" "$log"; then verdict="SKIPPED (no CUDA device)"; rc=1; fi
  rm -f "$log"
  echo "== $name: $verdict in $((SECONDS - t0)) s"
  summary+=("$name: $verdict")
  return $rc
}

run_checks() {
  local tests="$BIN/fairkv_cuda_tests" bench="$BIN/fairkv_bench_cuda"
  if [ ! -x "$tests" ] || [ ! -x "$bench" ]; then
    echo "missing $tests or $bench: run 'bash scripts/gpu_check.sh build' first (and carry $BIN)"
    return 1
  fi
  echo "== device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || nvidia-smi
  step "host checks" 60 "$tests" --test-suite=cuda_host
  step "parity suite" 240 "$tests" --test-suite=cuda_parity --duration=true
  local san
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$san" ]; then
    export FAIRKV_CUDA_QUICK=1
    step "memcheck (quick parity)" 180 "$san" --tool memcheck --error-exitcode 1 "$tests" --test-suite=cuda_parity
    step "racecheck (compaction)" 90 "$san" --tool racecheck --error-exitcode 1 "$tests" --test-suite=cuda_parity \
      --test-case='*compaction*'
    step "racecheck (exact selection)" 60 "$san" --tool racecheck --error-exitcode 1 "$tests" --test-suite=cuda_parity \
      --test-case='*exact scorers*'
    step "synccheck (exact parity)" 120 "$san" --tool synccheck --error-exitcode 1 "$tests" --test-suite=cuda_parity \
      --test-case='*exact scorers*'
    unset FAIRKV_CUDA_QUICK
  else
    echo "== compute-sanitizer not found: sanitizer runs SKIPPED"
    summary+=("compute-sanitizer: SKIPPED (not installed)")
  fi
  if [ -x "$BIN/fairkv_paged_engine_cuda" ]; then
    step "paged engine loop (requests batched = one by one)" 60 "$BIN/fairkv_paged_engine_cuda"
  fi
  step "benchmark" 150 "$bench"
  echo
  echo "== summary"
  printf '  %s\n' "${summary[@]}"
  for s in "${summary[@]}"; do case $s in *FAIL* | *"no CUDA device"*) return 1 ;; esac; done
  return 0
}

# On the device tool's machine $OUT comes back: keep the whole log there (the reply only holds its tail).
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then exec > >(tee "$OUT/gpu_check.log") 2>&1; fi

case $mode in
  build) build ;;
  run) run_checks ;;
  all) build && run_checks ;;
  *) echo "usage: $0 build|run|all" >&2; exit 2 ;;
esac
