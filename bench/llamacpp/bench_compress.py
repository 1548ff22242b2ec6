#!/usr/bin/env python3
"""fairkv inside llama.cpp: what compressing the system turn costs next to prefilling it, and what it gives back.

Runs fairkv-llamacpp (built with -DFAIRKV_LLAMACPP=ON) on a ~2k-token system turn made of the pitfalls system
messages (../shared/data/pitfalls/sys_ifeval.jsonl), configurations interleaved run by run so machine load hits
them alike: no compression (ratio 0, the state round trip only), knorm and snapkv at ratio 0.5. Prints per
configuration the median over --reps of: prefill ms, state read + parse + plan/compact + state write + state load
ms, state bytes before/after, decode tokens/s (the user turn's prefill plus greedy steps, over the compressed cache).

  python3 bench/llamacpp/bench_compress.py build/examples/llamacpp/fairkv-llamacpp --reps 3 --threads 1
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("exe")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--chars", type=int, default=8600, help="system text length (~2k SmolLM2 tokens)")
ap.add_argument("--max-new-tokens", type=int, default=64)
a = ap.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(here, "..", "..", "..", "shared", "data", "pitfalls", "sys_ifeval.jsonl")
parts, size = [], 0
for line in open(data):
    msg = json.loads(line)["messages"][0]["content"]
    parts.append(msg)
    size += len(msg) + 1
    if size >= a.chars:
        break
system = "\n".join(parts)

configs = [("none", "0"), ("knorm", "0.5"), ("snapkv", "0.5")]
runs = {c: [] for c in configs}
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "r.json")
    for rep in range(a.reps):
        for policy, ratio in configs:
            cmd = [a.exe, "--system", system, "--user", "Summarise the rules above in one sentence.",
                   "--policy", policy, "--ratio", ratio, "--window", "64", "--threads", str(a.threads),
                   "--max-new-tokens", str(a.max_new_tokens), "--ctx", "4096", "--quiet", "--json", out]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{policy} {ratio}: {r.stderr}")
            runs[(policy, ratio)].append(json.load(open(out)))

med = lambda xs: statistics.median(xs)
print(f"system turn: {runs[configs[0]][0]['system_tokens']} tokens; median of {a.reps}, threads {a.threads}")
print("| policy | ratio | prefill ms | state read | parse | plan+compact | state write | state load | "
      "compress total ms | state bytes before -> after | decode tok/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (policy, ratio), rs in runs.items():
    t = lambda k: med([r["timings_ms"][k] for r in rs])
    tps = med([r["decode_tokens"] / (r["timings_ms"]["decode"] / 1000.0) for r in rs])
    s = rs[0]["state"]
    print(f"| {policy} | {ratio} | {t('prefill'):.0f} | {t('state_read'):.1f} | {t('parse'):.2f} | "
          f"{t('plan_compact'):.1f} | {t('state_write'):.1f} | {t('state_load'):.1f} | {t('compress_total'):.1f} | "
          f"{s['bytes_before']} -> {s['bytes_after']} | {tps:.1f} |")
