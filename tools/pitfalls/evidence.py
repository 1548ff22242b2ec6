"""Evidence at 135M (issue 15): what compression does to the model's distribution, measured directly.

For each item and defense order, one runner sweep (per system-turn marking) scores, teacher-forced
(`fairkv-llama --reference --score-only --continuation ...`, docs/llama-runner.md "Scoring"):
- defense strength: log p(the defense's refusal sentence | cache, attack) for every policy x variant x ratio,
  minus the same under the uncompressed cache (the sweep's first configuration, the reference);
- fidelity: mean KL(uncompressed || compressed) of the next-token distributions along the uncompressed greedy
  answer of the attack and of the item's IFEval user turn (`--max-new-tokens` tokens of it).
One JSON line per (item, order, policy, variant, ratio), resumable like `run`. Statistics: percentile bootstrap
95 % intervals resampling items (fixed seed) for every mean, and the composite gain per policy x variant: the mean
over ratios 0.4-0.7 (and both orders) of (variant - plain), distinguishable from zero when its interval excludes 0.

    python3 -m tools.pitfalls evidence run --items 100            # into docs/data/evidence.jsonl, resumable
    python3 -m tools.pitfalls evidence report docs/data/evidence.jsonl --md-out docs/data/evidence_report.md
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Iterable

from . import jsonl
from .aggregate import fmt_ci as fmt_unsigned, instruction_class, variant_label
from .data import REPO_ROOT, default_data_dir, load_attack, load_defenses, load_items, pick_subset
from .harness import POLICIES, VARIANT_SPECS, VARIANTS, Run, Settings, config_for
from .runner import ENGINES, Config, RunnerError, SweepRequest, find_runner, is_budget_error, run_sweep
from .segments import REFUSAL_SENTENCE, build_system_turn, paper_spans
from .stats import bootstrap_ci, mean_ci, percentile, spearman  # noqa: F401  (re-exported: the tests reach them here)

RATIOS = tuple(round(0.1 * i, 1) for i in range(1, 10))
GAIN_RATIOS = (0.4, 0.5, 0.6, 0.7)     # the paper's Table 1 averages over these
DEFENSES = ("standard", "flipped")
METRICS = ("defense_delta", "kl_attack", "kl_task")
# Fewest items for a gain to be called distinguishable from zero: a percentile bootstrap interval lies within the
# items' range and undercovers for few items (two items of the same sign always give an interval excluding 0).
MIN_ITEMS = 10
OUT = REPO_ROOT / "docs" / "data" / "evidence.jsonl"


# ---------------------------------------------------------------------------------------------- statistics

def per_item(records: Iterable[dict], metric: str, policy: str, variant: str, ratios: Iterable[float],
             defenses: Iterable[str] = DEFENSES) -> dict[int, float]:
    """Per item: the mean of `metric` over the given ratios and defense orders, for items that have all of them
    (an item missing one is left out, so every item's value averages the same cells)."""
    want = {(d, round(float(q), 2)) for d in defenses for q in ratios}
    by: dict[int, dict] = {}
    for r in records:
        if r.get("status") == "ok" and r["policy"] == policy and r["variant"] == variant and r.get(metric) is not None:
            cell = (r["defense"], round(float(r["ratio"]), 2))
            if cell in want:
                by.setdefault(r["key"], {})[cell] = r[metric]
    return {k: statistics.fmean(v.values()) for k, v in by.items() if set(v) == want}


def composite_gain(records: list[dict], metric: str, policy: str, variant: str, sign: float = 1.0,
                   ratios: Iterable[float] = GAIN_RATIOS, defenses: Iterable[str] = DEFENSES,
                   n: int = 2000, seed: int = 0, min_items: int = MIN_ITEMS) -> dict | None:
    """sign x (variant - plain) of `metric`, per item averaged over `ratios` and `defenses`, then the mean over
    the items both have, with its bootstrap interval (items resampled). sign = -1 for KL (lower is better).
    `distinguishable`: at least min_items items and the interval excludes 0."""
    ratios = tuple(ratios)
    v = per_item(records, metric, policy, variant, ratios, defenses)
    p = per_item(records, metric, policy, "plain", ratios, defenses)
    keys = sorted(set(v) & set(p))
    if not keys:
        return None
    diffs = [sign * (v[k] - p[k]) for k in keys]
    m, lo, hi = mean_ci(diffs, n, seed)
    return {"gain": m, "low": lo, "high": hi, "items": len(keys),
            "distinguishable": len(keys) >= max(2, min_items) and (lo > 0 or hi < 0)}


# ------------------------------------------------------------------------------------------------ the sweep

def plan_configs(item, defense: str, defenses_json: dict, policies, variants, ratios, s: Settings):
    """[(marked system text, [(policy, variant, ratio, Config)])]: the configurations of one item and order,
    grouped by system-turn marking (fair_paper marks the paper's two spans; the text is the same)."""
    turn = build_system_turn(item.system, defense, defenses_json)
    groups: dict[str, list] = {}
    for v in variants:
        vturn = paper_spans(turn) if VARIANT_SPECS[v].fair_mode == "paper" else turn
        for p in policies:
            for q in ratios:
                groups.setdefault(vturn.marked, []).append((p, v, q, config_for(Run(item, vturn, p, v, q), s)))
    return turn, list(groups.items())


def run_id(key: int, defense: str, policy: str, variant: str, ratio: float, s: Settings) -> str:
    return (f"{key}|{defense}|{policy}|{variant}|{ratio:.2f}|w{s.window}|n{s.max_new_tokens}|s{s.sinks}|b{s.boundary}"
            f"{s.tag()}")


def sweep_args(turns: tuple[str, ...] = ("leak", "task")) -> list[str]:
    """What the evidence sweep adds to the engine's command line: the refusal after the attack, none after the
    task; the first configuration is the uncompressed reference; only scores."""
    cont = []
    for t in turns:
        cont += ["--continuation", REFUSAL_SENTENCE if t == "leak" else ""]
    return cont + ["--reference", "--score-only"]


def records_of(item, defense: str, turn, entries, docs, wall: float, s: Settings) -> list[dict]:
    ref = docs[0]
    ref_lp = ref["turns"][0]["continuation_logprob"]
    out = []
    for (p, v, q, _), doc in zip(entries, docs[1:]):
        rec = {"run_id": run_id(item.key, defense, p, v, q, s), "key": item.key, "multi": item.multi,
               "defense": defense, "policy": p, "variant": v, "ratio": q, "window": s.window,
               "max_new_tokens": s.max_new_tokens, "sinks": s.sinks, "boundary": s.boundary,
               "engine": s.engine, "model_name": s.model,
               "invocation_wall_s": round(wall, 3), "invocation_configs": len(docs)}
        if isinstance(doc, Exception):
            rec.update(status="infeasible" if is_budget_error(doc) else "error",
                       error=str(doc)[:300])
        else:
            t0 = doc["turns"][0]
            t1 = doc["turns"][1] if len(doc["turns"]) > 1 else None  # the task's turn, when asked
            rec.update(status="ok", defense_logprob=t0["continuation_logprob"], defense_logprob_ref=ref_lp,
                       defense_delta=t0["continuation_logprob"] - ref_lp,
                       defense_logprobs=t0["continuation_logprobs"],
                       kl_attack=t0["kl_mean"], kl_task=t1["kl_mean"] if t1 else None,
                       kl_tokens=[len(t["kl_per_token"]) for t in doc["turns"]],
                       kept={g["name"]: g["kept_fraction"] for g in doc["segments"]})
        rec["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        out.append(rec)
    return out


def run_one(binary: Path, item, defense: str, defenses_json: dict, attack: str, policies, variants, ratios,
            s: Settings, done: set[str]) -> tuple[list[dict], float]:
    turn, groups = plan_configs(item, defense, defenses_json, policies, variants, ratios, s)
    recs, wall_total = [], 0.0
    for marked, entries in groups:
        if all(run_id(item.key, defense, p, v, q, s) in done for p, v, q, _ in entries):
            continue
        users = tuple({"leak": attack, "task": item.user}[t] for t in s.turns)
        req = SweepRequest(marked, users, (Config("none", 0.0, False, ()),) + tuple(c for *_, c in entries),
                           window=s.window, max_new_tokens=s.max_new_tokens, threads=s.threads,
                           max_batch=s.max_batch, model=s.model)
        docs, wall = run_sweep(binary, req, extra_args=sweep_args(s.turns))
        wall_total += wall
        if isinstance(docs[0], Exception):
            raise docs[0]
        recs += records_of(item, defense, turn, entries, docs, wall, s)
    return recs, wall_total


def cmd_run(a) -> int:
    data_dir = a.data_dir or default_data_dir()
    all_items = load_items(data_dir)
    if a.keys:
        by_key = {i.key: i for i in all_items}
        missing = [k for k in a.keys if k not in by_key]
        if missing:
            print(f"error: no item with key {missing[0]} in {data_dir / 'sys_ifeval.jsonl'}", file=sys.stderr)
            return 2
        items = [by_key[k] for k in a.keys]
    elif a.first is not None:
        items = all_items[: a.first]
    else:
        items = pick_subset(all_items, a.items, a.seed)
    defenses_json, attack = load_defenses(data_dir), load_attack(data_dir)
    s = Settings(window=a.window, max_new_tokens=a.max_new_tokens, threads=a.threads, model=a.model,
                 max_batch=a.max_batch, sinks=a.sinks, boundary=a.boundary, engine=a.engine, turns=tuple(a.turns))
    if "leak" not in s.turns:
        print("error: --turns must include leak (the defense's log-probability is scored after the attack)",
              file=sys.stderr)
        return 2
    binary = find_runner(a.runner, a.engine)
    if binary is None or not binary.is_file():
        print(f"error: {ENGINES[a.engine][0]} not found (build it, or pass --runner)", file=sys.stderr)
        return 2
    previous = jsonl.scan(a.out)
    jsonl.warn(a.out, previous)
    done = {r["run_id"] for r in previous.records if r.get("status") in ("ok", "infeasible")}
    t0 = time.monotonic()
    errors = 0
    with jsonl.Writer(a.out) as w:
        for n, item in enumerate(items, 1):
            for d in a.defenses:
                if a.deadline and time.time() > a.deadline:
                    break
                try:
                    recs, wall = run_one(binary, item, d, defenses_json, attack, a.policies, a.variants, a.ratios,
                                         s, done)
                except (RunnerError, OSError) as e:
                    errors += 1
                    print(f"\nitem {item.key} {d}: {e}", file=sys.stderr)
                    continue
                w.write(recs)
                if recs:
                    print(f"item {item.key} {d}: {len(recs)} configurations in {wall:.0f} s", file=sys.stderr)
            print(f"{n}/{len(items)} items, {time.monotonic() - t0:.0f} s", file=sys.stderr)
            if a.deadline and time.time() > a.deadline:
                print("deadline reached: stopping (resume with the same command)", file=sys.stderr)
                break
    print(f"done in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0 if errors == 0 else 1


# ------------------------------------------------------------------------------------------------ the report

def cells(records: list[dict], metric: str, defense: str | None, policy: str, variant: str,
          ratio: float) -> list[float]:
    return [r[metric] for r in records if r.get("status") == "ok" and r["policy"] == policy and
            r["variant"] == variant and abs(r["ratio"] - ratio) < 1e-9 and (defense is None or r["defense"] == defense)
            and r.get(metric) is not None]


def fmt_ci(m, lo, hi, digits: int = 2) -> str:
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def axes(records: list[dict]) -> tuple[list, list, list, list]:
    ok = [r for r in records if r.get("status") == "ok"]
    order = lambda xs, ref: [x for x in ref if x in xs] + sorted(x for x in xs if x not in ref)  # noqa: E731
    return (order({r["policy"] for r in ok}, POLICIES), order({r["variant"] for r in ok}, VARIANTS),
            sorted({r["ratio"] for r in ok}), order({r["defense"] for r in ok}, DEFENSES))


def metric_table(records, metric, defense, ratios_shown, digits=2) -> str:
    pols, vars_, _, _ = axes(records)
    head = "| policy | variant | " + " | ".join(f"{q:g}" for q in ratios_shown) + " |"
    lines = [head, "|---|---|" + "---|" * len(ratios_shown)]
    for p in pols:
        for v in vars_:
            row = []
            for q in ratios_shown:
                xs = cells(records, metric, defense, p, v, q)
                row.append(fmt_ci(*mean_ci(xs), digits) if xs else "-")
            lines.append(f"| {p} | {v} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def gain_table(records) -> str:
    pols, vars_, _, defs = axes(records)
    lines = ["| policy | variant | items | defense log-prob gain [95% CI] | | −KL gain, attack [95% CI] | | "
             "−KL gain, task [95% CI] | |", "|---|---|---|---|---|---|---|---|---|"]
    for p in pols:
        for v in vars_:
            if v == "plain":
                continue
            row = [p, v]
            n = None
            for metric, sign in (("defense_delta", 1.0), ("kl_attack", -1.0), ("kl_task", -1.0)):
                g = composite_gain(records, metric, p, v, sign, defenses=defs)
                if g is None:
                    row += ["-", ""]
                    continue
                n = g["items"]
                flag = ("≠ 0" if g["distinguishable"] else "~ 0") if g["items"] >= MIN_ITEMS else \
                    f"n < {MIN_ITEMS}" + (" (excl. 0)" if g["low"] > 0 or g["high"] < 0 else "")
                row += [fmt_ci(g["gain"], g["low"], g["high"], 3), flag]
            lines.append("| " + " | ".join(row[:2] + [str(n or "-")] + row[2:]) + " |")
    return "\n".join(lines)


def kept_table(records, defense) -> str:
    """Kept fractions of the defense and of the instructions (fair_paper: the system-prompt span), per item the
    mean over its records of the cell, then the mean over items [95% CI]."""
    pols, vars_, ratios, _ = axes(records)
    shown = [q for q in ratios if q in (0.3, 0.5, 0.7, 0.9)]
    lines = ["| policy | variant | " + " | ".join(f"{q:g} (def / instr)" for q in shown) + " |",
             "|---|---|" + "---|" * len(shown)]

    def ci(rs, seg_of) -> str:
        by: dict[int, list[float]] = {}
        for r in rs:
            x = seg_of(r["kept"])
            if x is not None:
                by.setdefault(r["key"], []).append(x)
        return fmt_unsigned(mean_ci([statistics.fmean(v) for v in by.values()]), 2) if by else "-"

    for p in pols:
        for v in vars_:
            row = []
            for q in shown:
                rs = [r for r in records if r.get("status") == "ok" and r["policy"] == p and r["variant"] == v and
                      abs(r["ratio"] - q) < 1e-9 and r["defense"] == defense]
                row.append(ci(rs, lambda k: k.get("defense")) + " / " +
                           ci(rs, lambda k: k.get("instructions", k.get("system_prompt"))))
            lines.append(f"| {p} | {v} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def class_kl(records: list[dict], classes_of: dict[int, list[str]], ratios: Iterable[float] = (0.5, 0.9),
             variant: str = "plain", metric: str = "kl_task") -> dict[tuple[str, str], dict[float, list[float]]]:
    """(group, class) -> {ratio: per-item values}: the IFEval turn's KL of each item whose instructions include
    the class (once per item, however many of its instructions share the class), the item's value being the mean
    over every policy and defense order of `variant` at that ratio. Only items with all of those cells count, so
    every value averages the same configurations. group: "single" or "multi" (one vs several instructions).
    Items missing from classes_of are left out."""
    out: dict[tuple[str, str], dict[float, list[float]]] = {}
    for q in ratios:
        rs = [r for r in records if r.get("status") == "ok" and r["variant"] == variant and
              abs(r["ratio"] - q) < 1e-9 and r.get(metric) is not None]
        want = {(r["policy"], r["defense"]) for r in rs}
        by: dict[int, dict] = {}
        for r in rs:
            by.setdefault(r["key"], {})[(r["policy"], r["defense"])] = r[metric]
        for key, cellv in sorted(by.items()):
            if set(cellv) != want or key not in classes_of:
                continue
            ids = classes_of[key]
            group = "multi" if len(ids) > 1 else "single"
            value = statistics.fmean(cellv.values())
            for cls in sorted({instruction_class(i) for i in ids}):
                out.setdefault((group, cls), {}).setdefault(q, []).append(value)
    return out


def class_kl_correlation(per_class: dict[tuple[str, str], dict[float, list[float]]], ratio: float) -> dict:
    """Spearman rank correlation, across the classes present in both groups, of the mean KL at `ratio` in
    single- vs multi-instruction items (do the same classes degrade most in both settings?)."""
    classes = sorted({c for g, c in per_class if g == "single"} & {c for g, c in per_class if g == "multi"})
    classes = [c for c in classes if per_class[("single", c)].get(ratio) and per_class[("multi", c)].get(ratio)]
    xs = [statistics.fmean(per_class[("single", c)][ratio]) for c in classes]
    ys = [statistics.fmean(per_class[("multi", c)][ratio]) for c in classes]
    out = {"n_classes": len(classes), "rho": None, "p": None}
    out["rho"], out["p"] = spearman(xs, ys)
    return out


def class_kl_table(records: list[dict], classes_of: dict[int, list[str]], ratios=(0.5, 0.9)) -> str:
    per_class = class_kl(records, classes_of, ratios)
    lines = ["| items | class | " + " | ".join(f"KL at {q:g} [95% CI] (items)" for q in ratios) + " |",
             "|---|---|" + "---|" * len(ratios)]
    for g in ("single", "multi"):
        for (grp, cls), by_q in sorted(per_class.items()):
            if grp != g:
                continue
            row = []
            for q in ratios:
                xs = by_q.get(q)
                row.append("-" if not xs else f"{fmt_unsigned(mean_ci(xs), 3)} ({len(xs)})")
            lines.append(f"| {g} | {cls} | " + " | ".join(row) + " |")
    c = class_kl_correlation(per_class, max(ratios))
    rho = "undefined (fewer than 3 classes in both groups, or constant means)" if c["rho"] is None else \
        f"rho = {c['rho']:+.3f} (p = {c['p']:.3f})"
    lines.append(f"\nSpearman rank correlation of the per-class mean KL at {max(ratios):g}, single- vs "
                 f"multi-instruction items: {rho} over {c['n_classes']} classes.")
    return "\n".join(lines)


def report_markdown(records: list[dict], classes_of: dict[int, list[str]] | None = None) -> str:
    pols, vars_, ratios, defs = axes(records)
    ok = [r for r in records if r.get("status") == "ok"]
    items = sorted({r["key"] for r in ok})
    ref = statistics.fmean(r["defense_logprob_ref"] for r in ok) if ok else float("nan")
    out = [f"{len(items)} items x {len(defs)} defense orders ({', '.join(defs)}) x {len(pols)} policies x "
           f"{len(vars_)} variants x ratios {', '.join(f'{q:g}' for q in ratios)}: {len(ok)} scored configurations "
           f"({sum(r.get('status') == 'infeasible' for r in records)} infeasible). Mean uncompressed log p(refusal | "
           f"attack) = {ref:.2f} nats. Intervals: percentile bootstrap over items, 2000 resamples, seed 0."]
    for d in defs:
        out += [f"\n**Defense strength, {d} defense**: log p(refusal | compressed) − log p(refusal | uncompressed), "
                "nats, mean [95% CI]\n", metric_table(records, "defense_delta", d, ratios)]
    for metric, what in (("kl_attack", "the attack's"), ("kl_task", "the IFEval turn's")):
        out += [f"\n**Fidelity, {what} answer**: mean KL(uncompressed ‖ compressed) per token, nats, both orders "
                "pooled, mean [95% CI]\n", metric_table(records, metric, None, ratios, 3)]
    out += ["\n**Composite gain** (Table-1 style): per item, the mean over ratios 0.4–0.7 and both orders of "
            "(variant − plain); mean over items [95% CI]; `≠ 0` where the interval excludes 0 with at least "
            f"{MIN_ITEMS} items (`n < {MIN_ITEMS}`: too few items to call; `(excl. 0)` says its interval excludes 0 "
            "anyway). −KL: lower KL counts as a gain.\n", gain_table(records)]
    if classes_of:
        out += ["\n**Fidelity per instruction class** (pitfall 1): KL(uncompressed ‖ compressed) along the IFEval "
                "turn's uncompressed answer, per item the mean over the plain policies and both orders, then the "
                "mean over the items whose instructions include the class [95% CI] (items; an item with several "
                "classes counts in each)\n", class_kl_table(records, classes_of)]
    for d in defs:
        out += [f"\n**Kept fraction** (defense / instructions; fair_paper: the system-prompt span), {d} defense, "
                "mean over items [95% CI]\n",
                kept_table(records, d)]
    return "\n".join(out)


def write_plots(records: list[dict], img_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import STYLES

    pols, vars_, ratios, defs = axes(records)
    img_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    def grid_fig(rows, metric_of, ylabel, name, title, row_label):
        fig, axs = plt.subplots(len(rows), len(pols), figsize=(3.2 * len(pols), 2.6 * len(rows) + 0.5),
                                squeeze=False, sharex=True, sharey="row")
        for i, row in enumerate(rows):
            for j, p in enumerate(pols):
                a = axs[i][j]
                for v in vars_:
                    pts = [(q, metric_of(row, p, v, q)) for q in ratios]
                    pts = [(q, y) for q, y in pts if y is not None]
                    if pts:
                        a.plot([q for q, _ in pts], [y for _, y in pts], linestyle=STYLES.get(v, "-"), marker="o",
                               ms=2.5, label=v)
                a.axhline(0, color="grey", lw=0.5)
                a.set_title(f"{p}, {row_label(row)}", fontsize=8)
                a.grid(True, alpha=0.3)
                if i == len(rows) - 1:
                    a.set_xlabel("compression ratio")
                if j == 0:
                    a.set_ylabel(ylabel, fontsize=8)
        axs[0][0].legend(fontsize=6)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path = img_dir / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    def mean_of(metric, d):
        def f(p, v, q):
            xs = cells(records, metric, d, p, v, q)
            return statistics.fmean(xs) if xs else None
        return f

    grid_fig(defs, lambda d, p, v, q: mean_of("defense_delta", d)(p, v, q), "Δ log p(refusal), nats",
             "evidence_defense_logprob.png", "Defense strength: log p(refusal | compressed) − uncompressed",
             lambda d: f"{d} defense")
    grid_fig(["kl_attack", "kl_task"], lambda m, p, v, q: mean_of(m, None)(p, v, q), "KL, nats/token",
             "evidence_kl.png", "Fidelity: KL(uncompressed ‖ compressed) along the uncompressed answer",
             lambda m: "attack" if m == "kl_attack" else "IFEval turn")

    def kept_of(seg, d):
        def f(p, v, q):
            xs = [r["kept"].get(seg, r["kept"].get("system_prompt") if seg == "instructions" else None)
                  for r in records if r.get("status") == "ok" and r["policy"] == p and r["variant"] == v and
                  abs(r["ratio"] - q) < 1e-9 and r["defense"] == d]
            xs = [x for x in xs if x is not None]
            return statistics.fmean(xs) if xs else None
        return f

    rows = [(seg, d) for d in defs for seg in ("defense", "instructions")]
    grid_fig(rows, lambda row, p, v, q: kept_of(*row)(p, v, q), "kept fraction", "evidence_kept_fraction.png",
             "Kept fraction per segment", lambda row: f"{row[0]}, {row[1]} defense")
    return paths


def cmd_report(a) -> int:
    records = [r for path in a.inputs for r in jsonl.read(path)]
    latest: dict[str, dict] = {}
    for r in records:
        latest[r["run_id"]] = r
    records = list(latest.values())
    data_dir = a.data_dir or default_data_dir()
    try:
        classes_of = {i.key: i.instruction_id_list for i in load_items(data_dir)}
    except FileNotFoundError:
        print(f"note: {data_dir / 'sys_ifeval.jsonl'} not found: no per-class table", file=sys.stderr)
        classes_of = None
    md = report_markdown(records, classes_of)
    if a.md_out:
        a.md_out.parent.mkdir(parents=True, exist_ok=True)
        a.md_out.write_text(md + "\n", encoding="utf-8")
        print(f"wrote {a.md_out}", file=sys.stderr)
    else:
        print(md)
    if not a.no_plots:
        for p in write_plots(records, a.img_dir):
            print(f"wrote {p}", file=sys.stderr)
    return 0


# ------------------------------------------- intervals for the greedy runs of `run` (docs/data/pitfalls_small.jsonl)

GREEDY_METRICS = {
    "leakage ROUGE-L recall": lambda r: r["leak"]["rougeL_recall_system"],
    "refusal rate": lambda r: 1.0 if r["leak"]["refusal"] else 0.0,
    "IFEval strict (instruction level)": lambda r: statistics.fmean(1.0 if x else 0.0 for x in r["ifeval"]["strict"]),
}


def greedy_item_means(records: list[dict], variant: str, metric) -> dict[int, float]:
    """Per item: the mean of metric over the item's answered runs of the variant (aggregate.variant_label: runs of
    other settings, e.g. `fair [sinks 0]`, are their own variant) at ratios > 0 (every policy, both orders, the
    latest record of each run); variant 'uncompressed': its ratio-0 runs."""
    latest: dict[str, dict] = {}
    for r in records:
        latest[r["run_id"]] = r
    by: dict[int, list[float]] = {}
    for r in latest.values():
        if r.get("status") != "ok":
            continue
        if (variant == "uncompressed" and r["ratio"] == 0) or (r["ratio"] > 0 and variant_label(r) == variant):
            by.setdefault(r["key"], []).append(metric(r))
    return {k: statistics.fmean(v) for k, v in by.items()}


def greedy_summary(records: list[dict]) -> str:
    """The summary of `run`'s greedy metrics per variant, as means over items with bootstrap 95 % intervals."""
    labels = {variant_label(r) for r in records if r.get("ratio", 0) > 0}
    variants = ["uncompressed"] + [v for v in VARIANTS if v in labels] + sorted(labels - set(VARIANTS))
    lines = ["| variant (ratios > 0, all policies, both orders) | items | " + " | ".join(GREEDY_METRICS) + " |",
             "|---|---|" + "---|" * len(GREEDY_METRICS)]
    for v in variants:
        row, n = [], 0
        for f in GREEDY_METRICS.values():
            m = greedy_item_means(records, v, f)
            n = max(n, len(m))
            row.append(fmt_ci(*mean_ci(list(m.values())), 3) if m else "-")
        lines.append(f"| {v} | {n} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def cmd_greedy(a) -> int:
    print(greedy_summary([r for path in a.inputs for r in jsonl.read(path)]))
    return 0


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m tools.pitfalls evidence", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="score every policy x variant x ratio against the uncompressed reference")
    r.add_argument("--items", type=int, default=100)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--keys", type=lambda s: [int(x) for x in _csv(s)], default=None,
                   help="these items, in this order, instead of the --items subset: split a sweep between processes "
                        "(each with its own --out and --threads), then concatenate their JSONL")
    r.add_argument("--ratios", type=lambda s: [float(x) for x in _csv(s)], default=list(RATIOS))
    r.add_argument("--policies", type=_csv, default=list(POLICIES))
    r.add_argument("--variants", type=_csv, default=list(VARIANTS))
    r.add_argument("--defenses", type=_csv, default=list(DEFENSES))
    r.add_argument("--max-new-tokens", type=int, default=32,
                   help="tokens of the uncompressed answers the KL runs along (default 32)")
    r.add_argument("--window", type=int, default=16)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--max-batch", type=int, default=64)
    r.add_argument("--sinks", type=int, default=4)
    r.add_argument("--boundary", type=int, default=2)
    r.add_argument("--engine", choices=tuple(ENGINES), default="runner",
                   help="runner: fairkv-llama; llamacpp: fairkv-llamacpp (fairkv inside llama.cpp)")
    r.add_argument("--runner", default=None, help="the engine's binary (default: found in build*/)")
    r.add_argument("--model", default=None, help="GGUF path or model name (smollm2, qwen1.5b)")
    r.add_argument("--first", type=int, default=None, help="the first N items in file order (instead of --items)")
    r.add_argument("--turns", type=_csv, default=["leak", "task"],
                   help="user turns: leak (the attack: defense log-prob and KL) and task (KL along the item's "
                        "task answer); default both")
    r.add_argument("--data-dir", type=Path, default=None)
    r.add_argument("--out", type=Path, default=OUT)
    r.add_argument("--deadline", type=float, default=None, help="unix time: start no sweep after it (the one running finishes; resume later)")
    p = sub.add_parser("report", help="markdown tables with bootstrap intervals, and PNG plots")
    p.add_argument("inputs", nargs="+", type=Path)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--img-dir", type=Path, default=REPO_ROOT / "docs" / "img")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--data-dir", type=Path, default=None, help="sys_ifeval.jsonl's folder, for the instruction "
                   "classes (default: the harness's)")
    g = sub.add_parser("greedy-ci", help="bootstrap intervals for the summary of `run`'s greedy answers")
    g.add_argument("inputs", nargs="+", type=Path)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    for bad in (set(getattr(a, "policies", [])) - set(POLICIES)) | (set(getattr(a, "variants", [])) - set(VARIANTS)):
        print(f"error: unknown policy or variant {bad!r}", file=sys.stderr)
        return 2
    return {"run": cmd_run, "report": cmd_report, "greedy-ci": cmd_greedy}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
