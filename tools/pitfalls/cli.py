"""`python3 -m tools.pitfalls run|report|check` (see docs/results.md for the commands used)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import aggregate, data, harness, plots
from .data import REPO_ROOT
from .runner import Request, RunnerError, find_runner, run as run_runner

SMALL_OUT = REPO_ROOT / "docs" / "data" / "pitfalls_small.jsonl"
FULL_OUT = REPO_ROOT / "results" / "pitfalls_full.jsonl"
FULL_RATIOS = [round(0.1 * i, 1) for i in range(10)]
BEGIN, END = "<!-- BEGIN GENERATED: python3 -m tools.pitfalls report -->", "<!-- END GENERATED -->"


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _ratios(s: str) -> list[float]:
    rs = [float(x) for x in _csv(s)]
    bad = [r for r in rs if not 0.0 <= r < 1.0]
    if bad:
        raise argparse.ArgumentTypeError(f"ratios must be in [0, 1): {bad}")
    return rs


def _choices(allowed):
    def parse(s: str) -> list[str]:
        xs = _csv(s)
        bad = [x for x in xs if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return xs
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m tools.pitfalls", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run the sweep (resumable; one JSON line per runner invocation)")
    r.add_argument("--subset", type=int, default=20, help="items: half single-, half multi-instruction (default 20)")
    r.add_argument("--full", action="store_true", help="all 538 items, ratios 0.0..0.9, into results/")
    r.add_argument("--ratios", type=_ratios, default=None, help="comma list (default 0,0.5,0.9)")
    r.add_argument("--policies", type=_choices(harness.POLICIES), default=list(harness.POLICIES))
    r.add_argument("--variants", type=_choices(harness.VARIANTS), default=list(harness.VARIANTS))
    r.add_argument("--defenses", type=_choices(("standard", "flipped", "none")), default=list(harness.DEFENSES))
    r.add_argument("--whitelist-mode", choices=("refusal", "defense"), default="refusal",
                   help="what the whitelist variants force-keep: the defense's refusal sentence (default) or "
                        "the whole defense instruction (120 of ~175 system tokens with SmolLM2: over the keep "
                        "budget from ratio ~0.3 on, recorded as infeasible)")
    r.add_argument("--runner", default=None, help="fairkv-llama binary (default: $FAIRKV_LLAMA, build*/)")
    r.add_argument("--model", default=None, help="GGUF path (default: the runner finds it)")
    r.add_argument("--out", type=Path, default=None, help=f"JSONL (default {SMALL_OUT.relative_to(REPO_ROOT)}, "
                                                          f"--full: {FULL_OUT.relative_to(REPO_ROOT)})")
    r.add_argument("--max-new-tokens", type=int, default=128)
    r.add_argument("--window", type=int, default=16, help="snapkv observation window (the paper: 16)")
    r.add_argument("--threads", type=int, default=2, help="runner threads per invocation")
    r.add_argument("--jobs", type=int, default=1, help="runner invocations in parallel")
    r.add_argument("--seed", type=int, default=0, help="subset draw")
    r.add_argument("--limit", type=int, default=None, help="run at most this many pending runs, then stop")
    r.add_argument("--data-dir", type=Path, default=None)
    r.add_argument("--dry-run", action="store_true", help="print the plan size and exit")
    r.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("report", help="aggregate JSONL into markdown tables and PNG plots")
    p.add_argument("inputs", nargs="*", type=Path, help=f"JSONL files (default {SMALL_OUT.relative_to(REPO_ROOT)})")
    p.add_argument("--img-dir", type=Path, default=REPO_ROOT / "docs" / "img")
    p.add_argument("--md-out", type=Path, default=REPO_ROOT / "docs" / "data" / "pitfalls_report.md")
    p.add_argument("--results-md", type=Path, default=REPO_ROOT / "docs" / "results.md",
                   help="replace the generated block of this file (between its BEGIN/END markers)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--all-items", action="store_true",
                   help="also use items that lack some configurations (default: only complete items)")

    c = sub.add_parser("check", help="is the runner there, and does --policy none answer?")
    c.add_argument("--runner", default=None)
    c.add_argument("--model", default=None)
    c.add_argument("--max-new-tokens", type=int, default=16)
    return ap


def cmd_run(a) -> int:
    data_dir = a.data_dir or data.default_data_dir()
    items = data.load_items(data_dir)
    subset = items if a.full else data.pick_subset(items, a.subset, a.seed)
    ratios = a.ratios or (FULL_RATIOS if a.full else [0.0, 0.5, 0.9])
    out = a.out or (FULL_OUT if a.full else SMALL_OUT)
    runs = harness.plan(subset, data.load_defenses(data_dir), a.defenses, a.policies, a.variants, ratios)
    s = harness.Settings(window=a.window, max_new_tokens=a.max_new_tokens, threads=a.threads,
                         whitelist_mode=a.whitelist_mode, model=a.model)
    pending = [x for x in runs if x.run_id(s) not in harness.done_ids(out)]
    print(f"plan: {len(subset)} items x {len(a.defenses)} defenses, ratios {ratios}: {len(runs)} runs, "
          f"{len(runs) - len(pending)} already in {out}", file=sys.stderr)
    walls = [r["wall_s"] for r in harness.read_jsonl(out) if r.get("status") == "ok" and r.get("wall_s")]
    if walls and pending:
        mean = sum(walls) / len(walls)
        print(f"estimate: {len(pending)} pending runs x {mean:.1f} s (mean of {len(walls)} done) = "
              f"{len(pending) * mean / 60 / max(1, a.jobs):.0f} min with --jobs {a.jobs}", file=sys.stderr)
    if a.dry_run:
        return 0
    binary = find_runner(a.runner)
    if binary is None or not binary.is_file():
        print("error: fairkv-llama not found; build it (cmake --build build --target fairkv-llama) or pass "
              "--runner / set $FAIRKV_LLAMA", file=sys.stderr)
        return 2
    if a.limit is not None:
        keep = {x.run_id(s) for x in pending[: a.limit]}
        runs = [x for x in runs if x.run_id(s) in keep]
    stats = harness.execute(runs, out, binary, data.load_attack(data_dir), s, jobs=a.jobs,
                            progress=not a.no_progress)
    print(json.dumps(stats), file=sys.stderr)
    return 0 if stats["error"] == 0 else 1


def cmd_report(a) -> int:
    inputs = a.inputs or [SMALL_OUT]
    records = [r for path in inputs for r in harness.read_jsonl(path)]
    if not a.all_items:
        records, dropped = aggregate.complete_only(records)
        if dropped:
            print(f"left out {len(dropped)} items without every configuration (stopped part-way): {dropped}",
                  file=sys.stderr)
    md = aggregate.report_markdown(records)
    a.md_out.parent.mkdir(parents=True, exist_ok=True)
    a.md_out.write_text(md + "\n", encoding="utf-8")
    print(f"wrote {a.md_out}", file=sys.stderr)
    if not a.no_plots:
        for path in plots.write_all(records, a.img_dir):
            print(f"wrote {path}", file=sys.stderr)
    if a.results_md and a.results_md.is_file():
        text = a.results_md.read_text(encoding="utf-8")
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            a.results_md.write_text(f"{head}{BEGIN}\n{md}\n{END}{tail}", encoding="utf-8")
            print(f"updated {a.results_md}", file=sys.stderr)
    return 0


def cmd_check(a) -> int:
    binary = find_runner(a.runner)
    if binary is None or not binary.is_file():
        print("fairkv-llama: not found", file=sys.stderr)
        return 2
    req = Request(system_marked="[[seg:instructions]]Answer in one word.", users=("What colour is the sky?",),
                  policy="none", ratio=0.0, fair=False, whitelist=(), max_new_tokens=a.max_new_tokens,
                  model=a.model)
    try:
        doc, wall = run_runner(binary, req, timeout_s=600)
    except (RunnerError, OSError) as e:
        print(f"fairkv-llama at {binary}: failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"runner": str(binary), "answer": doc["turns"][0]["answer"], "wall_s": round(wall, 2),
                      "timings_ms": doc.get("timings_ms"), "segments": doc.get("segments")}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return {"run": cmd_run, "report": cmd_report, "check": cmd_check}[a.cmd](a)
