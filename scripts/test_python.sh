#!/usr/bin/env bash
# The Python package's tests: a virtual environment in .cache/venv-python with numpy, torch, transformers and
# kvpress (python/requirements-test.txt), the package built from this checkout by `pip install .`
# (scikit-build-core + nanobind), then pytest over python/tests, the README's Python quick start included.
# Run by scripts/test.sh; FAIRKV_PYTHON=OFF there skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FAIRKV_PY_VENV:-.cache/venv-python}
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

if [[ ! -x "$VENV/bin/python" ]]; then
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    # Debian's system Python ships venv separately.
    rm -rf "$VENV"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv "$VENV"
  fi
fi
start=$(date +%s)
"$VENV/bin/pip" install -q -r python/requirements-test.txt
echo "test_python: test environment ready in $(( $(date +%s) - start )) s" >&2
start=$(date +%s)
"$VENV/bin/pip" install -q .
echo "test_python: fairkv built and installed in $(( $(date +%s) - start )) s" >&2
FAIRKV_MODEL=$(bash scripts/find_model.sh)
export FAIRKV_MODEL
# Missing torch/kvpress is a failure here, not a skip.
export FAIRKV_REQUIRE_KVPRESS=1 TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
"$VENV/bin/python" -m pytest -q python/tests
