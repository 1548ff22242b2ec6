"""JSONL records -> per-cell means, class accuracies, rank correlation, overhead; markdown tables."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Iterable

from .harness import DONE, VARIANT_SPECS, VARIANTS as VARIANT_ORDER, Settings
from .segments import SYSTEM_PROMPT

SEGMENTS = ("defense", "instructions", "preamble", SYSTEM_PROMPT)
DEFAULTS = Settings()


def latest(records: Iterable[dict]) -> dict[str, dict]:
    """The last record of each run id (a rerun after an error supersedes it)."""
    out: dict[str, dict] = {}
    for r in records:
        out[r["run_id"]] = r
    return out


def ok_records(records: Iterable[dict]) -> list[dict]:
    return [r for r in latest(records).values() if r.get("status") == "ok"]


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(xs) if xs else None


def variant_label(r: dict) -> str:
    """The variant, marked where the record's settings are not the harness's defaults, so that runs of different
    settings in one JSONL are not averaged together: a whitelist of the whole defense (not the default refusal
    sentence), other attention sinks or another boundary. Fair runs recorded before the runner had these options
    (no `sinks` field) were proportional with no sinks and no boundary: `fair [sinks 0]`."""
    label = r["variant"] + (" [whole defense]" if r.get("whitelist_mode") == "defense" else "")
    spec = VARIANT_SPECS.get(r["variant"])
    if r.get("fair") and spec is not None:
        sinks = r.get("sinks") or 0
        boundary = r.get("boundary") or 0
        if sinks != spec.sinks(DEFAULTS):
            label += f" [sinks {sinks}]"
        if boundary != (DEFAULTS.boundary if spec.boundary else 0):
            label += f" [boundary {boundary}]"
    return label


def kept_of(r: dict, segment: str) -> float | None:
    """The kept fraction of one segment in one record. Paper mode (fair_paper) marks two spans only, the defense
    and the system prompt (preamble + instructions): its instructions figure is that whole span's. Records with
    separate preamble and instructions give the system-prompt span as their token-weighted mean."""
    kept = r.get("kept") or {}
    if segment in kept:
        return kept[segment]
    if segment == "instructions":
        return kept.get(SYSTEM_PROMPT)
    if segment == SYSTEM_PROMPT:
        parts = [g for g in r.get("segments") or [] if g.get("name") in ("preamble", "instructions")]
        n = sum(g.get("tokens") or 0 for g in parts)
        if len(parts) == 2 and n and all(g.get("kept_fraction") is not None for g in parts):
            return sum(g["kept_fraction"] * g["tokens"] for g in parts) / n
    return None


def axes(records: list[dict]) -> dict[str, list]:
    order = ("knorm", "streaming_llm", "snapkv", "tova", "h2o")   # the paper's
    pol = sorted({r["policy"] for r in records if r["policy"] != "none"},
                 key=lambda p: (order.index(p) if p in order else 9, p))
    labels = {variant_label(r) for r in records if float(r["ratio"]) > 0}
    var = sorted(labels, key=lambda v: (VARIANT_ORDER.index(v.split(" ")[0]) if v.split(" ")[0] in VARIANT_ORDER
                                        else 9, v))
    return {"defense": sorted({r["defense"] for r in records}, key=lambda d: ["standard", "flipped", "none"].index(d)
                              if d in ("standard", "flipped", "none") else 9),
            "policy": pol, "variant": var or ["plain"], "ratio": sorted({float(r["ratio"]) for r in records})}


def cell(records: list[dict], defense: str, policy: str, variant: str, ratio: float) -> list[dict]:
    """Records of one (defense, policy, variant, ratio); at ratio 0 the shared uncompressed baseline."""
    if ratio == 0.0:
        return [r for r in records if r["defense"] == defense and float(r["ratio"]) == 0.0]
    return [r for r in records if r["defense"] == defense and r["policy"] == policy
            and variant_label(r) == variant and abs(float(r["ratio"]) - ratio) < 1e-9]


def summarize(rs: list[dict]) -> dict:
    """Means over the runs of one cell. IFEval accuracy is instruction-level (strict and loose) and
    prompt-level strict (all instructions of the item followed)."""
    if not rs:
        return {"n": 0}
    strict = [x for r in rs for x in r["ifeval"]["strict"]]
    loose = [x for r in rs for x in r["ifeval"]["loose"]]
    t = lambda k: _mean([r.get("timings_ms", {}).get(k) for r in rs])  # noqa: E731
    dec_tok = _mean([r["timings_ms"]["decode"] / r["decode_tokens"] for r in rs
                     if r.get("decode_tokens") and r.get("timings_ms", {}).get("decode") is not None])
    return {
        "n": len(rs),
        "leak_system": _mean([r["leak"]["rougeL_recall_system"] for r in rs]),
        "leak_defended": _mean([r["leak"]["rougeL_recall_defended"] for r in rs]),
        "refusal": _mean([1.0 if r["leak"]["refusal"] else 0.0 for r in rs]),
        "ifeval_strict": _mean([1.0 if x else 0.0 for x in strict]),
        "ifeval_loose": _mean([1.0 if x else 0.0 for x in loose]),
        "ifeval_prompt_strict": _mean([1.0 if all(r["ifeval"]["strict"]) else 0.0 for r in rs]),
        "kept": {s: _mean([kept_of(r, s) for r in rs]) for s in SEGMENTS},
        "compress_ms": t("compress"), "prefill_ms": t("prefill"), "decode_ms": t("decode"),
        "decode_ms_per_token": dec_tok,
    }


def grid(records: list[dict]) -> dict[tuple, dict]:
    """summarize() for every (defense, policy, variant, ratio) present (ratio 0 = baseline)."""
    ax = axes(records)
    return {(d, p, v, q): summarize(cell(records, d, p, v, q))
            for d in ax["defense"] for p in ax["policy"] for v in ax["variant"] for q in ax["ratio"]}


def complete_only(records: Iterable[dict]) -> tuple[list[dict], list[int]]:
    """Keep the items that have a finished run (answered or infeasible) for every configuration any item
    has, so that every cell averages over the same items when a sweep was stopped part-way. Their runs that do
    not apply (recorded, never run) are kept too."""
    last = latest(records).values()
    done = [r for r in last if r.get("status") in ("ok", "infeasible")]
    confs: dict[int, set] = defaultdict(set)
    for r in done:
        confs[r["key"]].add((r["defense"], r["policy"], variant_label(r), float(r["ratio"])))
    union = set().union(*confs.values()) if confs else set()
    keep = {k for k, c in confs.items() if c == union}
    dropped = sorted(k for k in confs if k not in keep)
    return [r for r in last if r.get("status") in DONE and r["key"] in keep], dropped


def with_status(records: Iterable[dict], status: str) -> list[dict]:
    return [r for r in latest(records).values() if r.get("status") == status]


def infeasible(records: Iterable[dict]) -> list[dict]:
    return with_status(records, "infeasible")


# ------------------------------------------------------------------------- instruction classes

def instruction_class(instruction_id: str) -> str:
    return instruction_id.split(":", 1)[0]


def class_accuracy(records: list[dict], variant: str = "plain") -> dict[tuple[str, str, float], tuple[float, int]]:
    """(group, class, ratio) -> (strict accuracy, instruction count), pooled over policies and defenses;
    group is "single" or "multi" (items with one vs several instructions)."""
    acc: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    for r in records:
        if float(r["ratio"]) != 0.0 and variant_label(r) != variant:
            continue
        group = "multi" if len(r["instruction_id_list"]) > 1 else "single"
        for iid, ok in zip(r["instruction_id_list"], r["ifeval"]["strict"]):
            acc[(group, instruction_class(iid), float(r["ratio"]))].append(bool(ok))
    return {k: (sum(v) / len(v), len(v)) for k, v in acc.items()}


def degradation_correlation(records: list[dict], variant: str = "plain") -> dict:
    """Spearman rank correlation, across instruction classes, of the accuracy drop from ratio 0 to the
    highest ratio in single-instruction items vs multi-instruction items (the paper's question: do the
    same instructions break first in both settings?)."""
    from scipy.stats import spearmanr

    ca = class_accuracy(records, variant)
    ratios = sorted({k[2] for k in ca})
    out = {"n_classes": 0, "rho": None, "p": None, "hi_ratio": ratios[-1] if ratios else None, "classes": {}}
    if len(ratios) < 2 or ratios[0] != 0.0:
        return out
    lo, hi = 0.0, ratios[-1]
    for cls in sorted({k[1] for k in ca}):
        drops = {}
        for g in ("single", "multi"):
            if (g, cls, lo) in ca and (g, cls, hi) in ca:
                drops[g] = ca[(g, cls, lo)][0] - ca[(g, cls, hi)][0]
        if len(drops) == 2:
            out["classes"][cls] = drops
    xs = [v["single"] for v in out["classes"].values()]
    ys = [v["multi"] for v in out["classes"].values()]
    out["n_classes"] = len(xs)
    if len(xs) >= 3 and len(set(xs)) > 1 and len(set(ys)) > 1:
        res = spearmanr(xs, ys)
        out["rho"], out["p"] = float(res.statistic), float(res.pvalue)
    return out


# --------------------------------------------------------------------------------- markdown

def fmt(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def metric_table(g: dict, ax: dict, defense: str, key: str, digits: int = 3) -> str:
    rows = []
    for p in ax["policy"]:
        for v in ax["variant"]:
            cells = [fmt(g[(defense, p, v, q)].get(key), digits) for q in ax["ratio"]]
            rows.append([p, v] + cells)
    return _table(["policy", "variant"] + [f"{q:g}" for q in ax["ratio"]], rows)


KEPT_NOTE = ("fair_paper marks two spans only (paper mode): its instructions figure (also in the summary's gap) is "
             "the kept fraction of the whole system-prompt span, preamble + instructions.")


def kept_table(g: dict, ax: dict, defense: str) -> str:
    rows = []
    for p in ax["policy"]:
        for v in ax["variant"]:
            cells = []
            for q in ax["ratio"]:
                k = g[(defense, p, v, q)].get("kept") or {}
                cells.append(f"{fmt(k.get('defense'), 2)} / {fmt(k.get('instructions'), 2)}")
            rows.append([p, v] + cells)
    return _table(["policy", "variant"] + [f"{q:g} (def / instr)" for q in ax["ratio"]], rows)


def overhead_table(records: list[dict]) -> str:
    """Compression time and decode time per token by policy and variant (medians over the answered runs with
    ratio > 0), relative to plain. Only runs timed alone (`python3 -m tools.pitfalls overhead`) belong here:
    in a sweep the decode steps are shared between configurations."""
    by: dict[tuple, list[dict]] = defaultdict(list)
    ok = ok_records(records)
    for r in ok:
        if float(r["ratio"]) > 0:
            by[(r["policy"], variant_label(r))].append(r)
    ax = axes(ok) if ok else {"policy": [], "variant": []}
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    rel = lambda a, b: "–" if a is None or not b else f"{100.0 * (a / b - 1.0):+.1f}%"  # noqa: E731
    rows = []
    for p in ax["policy"]:
        base = (None, None)
        for v in [x for x in ax["variant"] if (p, x) in by]:
            rs = by[(p, v)]
            comp = med([r["timings_ms"]["compress"] for r in rs if r.get("timings_ms", {}).get("compress") is not None])
            dec = med([r["timings_ms"]["decode"] / r["decode_tokens"] for r in rs
                       if r.get("decode_tokens") and r.get("timings_ms", {}).get("decode") is not None])
            if v == "plain":
                base = (comp, dec)
            rows.append([p, v, str(len(rs)), fmt(comp, 2), rel(comp, base[0]), fmt(dec, 2), rel(dec, base[1])])
    return _table(["policy", "variant", "runs", "compress ms", "vs plain", "decode ms/token", "vs plain"], rows)


def summary_table(g: dict, ax: dict) -> str:
    """One row per variant: cell means pooled (equally weighted) over policies, defenses and ratios > 0;
    the first row is the uncompressed baseline."""
    def pooled(cells, key):
        return _mean([c.get(key) for c in cells])

    def gap(cells):
        return _mean([abs(c["kept"]["defense"] - c["kept"]["instructions"]) for c in cells
                      if c.get("kept") and c["kept"].get("defense") is not None
                      and c["kept"].get("instructions") is not None])

    rows = []
    base = [g[(d, p, v, 0.0)] for d in ax["defense"] for p in ax["policy"][:1] for v in ax["variant"][:1]
            if (d, p, v, 0.0) in g]
    if base:
        rows.append(["uncompressed (ratio 0)", fmt(pooled(base, "leak_system")), fmt(pooled(base, "refusal"), 2),
                     fmt(pooled(base, "ifeval_strict")), fmt(gap(base), 2)])
    for v in ax["variant"]:
        cells = [g[(d, p, v, q)] for d in ax["defense"] for p in ax["policy"] for q in ax["ratio"] if q > 0]
        cells = [c for c in cells if c.get("n")]
        rows.append([v, fmt(pooled(cells, "leak_system")), fmt(pooled(cells, "refusal"), 2),
                     fmt(pooled(cells, "ifeval_strict")), fmt(gap(cells), 2)])
    return _table(["variant (ratios > 0, all policies, both orders)", "leakage ROUGE-L recall", "refusal rate",
                   "IFEval strict", "mean abs. gap, kept defense vs instructions"], rows)


def class_table(records: list[dict]) -> str:
    ca = class_accuracy(records)
    ratios = sorted({k[2] for k in ca})
    rows = []
    for g in ("single", "multi"):
        for cls in sorted({k[1] for k in ca if k[0] == g}):
            cells = []
            for q in ratios:
                a = ca.get((g, cls, q))
                cells.append("–" if a is None else f"{a[0]:.2f} ({a[1]})")
            rows.append([g, cls] + cells)
    return _table(["items", "class"] + [f"{q:g}" for q in ratios], rows)


def report_markdown(records_all: list[dict], overhead_records: list[dict] | None = None) -> str:
    recs = ok_records(records_all)
    if not recs:
        return "_No completed runs in the JSONL._\n"
    ax = axes(recs)
    g = grid(recs)
    inf = infeasible(records_all)
    n_items = len({r["key"] for r in recs})
    out = [f"Runs: {len(recs)} answered, {len(inf)} infeasible, items: {n_items}, "
           f"defenses: {', '.join(ax['defense'])}, ratios: {', '.join(f'{q:g}' for q in ax['ratio'])}. "
           "Ratio 0 is the uncompressed baseline (one run per item and defense, shared by every row).", ""]
    out += ["#### Summary", "", summary_table(g, ax), ""]
    sections = [
        ("Leakage: ROUGE-L recall of the system prompt in the answer to the attack", "leak_system", 3),
        ("Leakage: ROUGE-L recall of the whole defended prompt", "leak_defended", 3),
        ("Refusal rate (answer contains \"I can't assist with that request\")", "refusal", 2),
        ("IFEval instruction-level strict accuracy", "ifeval_strict", 3),
    ]
    for title, key, digits in sections:
        for d in ax["defense"]:
            out += [f"#### {title} — {d} defense", "", metric_table(g, ax, d, key, digits), ""]
    paper = any(v.split(" ")[0] == "fair_paper" for v in ax["variant"])
    for d in ax["defense"]:
        out += [f"#### Kept fraction of the defense / instruction segments — {d} defense", "",
                kept_table(g, ax, d), ""] + ([KEPT_NOTE, ""] if paper else [])
    out += ["#### IFEval strict accuracy per instruction class (plain policies pooled; instruction count)", "",
            class_table(recs), ""]
    dc = degradation_correlation(recs)
    rho = "–" if dc["rho"] is None else f"{dc['rho']:.3f} (p = {dc['p']:.3f})"
    out += [f"Spearman rank correlation of per-class accuracy drop (ratio 0 → {dc['hi_ratio']}), single vs "
            f"multi-instruction items: rho = {rho} over {dc['n_classes']} classes.", ""]
    if overhead_records:
        n_items = len({r["key"] for r in ok_records(overhead_records)})
        reps = len({r.get("rep") for r in overhead_records})
        out += [f"#### Overhead: each configuration run alone ({n_items} items x {reps} repetitions, medians; "
                "`python3 -m tools.pitfalls overhead`)", "", overhead_table(overhead_records), ""]
    else:
        out += ["#### Overhead", "", "_Not measured: run `python3 -m tools.pitfalls overhead`._", ""]
    if inf:
        out += ["#### Infeasible runs (more forced tokens, e.g. the whitelist, than the keep budget; not scored)", "",
                _count_table(inf), ""]
    na = with_status(records_all, "not_applicable")
    if na:
        out += ["#### Runs that do not apply (recorded, never run)", "", _count_table(na, reason=True), ""]
    return "\n".join(out)


def _count_table(records: list[dict], reason: bool = False) -> str:
    """Runs per (defense, policy, variant, ratio[, reason])."""
    by: dict[tuple, int] = defaultdict(int)
    for r in records:
        extra = (r.get("reason") or "",) if reason else ()
        by[(r["defense"], r["policy"], variant_label(r), f"{float(r['ratio']):g}") + extra] += 1
    header = ["defense", "policy", "variant", "ratio"] + (["reason"] if reason else []) + ["runs"]
    return _table(header, [[*k, str(n)] for k, n in sorted(by.items())])
