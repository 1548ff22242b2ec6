#!/usr/bin/env bash
# Install the pitfalls harness's Python dependencies and run the small subset with fairkv-llama, then
# aggregate into docs/results.md, docs/data/pitfalls_report.md and docs/img/pitfalls_*.png.
#   scripts/run_pitfalls.sh                  # 20 items, ratios 0,0.5,0.9 (resumable; ~50 min on 2 cores)
#   scripts/run_pitfalls.sh --quick          # 4 items, same configurations, results/pitfalls_quick.jsonl (~10 min)
#   scripts/run_pitfalls.sh --full           # the whole sweep into results/pitfalls_full.jsonl
#   FAIRKV_LLAMA=/path/to/fairkv-llama scripts/run_pitfalls.sh --policies snapkv --jobs 2
# Extra arguments go to `python3 -m tools.pitfalls run`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# A Debian system Python refuses pip (PEP 668) unless told otherwise.
pip_install() { "$PY" -m pip install -q "$@" || "$PY" -m pip install -q --break-system-packages "$@"; }
if [[ "${PITFALLS_SKIP_PIP:-0}" != 1 ]]; then
  pip_install -r tools/pitfalls/requirements.txt
  pip_install --no-deps -r tools/pitfalls/requirements-nodeps.txt
fi

if [[ -z "${FAIRKV_LLAMA:-}" ]] && ! ls build*/examples/llama/fairkv-llama >/dev/null 2>&1; then
  echo "building fairkv-llama in build/ ..." >&2
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j2 --target fairkv-llama
fi

"$PY" -m tools.pitfalls check
mode=small
for a in "$@"; do
  [[ "$a" == --full ]] && mode=full
  [[ "$a" == --quick ]] && mode=quick
done
"$PY" -m tools.pitfalls run "$@"
if [[ $mode != small ]]; then
  "$PY" -m tools.pitfalls report "results/pitfalls_$mode.jsonl" --md-out "results/pitfalls_${mode}_report.md" \
    --img-dir "results/img_$mode" --results-md ''
else
  "$PY" -m tools.pitfalls report
fi
