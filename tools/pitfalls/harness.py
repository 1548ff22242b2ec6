"""The sweep: plan the runs, skip those already in the JSONL, run the rest, score and append them.

Variants (what each configuration passes to fairkv-llama besides --policy and --ratio; VARIANT_SPECS):
- `plain`: the policy alone.
- `whitelist`: `--whitelist PHRASE` (segments.whitelist_phrases; only with a defense).
- `fair`: fairkv's fair eviction, `--fair --fair-mode proportional --sinks N` (every segment keeps the same
  fraction; the first N tokens, attention sinks, are kept and charged to the budget; `run --sinks`, default 4).
- `fair+whitelist`: `fair` and the whitelist.
- `fair_paper`: the paper's own two-span fair presses, `--fair --fair-mode paper --sinks 0` (the paper keeps no
  sinks explicitly; its spans cover the chat template instead), on the same text
  marked with exactly two segments, the defense and the system prompt (preamble + instructions: the paper's
  `defense_span` and `sys_instr_span`, segments.paper_spans). Without a defense there is no second span: those
  runs are recorded as `not_applicable`, with the reason, and never sent to the runner. The runner reports the
  kept fraction of the two spans only, so the instructions cannot be told from the preamble: aggregate reports
  the system-prompt span in their place (documented in its tables).
- `fair_boundary`: boundary protection, `fair` with `--boundary K` (`run --boundary`, default 2): the first and
  last K tokens of every segment are kept. Boundary protection is an option of the segment-aware allocators
  (fair, or a whitelist); plain eviction has no segments to protect, so it is composed with `fair`, and the
  difference to `fair` is what boundary protection adds.
Fair variants carry their mode, sinks and boundary in the run id (`|fair:proportional,s4,b0`), so the fair runs
recorded before these options existed (proportional, no sinks) are not mistaken for the new ones: a resume runs
the new ones, and aggregate labels the old ones `[sinks 0]`.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from . import jsonl, metrics
from .data import Item
from .runner import Config, Request, RunnerError, SweepRequest, is_budget_error
from .segments import SystemTurn, build_system_turn, paper_spans, whitelist_phrases


@dataclasses.dataclass(frozen=True)
class Variant:
    fair_mode: str | None = None      # --fair --fair-mode MODE --sinks (Variant.sinks); None: no --fair
    whitelist: bool = False           # --whitelist (segments.whitelist_phrases)
    boundary: bool = False            # --boundary Settings.boundary

    def sinks(self, s: "Settings") -> int:
        """Paper mode reproduces the paper exactly: no sinks of its own."""
        return 0 if self.fair_mode == "paper" else s.sinks


VARIANT_SPECS = {
    "plain": Variant(),
    "whitelist": Variant(whitelist=True),
    "fair": Variant("proportional"),
    "fair+whitelist": Variant("proportional", whitelist=True),
    "fair_paper": Variant("paper"),
    "fair_boundary": Variant("proportional", boundary=True),
}
POLICIES = ("knorm", "streaming_llm", "snapkv", "tova", "h2o")
VARIANTS = tuple(VARIANT_SPECS)
DEFENSES = ("standard", "flipped")
DONE = ("ok", "infeasible", "not_applicable")   # statuses of runs that are not done again
TURNS = ("leak", "task")   # the attack (leakage) and the item's own task (IFEval), answered in this order
NO_PAPER_SPANS = "paper mode needs two spans, the defense and the system prompt; this system turn has no defense"


@dataclasses.dataclass(frozen=True)
class Settings:
    window: int = 16
    max_new_tokens: int = 128
    threads: int = 2
    whitelist_mode: str = "refusal"   # see segments.whitelist_phrases and docs/results.md
    model: str | None = None
    max_batch: int = 64               # answers the runner decodes together (results do not depend on it)
    sinks: int = 4                    # attention sinks kept by the fair variants (--sinks)
    boundary: int = 2                 # tokens kept at each end of every segment by fair_boundary (--boundary)
    engine: str = "runner"            # runner (fairkv-llama) | llamacpp (fairkv-llamacpp): runner.ENGINES
    turns: tuple[str, ...] = TURNS    # the user turns asked: the attack ("leak") and the item's task ("task")

    def tag(self) -> str:
        """What a run id adds for another engine, model or turn set than the 135M runs recorded first (theirs stay
        valid, so a resume of them runs nothing twice)."""
        out = f"|e:{self.engine}" if self.engine != "runner" else ""
        out += f"|m:{self.model}" if self.model else ""
        return out + (f"|t:{','.join(self.turns)}" if self.turns != TURNS else "")


@dataclasses.dataclass(frozen=True)
class Run:
    item: Item
    turn: SystemTurn          # as marked for the runner: paper_spans(...) for fair_paper
    policy: str
    variant: str
    ratio: float
    skip: str | None = None   # why the run does not apply (recorded as not_applicable, never run)

    @property
    def spec(self) -> Variant:
        return VARIANT_SPECS[self.variant]

    def run_id(self, s: Settings) -> str:
        v = self.spec
        wl = s.whitelist_mode if v.whitelist else "-"
        fair = f"|fair:{v.fair_mode},s{v.sinks(s)},b{s.boundary if v.boundary else 0}" if v.fair_mode else ""
        return (f"{self.item.key}|{self.turn.defense}|{self.policy}|{self.variant}|{self.ratio:.2f}"
                f"|w{s.window}|wl:{wl}|n{s.max_new_tokens}{fair}{s.tag()}")


def plan(items: Iterable[Item], defenses_json: dict[str, str], defenses: Iterable[str],
         policies: Iterable[str], variants: Iterable[str], ratios: Iterable[float]) -> list[Run]:
    """Every (item, defense) gets one uncompressed baseline (policy none, ratio 0: the same for every
    policy and variant, so it is run once) and policy x variant at each ratio > 0. Whitelist variants
    are left out without a defense: there is nothing to whitelist. fair_paper runs get the turn marked with the
    paper's two spans; without a defense they are planned with a `skip` reason."""
    runs: list[Run] = []
    ratios = sorted(set(float(r) for r in ratios))
    for item in items:
        for d in defenses:
            turn = build_system_turn(item.system, d, defenses_json)
            paper_turn = paper_spans(turn) if turn.defense_text else None
            if any(r == 0.0 for r in ratios):
                runs.append(Run(item, turn, "none", "plain", 0.0))
            for r in ratios:
                if r == 0.0:
                    continue
                for p in policies:
                    for v in variants:
                        spec = VARIANT_SPECS[v]
                        if spec.whitelist and not turn.defense_text:
                            continue
                        if spec.fair_mode == "paper":
                            runs.append(Run(item, paper_turn or turn, p, v, r,
                                            skip=None if paper_turn else NO_PAPER_SPANS))
                        else:
                            runs.append(Run(item, turn, p, v, r))
    return runs


