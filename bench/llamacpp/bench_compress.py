#!/usr/bin/env python3
"""fairkv inside llama.cpp: what compressing the system turn costs next to prefilling it.

For each model and system-turn size, fairkv-llamacpp runs every policy (plain and --fair) and, as the baseline, no
compression (--policy none: the prefill without any capture), interleaved configuration by configuration in
every round so that machine load hits them alike, all with flash attention off (the attention statistics are read
from llama.cpp's softmax, which only exists without it). Per configuration, medians over --reps of:
- prefill: the system turn's prefill (with the capture that configuration needs), and its ratio to the baseline's;
- compress: the state copy, parse, plan + compact and state write (timings_ms.compress) plus the state load;
- the cost ratio (prefill - baseline prefill + compress) / baseline prefill: what compression adds to the prefill;
- what the scorer read (statistics): llama.cpp's softmax rows / column sums / local column sums, or the queries.

  python3 bench/llamacpp/bench_compress.py build/examples/llamacpp/fairkv-llamacpp --models smollm2,qwen1.5b \\
      --tokens 300,2000 --reps 3 --threads 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

POLICIES = ["knorm", "streaming_llm", "snapkv", "tova", "h2o"]

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("exe")
ap.add_argument("--models", default="smollm2,qwen1.5b")
ap.add_argument("--tokens", default="300,2000", help="approximate system-turn sizes (text cut at 4.1 chars/token)")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--ratio", default="0.5")
ap.add_argument("--window", default="16")
a = ap.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(here, "..", "..", "..", "shared", "data", "pitfalls", "sys_ifeval.jsonl")


def system_text(tokens: int) -> str:
    """The pitfalls system messages, one per line (a segment each), up to ~`tokens` tokens."""
    parts, size = [], 0
    for line in open(data, encoding="utf-8"):
        msg = json.loads(line)["messages"][0]["content"].replace("\n", " ")
        parts.append(msg)
        size += len(msg) + 1
        if size >= tokens * 4.1:
            break
    return "\n".join(parts)


configs = [("none", False)] + [(p, f) for p in POLICIES for f in (False, True)]
med = statistics.median
for model in a.models.split(","):
    for tokens in [int(t) for t in a.tokens.split(",")]:
        system = system_text(tokens)
        runs = {c: [] for c in configs}
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            for rep in range(a.reps):
                for policy, fair in configs:
                    cmd = [a.exe, "--model", model, "--system", system, "--user", "Summarise the rules in one sentence.",
                           "--policy", policy, "--ratio", a.ratio if policy != "none" else "0", "--window", a.window,
                           "--threads", str(a.threads), "--max-new-tokens", "1", "--flash-attn", "off", "--quiet",
                           "--json", out] + (["--fair"] if fair else [])
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    if r.returncode != 0:
                        sys.exit(f"{model} {tokens} {policy} fair={fair}: {r.stderr}")
                    with open(out, encoding="utf-8") as f:
                        runs[(policy, fair)].append(json.load(f))
        base = med([r["state"]["system_prefill_ms"] for r in runs[("none", False)]])
        n_sys = runs[configs[0]][0]["system_tokens"]
        print(f"\n{model}, {n_sys}-token system turn ({len(system.splitlines())} segments), ratio {a.ratio}, "
              f"{a.threads} threads, medians of {a.reps} interleaved rounds; baseline prefill (no capture) "
              f"{base:.0f} ms")
        # Compression against the baseline prefill is the ratio that holds up on a shared 2-core machine; a
        # policy's own prefill spreads by more than its capture costs (the capture bench resolves that).
        print("| policy | statistics | prefill ms | prefill / baseline | compress ms | compress / baseline prefill |")
        print("|---|---|---|---|---|---|")
        for policy, fair in configs[1:]:
            rs = runs[(policy, fair)]
            pre = med([r["state"]["system_prefill_ms"] for r in rs])
            comp = med([r["timings_ms"]["compress"] + r["state"]["load_ms"] for r in rs])
            print(f"| {policy}{' fair' if fair else ''} | {rs[0]['statistics']} | {pre:.0f} | {pre / base:.3f} | "
                  f"{comp:.1f} | {100 * comp / base:.2f} % |")
        sys.stdout.flush()
