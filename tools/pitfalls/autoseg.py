"""Automatic segmentation against the gold markers (issue 14).

For each item of the pitfalls data and each defense order, the harness's marked system turn (gold segments:
defense, preamble, instructions) is compressed with fair eviction over the gold markers and over the runner's
automatic segmentations (`--segments lines|paragraphs|sentences`), and without fair eviction. Reported per mode:
boundary precision and recall of the automatic segments against the gold ones (token positions where a segment
starts or ends inside the system text), and the kept fraction of the gold defense and instructions.

    python3 -m tools.pitfalls.autoseg --items 100            # prints a markdown table; --out keeps the records
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from .data import default_data_dir, load_defenses, load_items, pick_subset
from .runner import ENGINES, Config, SweepRequest, find_runner, run_sweep
from .segments import build_system_turn

MODES = ("plain", "markers", "lines", "paragraphs", "sentences")


def boundaries(segments: list[dict]) -> set[int]:
    """Token positions where a segment starts or ends, inside the segmented text (not its two ends)."""
    if not segments:
        return set()
    points = {s["begin"] for s in segments} | {s["end"] for s in segments}
    return points - {min(s["begin"] for s in segments), max(s["end"] for s in segments)}


def precision_recall(auto: set[int], gold: set[int]) -> tuple[int, int, int]:
    """(true positives, |auto|, |gold|): summed over items, then divided (micro-average)."""
    return len(auto & gold), len(auto), len(gold)


def bootstrap_ci(values: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def run_item(binary: Path, item, defense: str, defenses: dict, policy: str, ratio: float,
             model: str | None = None) -> list[dict]:
    turn = build_system_turn(item.system, defense, defenses)
    configs = (Config(policy, ratio, False, ()), Config(policy, ratio, True, ()),
               *(Config(policy, ratio, True, (), segments=m) for m in MODES[2:]))
    reports, _ = run_sweep(binary, SweepRequest(turn.marked, ("Hi.",), configs, max_new_tokens=0, model=model))
    gold = reports[1]["segments"]
    out = []
    for mode, rep in zip(MODES, reports):
        if rep.get("error"):
            raise RuntimeError(f"item {item.key} {defense} {mode}: {rep['error']}")
        kept = {s["name"]: s["kept_fraction"] for s in rep["segments"]}
        alloc = rep["allocation_segments"] or rep["segments"]
        tp, n_auto, n_gold = precision_recall(boundaries(alloc), boundaries(gold))
        out.append({"key": item.key, "defense": defense, "mode": mode, "policy": policy, "ratio": ratio,
                    "n_segments": len(alloc) if mode != "plain" else 0, "tp": tp, "n_auto": n_auto,
                    "n_gold": n_gold, "defense_kept": kept.get("defense"), "instructions_kept": kept.get("instructions")})
    return out


def summarize(records: list[dict]) -> str:
    lines = ["| segments | mean segments | boundary precision | boundary recall | defense kept (95% CI) | "
             "instructions kept (95% CI) | gap (defense - instructions) |", "|---|---|---|---|---|---|---|"]
    for mode in MODES:
        rs = [r for r in records if r["mode"] == mode]
        if not rs:
            continue
        tp, na, ng = (sum(r[k] for r in rs) for k in ("tp", "n_auto", "n_gold"))
        d = [r["defense_kept"] for r in rs]
        i = [r["instructions_kept"] for r in rs]
        gap = [a - b for a, b in zip(d, i)]
        pr = "n/a" if mode == "plain" else f"{tp / na:.3f}" if na else "-"
        rc = "n/a" if mode == "plain" else f"{tp / ng:.3f}" if ng else "-"
        dl, dh = bootstrap_ci(d)
        il, ih = bootstrap_ci(i)
        gl, gh = bootstrap_ci(gap)
        lines.append(f"| {mode} | {statistics.fmean(r['n_segments'] for r in rs):.1f} | {pr} | {rc} | "
                     f"{statistics.fmean(d):.3f} [{dl:.3f}, {dh:.3f}] | {statistics.fmean(i):.3f} [{il:.3f}, {ih:.3f}] | "
                     f"{statistics.fmean(gap):+.3f} [{gl:+.3f}, {gh:+.3f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tools.pitfalls.autoseg", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--policy", default="snapkv")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--engine", choices=tuple(ENGINES), default="runner",
                    help="runner: fairkv-llama; llamacpp: fairkv-llamacpp (fairkv inside llama.cpp)")
    ap.add_argument("--runner", default=None, help="the engine's binary (default: found in build*/)")
    ap.add_argument("--model", default=None, help="GGUF path or model name (smollm2, qwen1.5b)")
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=None, help="write every record as JSON lines")
    args = ap.parse_args(argv)
    binary = find_runner(args.runner, args.engine)
    if binary is None:
        print(f"{ENGINES[args.engine][0]} not found (build it, or pass --runner)", file=sys.stderr)
        return 2
    data = Path(args.data) if args.data else default_data_dir()
    defenses = load_defenses(data)
    items = pick_subset(load_items(data), args.items)
    records, t0 = [], time.monotonic()
    for n, item in enumerate(items, 1):
        for defense in ("standard", "flipped"):
            records += run_item(binary, item, defense, defenses, args.policy, args.ratio, args.model)
        print(f"\r{n}/{len(items)} items, {time.monotonic() - t0:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{args.engine} ({args.model or 'smollm2'}): {len(items)} items x 2 defense orders, {args.policy} ratio "
          f"{args.ratio:g}, "
          f"{time.monotonic() - t0:.0f} s\n")
    print(summarize(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