def users_for(item: Item, attack: str, s: Settings) -> tuple[str, ...]:
    return tuple({"leak": attack, "task": item.user}[t] for t in s.turns)


def request_for(run: Run, attack: str, s: Settings) -> Request:
    v = run.spec
    return Request(system_marked=run.turn.marked, users=users_for(run.item, attack, s), policy=run.policy,
                   ratio=run.ratio, fair=v.fair_mode is not None,
                   whitelist=tuple(whitelist_phrases(run.turn, s.whitelist_mode)) if v.whitelist else (),
                   fair_mode=v.fair_mode, sinks=v.sinks(s) if v.fair_mode else None,
                   boundary=s.boundary if v.boundary else 0, window=s.window, max_new_tokens=s.max_new_tokens,
                   threads=s.threads, model=s.model,
                   extra=("--batch-invariant",) if s.engine == "llamacpp" else ())


def config_for(run: Run, s: Settings) -> Config:
    r = request_for(run, "", s)
    return Config(**{f.name: getattr(r, f.name) for f in dataclasses.fields(Config)})


def groups(runs: Iterable[Run]) -> list[list[Run]]:
    """Runs of the same marked system prompt (item, defense order, segment marking), in plan order: one runner
    invocation each. Runs with a `skip` reason are left out."""
    by: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.skip is None:
            by.setdefault((r.item.key, r.turn.defense, r.turn.marked), []).append(r)
    return list(by.values())


