"""The same defended system prompt through two stacks: fairkv's Llama runner (`fairkv-llama --fair`, its own GGUF
forward) and HF transformers + kvpress + `fairkv.kvpress.FairPress` (the same GGUF, dequantised by transformers).
Both compress the system turn; this prints, per policy and ratio, whether the token sequence, the segments' token
spans and every layer's per-segment kept counts agree.

    python3 scripts/compare_kvpress_runner.py --runner build/examples/llama/fairkv-llama

Needs torch, transformers, kvpress, gguf and the fairkv package (pip install .[kvpress] gguf).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
from kvpress import KnormPress, ObservedAttentionPress, SnapKVPress, StreamingLLMPress, TOVAPress  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from fairkv.kvpress import FairPress, strip_markers, token_spans  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PRESSES = {
    "knorm": lambda r, w: KnormPress(compression_ratio=r),
    "streaming_llm": lambda r, w: StreamingLLMPress(compression_ratio=r, n_sink=4),
    "snapkv": lambda r, w: SnapKVPress(compression_ratio=r, window_size=w),
    "tova": lambda r, w: TOVAPress(compression_ratio=r),
    "h2o": lambda r, w: ObservedAttentionPress(compression_ratio=r),
}


def system_prompt(order: str) -> str:
    data = ROOT.parent / "shared" / "data" / "pitfalls"
    defenses = json.loads((data / "defenses.json").read_text())
    item = json.loads((data / "sys_ifeval.jsonl").read_text().splitlines()[0])
    instructions = item["messages"][0]["content"]
    defense = defenses["standard_defense"].replace("\n$system_prompt", "")
    if order == "defense_first":
        return f"[[seg:defense]]{defense}\n[[seg:instructions]]{instructions}"
    return f"[[seg:instructions]]{instructions}\n\n[[seg:defense]]{defense}"


def run_runner(runner: str, model: str, marked: str, policy: str, ratio: float, window: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        sys_file, out = Path(tmp) / "system.txt", Path(tmp) / "report.json"
        sys_file.write_text(marked)
        subprocess.run([runner, "--model", model, "--system-file", str(sys_file), "--user", "Hi.", "--policy", policy,
                        "--ratio", str(ratio), "--window", str(window), "--fair", "--max-new-tokens", "1", "--quiet",
                        "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", default=str(ROOT / "build" / "examples" / "llama" / "fairkv-llama"))
    ap.add_argument("--model", default=None, help="GGUF (default: scripts/find_model.sh)")
    ap.add_argument("--policies", default="knorm,streaming_llm,snapkv,tova,h2o")
    ap.add_argument("--ratios", default="0.3,0.5,0.7")
    ap.add_argument("--window", type=int, default=16)
    args = ap.parse_args()
    model_path = args.model or subprocess.run(["bash", str(ROOT / "scripts" / "find_model.sh")], check=True,
                                              capture_output=True, text=True).stdout.strip()
    hf_logging.set_verbosity_error()
    directory, name = os.path.split(model_path)
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()

    rows, all_ok = [], True
    for order in ("defense_first", "defense_last"):
        marked = system_prompt(order)
        clean, chars = strip_markers(marked)
        turn = tok.apply_chat_template([{"role": "system", "content": clean}], tokenize=False)
        start = turn.index(clean)
        names = list(chars)
        spans = dict(zip(names, token_spans(tok, turn, [(start + chars[n][0], start + chars[n][1]) for n in names])))
        ids = torch.tensor([tok.encode(turn, add_special_tokens=False)])
        for policy in args.policies.split(","):
            for ratio in (float(r) for r in args.ratios.split(",")):
                report = run_runner(args.runner, model_path, marked, policy, ratio, args.window)
                press = FairPress(PRESSES[policy](ratio, args.window), segments=list(spans.values()), record=True)
                with torch.no_grad(), press(model):
                    model.model(input_ids=ids, past_key_values=DynamicCache())
                same_tokens = report["system_tokens"] == ids.shape[1]
                runner_spans = {s["name"]: (s["begin"], s["end"]) for s in report["segments"]}
                same_spans = runner_spans == spans
                mismatched_layers = 0
                for layer, fractions in enumerate(report["kept_per_layer"]):
                    plan = press.plans[layer]
                    for h in range(plan.heads):
                        kept = set(plan.kept(0, h).tolist())
                        ours = [len(kept & set(range(*spans[n]))) for n in names]
                        theirs = [round(f * (spans[n][1] - spans[n][0])) for f, n in
                                  zip(fractions, [s["name"] for s in report["segments"]])]
                        if ours != theirs:
                            mismatched_layers += 1
                            break
                ok = same_tokens and same_spans and mismatched_layers == 0
                all_ok &= ok
                counts = press.plans[0].kept(0, 0).tolist()
                per_segment = {n: len(set(counts) & set(range(*spans[n]))) for n in names}
                rows.append((order, policy, ratio, ids.shape[1], spans, per_segment, len(report["kept_per_layer"]),
                             mismatched_layers, ok))
    print("| defense | policy | ratio | system tokens | segments (tokens) | kept per segment | layers agreeing |")
    print("|---|---|---|---|---|---|---|")
    for order, policy, ratio, n, spans, kept, layers, bad, ok in rows:
        seg = ", ".join(f"{k} [{b}, {e})" for k, (b, e) in spans.items())
        kp = ", ".join(f"{k} {v}" for k, v in kept.items())
        print(f"| {order} | {policy} | {ratio} | {n} | {seg} | {kp} | {layers - bad}/{layers}{'' if ok else ' MISMATCH'} |")
    print("all agree" if all_ok else "MISMATCH", file=sys.stderr)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
