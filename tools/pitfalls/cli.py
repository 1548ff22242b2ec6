"""`python3 -m tools.pitfalls run|report|check` (see docs/results.md for the commands used)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import aggregate, data, harness, jsonl, plots
from .data import REPO_ROOT
from .runner import ENGINES, Request, RunnerError, find_runner, run as run_runner

SMALL_OUT = REPO_ROOT / "docs" / "data" / "pitfalls_small.jsonl"
FULL_OUT = REPO_ROOT / "results" / "pitfalls_full.jsonl"
QUICK_OUT = REPO_ROOT / "results" / "pitfalls_quick.jsonl"
OVERHEAD_OUT = REPO_ROOT / "docs" / "data" / "pitfalls_overhead.jsonl"
QUICK_ITEMS = 4
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


def _count(s: str) -> int:
    n = int(s)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {n}")
    return n


def engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=tuple(ENGINES), default="runner",
                   help="runner: fairkv-llama (its own engine); llamacpp: fairkv-llamacpp (fairkv inside llama.cpp)")
    p.add_argument("--runner", default=None,
                   help="the engine's binary (default: $FAIRKV_LLAMA / $FAIRKV_LLAMACPP_BIN, build*/)")
    p.add_argument("--model", default=None,
                   help="GGUF path or model name (smollm2, qwen1.5b; default: the engine's default, SmolLM2)")


def default_out(engine: str, model: str | None, kind: str) -> Path:
    """results/pitfalls_<kind>_<engine>_<model>.jsonl for another engine or model than the 135M runner's."""
    name = Path(model).stem if model and ("/" in model or model.endswith(".gguf")) else model
    return REPO_ROOT / "results" / f"pitfalls_{kind}_{engine}_{name or 'smollm2'}.jsonl"


def fair_options(p: argparse.ArgumentParser) -> None:
    d = harness.Settings()
    p.add_argument("--sinks", type=_count, default=d.sinks,
                   help=f"attention sinks the fair variants keep (--sinks; default {d.sinks})")
    p.add_argument("--boundary", type=_count, default=d.boundary,
                   help=f"tokens fair_boundary keeps at each end of every segment (--boundary; default {d.boundary})")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m tools.pitfalls", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run the sweep (resumable; one JSON line per runner invocation)")
    r.add_argument("--subset", type=int, default=20, help="items: half single-, half multi-instruction (default 20)")
    r.add_argument("--full", action="store_true", help="all 539 items, ratios 0.0..0.9, into results/")
    r.add_argument("--quick", action="store_true",
                   help=f"{QUICK_ITEMS} items (2 single-, 2 multi-instruction), everything else as the default (every "
                        f"variant), into {QUICK_OUT.relative_to(REPO_ROOT)}: ~15 min on a 2-core machine (estimated "
                        "from 10 min for the four variants before fair_paper and fair_boundary)")
    r.add_argument("--ratios", type=_ratios, default=None, help="comma list (default 0,0.5,0.9)")
    r.add_argument("--policies", type=_choices(harness.POLICIES), default=list(harness.POLICIES))
    r.add_argument("--variants", type=_choices(harness.VARIANTS), default=list(harness.VARIANTS),
                   help=f"comma list of {', '.join(harness.VARIANTS)} (default: all; see tools/pitfalls/harness.py)")
    r.add_argument("--defenses", type=_choices(("standard", "flipped", "none")), default=list(harness.DEFENSES))
    r.add_argument("--whitelist-mode", choices=("refusal", "defense"), default="refusal",
                   help="what the whitelist variants force-keep: the defense's refusal sentence (default) or "
                        "the whole defense instruction (120 of ~175 system tokens with SmolLM2: over the keep "
                        "budget from ratio ~0.3 on, recorded as infeasible)")
    fair_options(r)
    engine_options(r)
    r.add_argument("--first", type=int, default=None,
                   help="the first N items of the data in file order (instead of --subset's balanced draw)")
    r.add_argument("--turns", type=_choices(harness.TURNS), default=list(harness.TURNS),
                   help="user turns asked per configuration: leak (the attack), task (the item's IFEval task); "
                        "default both")
    r.add_argument("--out", type=Path, default=None, help=f"JSONL (default {SMALL_OUT.relative_to(REPO_ROOT)}, "
                                                          f"--full: {FULL_OUT.relative_to(REPO_ROOT)})")
    r.add_argument("--max-new-tokens", type=int, default=128)
    r.add_argument("--window", type=int, default=16, help="snapkv observation window (the paper: 16)")
    r.add_argument("--threads", type=int, default=2, help="runner threads per invocation")
    r.add_argument("--jobs", type=int, default=1, help="runner invocations (one per system prompt) in parallel")
    r.add_argument("--max-batch", type=int, default=64,
                   help="answers the runner decodes together (speed only: each answer is bit-identical to a run "
                        "of its configuration alone)")
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
    p.add_argument("--overhead", type=Path, default=OVERHEAD_OUT,
                   help="JSONL of `overhead` for the overhead table (default: docs/data/pitfalls_overhead.jsonl)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--img-prefix", default="pitfalls_", help="figure file names start with this (default pitfalls_)")
    p.add_argument("--block", default=None,
                   help="the generated block of --results-md to replace: <!-- BEGIN GENERATED: BLOCK --> ... "
                        "<!-- END GENERATED: BLOCK --> (default: the 135M report's block)")
    p.add_argument("--all-items", action="store_true",
                   help="also use items that lack some configurations (default: only complete items)")

    o = sub.add_parser("overhead", help="time plain / whitelist / fair / fair+whitelist, each configuration run "
                                        "alone (a sweep shares decode steps), interleaved and repeated")
    o.add_argument("--subset", type=int, default=2, help="items (default 2)")
    o.add_argument("--repeat", type=int, default=3, help="rounds over every configuration (default 3)")
    o.add_argument("--ratio", type=float, default=0.5)
    o.add_argument("--defense", choices=("standard", "flipped"), default="standard")
    o.add_argument("--policies", type=_choices(harness.POLICIES), default=list(harness.POLICIES))
    o.add_argument("--variants", type=_choices(harness.VARIANTS), default=list(harness.VARIANTS))
    fair_options(o)
    o.add_argument("--max-new-tokens", type=int, default=128)
    o.add_argument("--threads", type=int, default=2)
    engine_options(o)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--data-dir", type=Path, default=None)
    o.add_argument("--out", type=Path, default=OVERHEAD_OUT, help="JSONL, overwritten")
    o.add_argument("--no-progress", action="store_true")

    c = sub.add_parser("check", help="is the engine there, and does --policy none answer?")
    engine_options(c)
    c.add_argument("--max-new-tokens", type=int, default=16)
    return ap


