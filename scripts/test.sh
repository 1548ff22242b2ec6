#!/usr/bin/env bash
# The project's test command: set up, configure, build everything (CUDA too where nvcc exists: GPU tests then
# skip visibly without a device), and run every test with ctest; then the core and runner tests again under
# sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's end and the time since the start, so a CI log shows where its time went (CI must stay under an hour).
phase() { printf '== fairkv test.sh: %s done at %d min %02d s\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }
bash scripts/setup.sh
phase setup
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda=ON
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# The llama.cpp integration is built and tested against scripts/build_llamacpp.sh's build (already made by
# setup.sh; this only prints its prefix). FAIRKV_LLAMACPP=OFF leaves it out.
llamacpp=OFF
if [[ "${FAIRKV_LLAMACPP:-ON}" != "OFF" ]]; then llamacpp=$(bash scripts/build_llamacpp.sh); fi
BUILD=${FAIRKV_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFAIRKV_ENABLE_CUDA=$cuda -DFAIRKV_LLAMACPP="$llamacpp"
cmake --build "$BUILD" -j"${FAIRKV_JOBS:-2}"
phase build
# Two tests at a time: most are a single-threaded compiler or emulator run (the suite's CPU time is about 1.25 times
# its wall time when run one by one).
ctest --test-dir "$BUILD" --output-on-failure -j"${FAIRKV_JOBS:-2}"
phase ctest

# The Python package (pyproject.toml) and its numpy, torch and kvpress tests, in their own virtual environment.
if [[ "${FAIRKV_PYTHON:-ON}" != "OFF" ]]; then bash scripts/test_python.sh; fi
phase python

# Once more under AddressSanitizer + UndefinedBehaviorSanitizer, CPU only, in its own build folder: engine views are
# hostile input, and the misuse suite and view fuzz of the core tests size their buffers exactly, so any access
# outside a view is an error here. Only two test programs are built, with line tables only (-g1: enough for the
# sanitizers' stack traces) and the core tests at -O1 (the runner's targets add their own -O3): the core suite, and
# the runner's input and memory paths (fairkv_llama_input_tests: GGUF parsing and corruption, tokenizer,
# quantisation, model types, chat scripts and the chat's growing cache, thread pool). The runner's forward,
# compression and scoring cases take minutes each to build and run under ASan; they run in the Release suite above.
# Four chat cases that add no memory path of their own are left to the Release run too: position refusals, system
# floors and turn decay (the prioritized allocator runs under ASan in the core tests), a budget that is never
# reached, and the budget-and-remap property over many conversations (about 10 minutes under ASan; the growing
# cache and the online column sums, which it would repeat, run here). docs/design-notes.md ("Build time") has this
# script's phases as measured.
ASAN_BUILD=${FAIRKV_ASAN_BUILD_DIR:-build-asan}
cmake -S . -B "$ASAN_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
  -DFAIRKV_ENABLE_CUDA=OFF -DFAIRKV_BUILD_BENCH=OFF
cmake --build "$ASAN_BUILD" -j"${FAIRKV_JOBS:-2}" --target fairkv_core_tests fairkv_llama_input_tests
phase "sanitizer build"
export UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir "$ASAN_BUILD" --output-on-failure -R '^fairkv_core_tests$'
"$ASAN_BUILD/tests/llama/fairkv_llama_input_tests" \
  --test-case-exclude='chat: positions past*,chat: --system-floor*,chat: a budget larger than the conversation*,chat: budget never exceeded*'
phase "sanitizer tests"