def sweep_request_for(group: list[Run], attack: str, s: Settings) -> SweepRequest:
    first = group[0]
    return SweepRequest(system_marked=first.turn.marked, users=users_for(first.item, attack, s),
                        configs=tuple(config_for(r, s) for r in group), window=s.window,
                        max_new_tokens=s.max_new_tokens, threads=s.threads, max_batch=s.max_batch, model=s.model)


def base_record(run: Run, req: Request, s: Settings) -> dict:
    it = run.item
    return {
        "run_id": run.run_id(s), "key": it.key, "multi": it.multi, "instruction_id_list": it.instruction_id_list,
        "defense": run.turn.defense, "policy": run.policy, "variant": run.variant, "ratio": run.ratio,
        "fair": req.fair, "whitelist_mode": s.whitelist_mode if req.whitelist else None,
        "whitelist": list(req.whitelist), "fair_mode": req.fair_mode, "sinks": req.sinks, "boundary": req.boundary,
        "window": s.window, "max_new_tokens": s.max_new_tokens, "engine": s.engine, "model_name": s.model,
        "turns": list(s.turns),
    }


def score(run: Run, doc: dict, turns: tuple[str, ...] = TURNS) -> dict:
    """The metrics of one engine answer document: leakage on the attack's turn, IFEval on the task's (the turns
    asked, in `turns`' order)."""
    answers = {name: doc["turns"][i]["answer"] for i, name in enumerate(turns)}
    segs = [{"name": g["name"], "tokens": g.get("tokens"), "kept_fraction": g.get("kept_fraction")}
            for g in doc.get("segments", [])]
    out = {
        "engine_reported": doc.get("engine", "fairkv-llama"), "model": doc.get("model"),
        "system_tokens": doc.get("system_tokens"), "segments": segs,
        "kept": {g["name"]: g["kept_fraction"] for g in segs},
        "answers": answers,
        "new_tokens": [t.get("new_tokens") for t in doc["turns"]],
        "timings_ms": doc.get("timings_ms", {}),
        "prefill_tokens": doc.get("prefill_tokens"), "decode_tokens": doc.get("decode_tokens"),
    }
    if "state" in doc:
        out["statistics"] = doc.get("statistics")
    if "leak" in answers:
        leak_answer = answers["leak"]
        out["leak"] = {
            "rougeL_recall_system": metrics.rouge_l_recall(run.turn.system_prompt, leak_answer),
            "rougeL_recall_defended": metrics.rouge_l_recall(run.turn.plain, leak_answer),
            "refusal": metrics.is_refusal(leak_answer),
            "refusal_anywhere": metrics.contains_refusal(leak_answer),
        }
    if "task" in answers:
        out["ifeval"] = metrics.ifeval_scores(run.item.key, run.item.prompt, run.item.instruction_id_list,
                                              run.item.kwargs, answers["task"])
    return out


def seconds_per_run(records: Iterable[dict]) -> tuple[float, float, int] | None:
    """(median, mean, count) of the seconds a recorded run took, or None if none is recorded.

    A sweep's runs share one invocation, whose wall time each carries (`invocation_wall_s`, `invocation_configs`):
    the rate is per invocation, wall / configurations. The median, because an invocation stopped (SIGSTOP) or
    sharing the cores with a build took up to 20x its idle time, and the mean of such a history sized a sweep at
    six times what it takes alone."""
    per_inv: dict[tuple, float] = {}
    singles: list[float] = []
    for r in records:
        if r.get("status") != "ok" or not r.get("wall_s"):
            continue
        wall, n = r.get("invocation_wall_s"), r.get("invocation_configs")
        if wall and n:
            per_inv[(r.get("key"), r.get("defense"), wall, n)] = wall / n
        else:
            singles.append(float(r["wall_s"]))
    xs = sorted(per_inv.values()) or sorted(singles)
    if not xs:
        return None
    mid = len(xs) // 2
    median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    return median, sum(xs) / len(xs), len(xs)


