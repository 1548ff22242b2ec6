#!/usr/bin/env python3
"""A stand-in for fairkv-llama with the same CLI and --json schema, for the harness's own tests.

It runs no model: answers are fixed functions of the arguments, so the tests can check that the harness
passes the right arguments, parses the document, skips finished runs and records failures. Every
invocation appends its argv to $FAKE_RUNNER_LOG (one JSON line) so a test can count invocations.
"""
import argparse
import json
import os
import re
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--system", required=True)
ap.add_argument("--user", action="append", default=[])
ap.add_argument("--policy", default="none")
ap.add_argument("--ratio", type=float, default=0.0)
ap.add_argument("--window", type=int, default=64)
ap.add_argument("--fair", action="store_true")
ap.add_argument("--whitelist", action="append", default=[])
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--model", default="fake.gguf")
ap.add_argument("--json", required=True)
ap.add_argument("--quiet", action="store_true")
a = ap.parse_args()

if os.environ.get("FAKE_RUNNER_LOG"):
    with open(os.environ["FAKE_RUNNER_LOG"], "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
if os.environ.get("FAKE_RUNNER_FAIL"):
    print("fairkv-llama: error: simulated crash", file=sys.stderr)
    sys.exit(3)

# Segments: "tokens" are whitespace-separated words of each marked segment.
parts = re.split(r"\[\[seg:([A-Za-z0-9_]+)\]\]", a.system)
plain = parts[0] + "".join(parts[2::2])
segs, pos = [], len(parts[0].split())
for name, text in zip(parts[1::2], parts[2::2]):
    n = len(text.split())
    segs.append({"name": name, "begin": pos, "end": pos + n, "tokens": n, "text": text})
    pos += n
total = pos
budget = max(1, int(total * (1 - a.ratio))) if a.ratio > 0 else total
forced = sum(len(w.split()) for w in a.whitelist)
if forced > budget:
    print(f"fairkv-llama: error: whitelist ({forced} tokens) is more than the keep budget ({budget})",
          file=sys.stderr)
    sys.exit(1)
for s in segs:
    if a.fair or a.ratio == 0:
        frac = 1 - a.ratio
    elif s["name"] == "defense" and not a.whitelist:
        frac = max(0.0, 1 - 2 * a.ratio)          # recency-biased: the early segment goes first
    elif s["name"] == "defense":
        frac = 1.0
    else:
        frac = min(1.0, 1 - a.ratio / 2)
    s["kept_fraction"] = frac
    s["kept"] = frac * s["tokens"]

leaks = a.ratio >= 0.5 and not a.whitelist
turns = []
for i, u in enumerate(a.user):
    if i == 0:
        ans = plain if leaks else "I can't assist with that request."
    else:
        ans = "here is a short answer without any commas." if a.ratio < 0.9 else "Here, A Comma."
    turns.append({"user": u, "answer": ans, "new_tokens": len(ans.split())})
doc = {
    "model": a.model, "policy": a.policy, "ratio": a.ratio, "window": a.window, "fair": a.fair,
    "selector": "per_head", "whitelist": a.whitelist, "system_tokens": total, "n_layers": 2, "n_kv_heads": 1,
    "segments": segs, "kept_per_layer": [[s["kept_fraction"] for s in segs]] * 2, "turns": turns,
    "timings_ms": {"load": 1.0, "prefill": 10.0, "compress": 0.0 if a.ratio == 0 else 2.0 + a.fair + len(a.whitelist),
                   "decode": 5.0 * sum(t["new_tokens"] for t in turns)},
    "prefill_tokens": total, "decode_tokens": sum(t["new_tokens"] for t in turns),
}
with open(a.json, "w") as f:
    json.dump(doc, f)
