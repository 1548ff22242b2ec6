#!/usr/bin/env bash
# The Qwen2.5-Coder-1.5B experiments of docs/results.md ("Qwen2.5-1.5B in llama.cpp"), resumable: every phase
# appends to its JSONL and a rerun skips what is recorded. Run in the background (nice); each phase prints its plan
# and its rate. A copy of fairkv-llamacpp in results/bin keeps a rebuild from changing the binary mid-run.
#   scripts/run_qwen_pitfalls.sh leak 50      # leakage sweep, the first 50 items
#   scripts/run_qwen_pitfalls.sh evidence 100 # teacher-forced defense log-prob and KL along the attack answer
#   scripts/run_qwen_pitfalls.sh ifeval 100   # IFEval under compression (standard defense, the task turn only)
#   scripts/run_qwen_pitfalls.sh all 30 20    # leak 30, evidence 30, ifeval 20, then leak up to 100
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BIN=${FAIRKV_LLAMACPP_BIN:-results/bin/fairkv-llamacpp}
phase=${1:?phase: leak | evidence | ifeval | all}
items=${2:-100}
common=(--engine llamacpp --model qwen1.5b --runner "$BIN" --first "$items")
case "$phase" in
  leak)
    exec "$PY" -m tools.pitfalls run "${common[@]}" --ratios 0,0.3,0.5,0.7,0.9 \
      --variants plain,whitelist,fair,fair+whitelist --turns leak --no-progress \
      --out results/qwen_leak.jsonl ;;
  evidence)
    exec "$PY" -m tools.pitfalls evidence run "${common[@]}" --ratios 0.3,0.5,0.7,0.9 \
      --variants plain,whitelist,fair,fair+whitelist --turns leak --out results/qwen_evidence.jsonl ;;
  ifeval)
    # The item's task under the standard defense, the variants of the leakage sweep at two ratios of the paper's
    # 0.4-0.7: the directive-following half of the paper's Table 1 composite, and IFEval per instruction class.
    exec "$PY" -m tools.pitfalls run "${common[@]}" --ratios 0,0.5,0.7 --defenses standard \
      --variants plain,whitelist,fair,fair+whitelist --turns task --no-progress --out results/qwen_ifeval.jsonl ;;
  all)
    # The phases in the order that gives every experiment data soonest; each resumes where it stopped.
    "$0" leak "${2:-30}" && "$0" evidence "${2:-30}" && "$0" ifeval "${3:-20}" && "$0" leak "${4:-100}" ;;
  *) echo "run_qwen_pitfalls.sh: unknown phase '$phase' (leak, evidence, ifeval, all)" >&2; exit 2 ;;
esac