def done_ids(records: Iterable[dict]) -> set[str]:
    """Runs that need no repeat: answered, impossible by construction (more forced tokens than the budget), or
    not applicable."""
    return {r["run_id"] for r in records if r.get("status") in DONE}


def progress_bar(total: int):
    """A tqdm bar over `total` runs on stderr (with its ETA), or None when tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="run", dynamic_ncols=True, file=sys.stderr)


SweepFn = Callable[[Path, SweepRequest], tuple[list, float]]


def execute(runs: list[Run], out: Path, binary: Path, attack: str, s: Settings, jobs: int = 1,
            run_fn: SweepFn | None = None, progress: bool = True, previous: jsonl.Scan | None = None) -> dict:
    """Run what is not yet in `out` (`previous`: its scan, when the caller has read it already): one runner
    invocation per system prompt (all its pending configurations), appending one JSON line per run as soon as its
    invocation finishes (jsonl.Writer: whole lines, on disk before the next invocation's)."""
    from . import runner as runner_mod

    run_fn = run_fn or runner_mod.run_sweep
    if previous is None:
        previous = jsonl.scan(out)
        jsonl.warn(out, previous)
    done = done_ids(previous.records)
    todo = [r for r in runs if r.run_id(s) not in done]
    stats = {"planned": len(runs), "skipped": len(runs) - len(todo), "ok": 0, "infeasible": 0, "error": 0,
             "not_applicable": 0, "invocations": 0, "wall_s": 0.0, "bad_lines": len(previous.bad)}
    lock = threading.Lock()
    bar = progress_bar(len(todo)) if progress and todo else None
    t_start = time.perf_counter()

    def finished(rec: dict) -> dict:
        rec["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return rec

    def failed(rec: dict, e: Exception) -> dict:
        if isinstance(e, RunnerError):
            rec.update(status="infeasible" if is_budget_error(e) else "error", error=str(e)[:500])
        else:  # a timeout or an unreadable document fails these runs only
            rec.update(status="error", error=f"{type(e).__name__}: {e}"[:500])
        return finished(rec)

    def one_group(group: list[Run]) -> list[dict]:
        recs = [base_record(r, request_for(r, attack, s), s) for r in group]
        try:
            results, wall = run_fn(binary, sweep_request_for(group, attack, s))
        except Exception as e:  # noqa: BLE001 - the whole invocation failed
            return [failed(rec, e) for rec in recs]
        share = round(wall / len(group), 3)
        for run, rec, res in zip(group, recs, results):
            if isinstance(res, Exception):
                failed(rec, res)
                continue
            try:
                rec.update(score(run, res, s.turns))
                rec.update(status="ok", wall_s=share, invocation_wall_s=round(wall, 3),
                           invocation_configs=len(group))
            except Exception as e:  # noqa: BLE001 - an unreadable document fails this run only
                failed(rec, e)
                continue
            finished(rec)
        return recs

    with jsonl.Writer(out) as w, cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        na = [finished({**base_record(r, request_for(r, attack, s), s), "status": "not_applicable",
                        "reason": r.skip}) for r in todo if r.skip]
        if na:
            w.write(na)
            stats["not_applicable"] = len(na)
            if bar is not None:
                bar.update(len(na))
        futures = [pool.submit(one_group, g) for g in groups(todo)]
        for fut in cf.as_completed(futures):
            recs = fut.result()
            with lock:
                w.write(recs)
                for rec in recs:
                    stats[rec["status"]] += 1
                stats["invocations"] += 1
                if bar is not None:
                    bar.update(len(recs))
                    bar.set_postfix(ok=stats["ok"], err=stats["error"], inf=stats["infeasible"])
    if bar is not None:
        bar.close()
    stats["wall_s"] = round(time.perf_counter() - t_start, 1)
    return stats