def cmd_run(a) -> int:
    data_dir = a.data_dir or data.default_data_dir()
    items = data.load_items(data_dir)
    if a.full and a.quick:
        print("error: --full and --quick exclude each other", file=sys.stderr)
        return 2
    if a.first is not None:
        subset = items[: a.first]
    else:
        subset = items if a.full else data.pick_subset(items, QUICK_ITEMS if a.quick else a.subset, a.seed)
    ratios = a.ratios or (FULL_RATIOS if a.full else [0.0, 0.5, 0.9])
    if a.out:
        out = a.out
    elif a.engine != "runner" or a.model:
        out = default_out(a.engine, a.model, "full" if a.full else "run")
    else:
        out = FULL_OUT if a.full else QUICK_OUT if a.quick else SMALL_OUT
    runs = harness.plan(subset, data.load_defenses(data_dir), a.defenses, a.policies, a.variants, ratios)
    s = harness.Settings(window=a.window, max_new_tokens=a.max_new_tokens, threads=a.threads,
                         whitelist_mode=a.whitelist_mode, model=a.model, max_batch=a.max_batch, sinks=a.sinks,
                         boundary=a.boundary, engine=a.engine, turns=tuple(a.turns))
    previous = jsonl.scan(out)   # read once: a bad line is named here and counted in the final stats
    jsonl.warn(out, previous)
    done = harness.done_ids(previous.records)
    pending = [x for x in runs if x.run_id(s) not in done]
    print(f"plan: {len(subset)} items x {len(a.defenses)} defenses, ratios {ratios}: {len(runs)} runs, "
          f"{len(runs) - len(pending)} already in {out}; {len(pending)} to do in "
          f"{len(harness.groups(pending))} runner invocations", file=sys.stderr)
    rate = harness.seconds_per_run(previous.records)
    if rate and pending:
        median, mean, n = rate
        what = "invocations" if any(r.get("invocation_configs") for r in previous.records) else "runs"
        print(f"estimate: {len(pending)} pending runs x {median:.1f} s (median of {n} {what}; their mean, "
              f"{mean:.1f} s, counts time stopped or shared with other work) = "
              f"{len(pending) * median / 60 / max(1, a.jobs):.0f} min with --jobs {a.jobs}", file=sys.stderr)
    if a.dry_run:
        return 0
    binary = find_runner(a.runner, a.engine)
    if binary is None or not binary.is_file():
        name = ENGINES[a.engine][0]
        print(f"error: {name} not found; build it (cmake --build build --target {name}) or pass --runner / set "
              f"${ENGINES[a.engine][2]}", file=sys.stderr)
        return 2
    if a.limit is not None:
        keep = {x.run_id(s) for x in pending[: a.limit]}
        runs = [x for x in runs if x.run_id(s) in keep]
    stats = harness.execute(runs, out, binary, data.load_attack(data_dir), s, jobs=a.jobs,
                            progress=not a.no_progress, previous=previous)
    print(json.dumps(stats), file=sys.stderr)
    return 0 if stats["error"] == 0 else 1


