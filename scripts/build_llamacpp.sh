#!/usr/bin/env bash
# Fetches llama.cpp's source as shipped in the llama-cpp-python sdist (pinned: the KV state layout the integration
# parses belongs to this exact version) and builds it once, CPU-only, as a shared libllama into an ignored cache
# folder. Prints the install prefix (give it to CMake as -DFAIRKV_LLAMACPP=<prefix>) and exits 0.
# Idempotent: a finished build (stamp file matching the pin and flags) is reused without touching the network.
#   FAIRKV_LLAMACPP_CACHE  cache folder (default: <repo>/.cache/llamacpp)
#   FAIRKV_JOBS            parallel build jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=0.3.36
CACHE=${FAIRKV_LLAMACPP_CACHE:-$PWD/.cache/llamacpp}
JOBS=${FAIRKV_JOBS:-2}
PREFIX="$CACHE/install-$VERSION"
STAMP="$PREFIX/.fairkv-build-stamp"
# GGML_NATIVE=OFF: the library must run on any x86-64 CI runner, not only the one that built a cached copy.
CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF
  -DGGML_OPENMP=OFF -DGGML_BACKEND_DL=OFF '-DCMAKE_INSTALL_RPATH=$ORIGIN')
want="llama-cpp-python==$VERSION ${CMAKE_FLAGS[*]}"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -f "$PREFIX/include/llama.h" ]]; then
  echo "$PREFIX"
  exit 0
fi

mkdir -p "$CACHE"
sdist="$CACHE/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]]; then
  echo "build_llamacpp.sh: downloading llama-cpp-python==$VERSION sdist ..." >&2
  tmp=$(mktemp -d "$CACHE/dl.XXXXXX")
  "$PY" -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp" "llama-cpp-python==$VERSION" >&2
  mv "$tmp"/llama_cpp_python-"$VERSION".tar.gz "$sdist"
  rm -rf "$tmp"
fi

src="$CACHE/src-$VERSION"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
  rm -rf "$src" "$CACHE/unpack"
  mkdir -p "$CACHE/unpack"
  tar -xzf "$sdist" -C "$CACHE/unpack"
  mv "$CACHE/unpack/llama_cpp_python-$VERSION/vendor/llama.cpp" "$src"
  rm -rf "$CACHE/unpack"
fi

build="$CACHE/build-$VERSION"
start=$(date +%s)
echo "build_llamacpp.sh: building libllama (CPU, shared, -j$JOBS) ..." >&2
cmake -S "$src" -B "$build" "${CMAKE_FLAGS[@]}" -DCMAKE_INSTALL_PREFIX="$PREFIX" >&2
cmake --build "$build" -j"$JOBS" --target llama >&2
cmake --install "$build" >&2
echo "$want" >"$STAMP"
echo "build_llamacpp.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$PREFIX"
