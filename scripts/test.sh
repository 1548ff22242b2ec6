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
ctest --test-dir "$BUILD" --output-on-failure
phase ctest

# The Python package (pyproject.toml) and its numpy, torch and kvpress tests, in their own virtual environment.
if [[ "${FAIRKV_PYTHON:-ON}" != "OFF" ]]; then bash scripts/test_python.sh; fi
phase python

# Once more under AddressSanitizer + UndefinedBehaviorSanitizer, CPU only, in its own build folder: engine views are
# hostile input (issue 10), and the misuse suite and view fuzz of the core tests size their buffers exactly, so any
# access outside a view is an error here. Only the two test programs are built, with line tables only (-g1: enough for
# the sanitizers' stack traces) and the core tests at -O1 (the runner's targets add their own -O3): at -O2 -g this
# build took 33 minutes of a 69-minute fresh-clone run of this script, at -O1 -g1 16 of 51 (2026-12-05, 2 cores). The
# runner's model-heavy cases take minutes each under ASan (two over 6 minutes), so they are left to the Release run
# above; the rest (GGUF parsing and corruption, quantisation, tokenizer, chat, model types, thread pool, and the
# lighter forward/runner cases that fill and compress a real cache) run in about 4 minutes on 2 idle cores (430
# CPU-seconds), the core tests in under a minute. The prefill-statistics test keeps its prefill and score comparison
# (the statistics' writes are checked) and leaves its 36-configuration plan comparison to the Release run. The chat's
# growing cache runs here (85 s under ASan: its buffers are re-laid out as it grows); three chat cases that add no
# memory path of their own are left to the Release run: position refusals (54 s), system floors and turn decay
# (93 s; the prioritized allocator runs under ASan in the core tests) and a budget that is never reached (61 s).
ASAN_BUILD=${FAIRKV_ASAN_BUILD_DIR:-build-asan}
cmake -S . -B "$ASAN_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
  -DFAIRKV_ENABLE_CUDA=OFF -DFAIRKV_BUILD_BENCH=OFF
cmake --build "$ASAN_BUILD" -j"${FAIRKV_JOBS:-2}" --target fairkv_core_tests fairkv_llama_tests
phase "sanitizer build"
export UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir "$ASAN_BUILD" --output-on-failure -R '^fairkv_core_tests$'
# ctest sees the runner suite as one test, so its filter is doctest's, on the program itself.
"$ASAN_BUILD/tests/llama/fairkv_llama_tests" \
  --test-case-exclude='forward: logits*,forward: a batched decode*,runner: compression at ratio 0*,runner: fair eviction*,runner: a sweep*,scoring: ratio 0*,chat: positions past*,chat: --system-floor*,chat: a budget larger than the conversation*' \
  --subcase-exclude='plans equal except at near-ties*'
phase "sanitizer tests"