def cmd_report(a) -> int:
    inputs = a.inputs or [SMALL_OUT]
    records = [r for path in inputs for r in jsonl.read(path)]
    engines = sorted({(r.get("engine", "runner"), r.get("model_name") or "smollm2") for r in records})
    if len(engines) > 1:   # numbers of two engines or models are never averaged together
        print(f"error: the inputs hold runs of {len(engines)} engines/models {engines}: report each on its own",
              file=sys.stderr)
        return 2
    if not a.all_items:
        records, dropped = aggregate.complete_only(records)
        if dropped:
            print(f"left out {len(dropped)} items without every configuration (stopped part-way): {dropped}",
                  file=sys.stderr)
    overhead = jsonl.read(a.overhead) if a.overhead else []
    md = aggregate.report_markdown(records, overhead)
    a.md_out.parent.mkdir(parents=True, exist_ok=True)
    a.md_out.write_text(md + "\n", encoding="utf-8")
    print(f"wrote {a.md_out}", file=sys.stderr)
    if not a.no_plots:
        for path in plots.write_all(records, a.img_dir, a.img_prefix):
            print(f"wrote {path}", file=sys.stderr)
    if a.results_md and a.results_md.is_file():
        begin, end = (BEGIN, END) if a.block is None else (f"<!-- BEGIN GENERATED: {a.block} -->",
                                                           f"<!-- END GENERATED: {a.block} -->")
        text = a.results_md.read_text(encoding="utf-8")
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            a.results_md.write_text(f"{head}{begin}\n{md}\n{end}{tail}", encoding="utf-8")
            print(f"updated {a.results_md}", file=sys.stderr)
        elif a.block is not None:
            print(f"error: {a.results_md} has no block '{a.block}'", file=sys.stderr)
            return 2
    return 0


def cmd_overhead(a) -> int:
    """Each configuration alone (one runner invocation), in interleaved rounds so that a change in the machine's
    load during the measurement hits every variant alike."""
    data_dir = a.data_dir or data.default_data_dir()
    items = data.pick_subset(data.load_items(data_dir), a.subset, a.seed)
    runs = harness.plan(items, data.load_defenses(data_dir), [a.defense], a.policies, a.variants, [a.ratio])
    runs = [r for r in runs if r.ratio > 0 and r.skip is None]
    binary = find_runner(a.runner, a.engine)
    if binary is None or not binary.is_file():
        print(f"error: {ENGINES[a.engine][0]} not found (see `run`)", file=sys.stderr)
        return 2
    s = harness.Settings(max_new_tokens=a.max_new_tokens, threads=a.threads, model=a.model, sinks=a.sinks,
                         boundary=a.boundary, engine=a.engine)
    attack = data.load_attack(data_dir)
    total = len(runs) * a.repeat
    print(f"overhead: {len(items)} items x {len(a.policies)} policies x {len(a.variants)} variants at ratio "
          f"{a.ratio:g}, {a.repeat} rounds: {total} runner invocations", file=sys.stderr)
    bar = None if a.no_progress else harness.progress_bar(total)
    errors = 0
    with jsonl.Writer(a.out, append=False) as w:
        for rep in range(a.repeat):
            for run in runs:
                req = harness.request_for(run, attack, s)
                rec = harness.base_record(run, req, s)
                rec["rep"] = rep
                rec["run_id"] += f"|rep{rep}"   # every repetition is a record of its own
                try:
                    doc, wall = run_runner(binary, req)
                    rec.update(status="ok", wall_s=round(wall, 3), timings_ms=doc.get("timings_ms", {}),
                               decode_tokens=doc.get("decode_tokens"), prefill_tokens=doc.get("prefill_tokens"),
                               system_tokens=doc.get("system_tokens"), threads=doc.get("threads"))
                except (RunnerError, OSError) as e:
                    errors += 1
                    rec.update(status="error", error=str(e)[:500])
                w.write([rec])
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    print(aggregate.overhead_table(jsonl.read(a.out)))
    print(f"wrote {a.out}", file=sys.stderr)
    return 0 if errors == 0 else 1


def cmd_check(a) -> int:
    binary = find_runner(a.runner, a.engine)
    if binary is None or not binary.is_file():
        print(f"{ENGINES[a.engine][0]}: not found", file=sys.stderr)
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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["evidence"]:   # its own parser: tools/pitfalls/evidence.py
        from . import evidence
        return evidence.main(argv[1:])
    if argv[:1] == ["findings"]:   # the numbers docs/results.md quotes: tools/pitfalls/findings.py
        from . import findings
        return findings.main(argv[1:])
    a = build_parser().parse_args(argv)
    return {"run": cmd_run, "report": cmd_report, "overhead": cmd_overhead, "check": cmd_check}[a.cmd](a)
