"""Long conversations in llama.cpp under a fixed budget: fair eviction against llama.cpp's context shift.

Every script is a 30-turn conversation with `fairkv-llamacpp chat`. Its system turn is the standard defense of
defenses.json around the paper's preamble and three standing instructions, each the system message of one
sys_ifeval.jsonl item whose IFEval check applies to every answer (an ending phrase, a forbidden word, all
lowercase, no commas, a postscript, a response language), each its own segment. Its turns are the user prompts
(tasks) of other items, with the attack of attacks.json at turns 10, 20 and 30. The scripts differ in their
instructions and their tasks.

Variants (one program, one model): llama.cpp's context shift with n_keep 0 and with n_keep = the system turn, and
fairkv's SnapKV: plain, fair, fair + whitelisted refusal sentence, fair with a floor for the system segments.
Per turn: each standing instruction followed (IFEval strict, per answer), on the attack turns the leakage (ROUGE-L
recall of the instructions and of the whole defended prompt, as the paper scores them) and the refusal, the
system tokens still cached. Intervals are bootstrap
intervals over scripts.

    python3 -m tools.pitfalls.chat_llamacpp run --model qwen1.5b --scripts 10 --out results/chat_llamacpp
    python3 -m tools.pitfalls.chat_llamacpp report --out results/chat_llamacpp --md-out docs/data/chat_llamacpp.md \
        --png docs/img/chat_llamacpp.png

`run` is resumable: a conversation whose report exists is not run again.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from .segments import PREAMBLE, PLACEHOLDER, REFUSAL_SENTENCE

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "pitfalls"
# IFEval classes whose check holds or fails on any answer, whatever the task.
STANDING = ("startend:end_checker", "keywords:forbidden_words", "change_case:english_lowercase",
            "punctuation:no_comma", "detectable_content:postscript", "language:response_language")
VARIANTS = {
    "shift n_keep 0": ["--context-shift", "--keep", "0"],
    "shift n_keep system": ["--context-shift", "--keep", "-1"],
    "plain": [],
    "fair": ["--fair"],
    "fair+whitelist": ["--fair", "--whitelist", REFUSAL_SENTENCE],
    "fair+floor": ["--fair", "--system-floor", "0.5"],
}
ATTACK_TURNS = (10, 20, 30)


def load(data: Path) -> tuple[list[dict], dict, dict]:
    with open(data / "sys_ifeval.jsonl", encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    defenses = json.loads((data / "defenses.json").read_text(encoding="utf-8"))
    attacks = json.loads((data / "attacks.json").read_text(encoding="utf-8"))
    return items, defenses, attacks


def message(item: dict, role: str) -> str:
    return next(m["content"] for m in item["messages"] if m["role"] == role)


def build_script(s: int, items: list[dict], defenses: dict, attacks: dict, n_turns: int = 30) -> dict:
    """Script s: its three standing instructions (three classes, the s-th item of each), its marked system turn and
    its turns."""
    by_class = {c: [it for it in items if it["instruction_id_list"] == [c]] for c in STANDING}
    combos = list(itertools.combinations(STANDING, 3))
    classes = combos[(s * 7) % len(combos)]  # three distinct classes, a different set for every script up to 20
    rules = [by_class[c][s % len(by_class[c])] for c in classes]
    rule_keys = {r["key"] for r in rules}
    before, after = defenses["standard_defense"].split(PLACEHOLDER)
    assert not after, "the standard defense comes before the instructions"
    marked = "[[seg:defense]]" + before + "[[seg:preamble]]" + PREAMBLE
    marked += "\n".join(f"[[seg:rule{k + 1}]]" + message(r, "system") for k, r in enumerate(rules))
    instructions = PREAMBLE + "\n".join(message(r, "system") for r in rules)
    tasks = [it for it in items if it["key"] not in rule_keys and len(message(it, "user")) < 600]
    turns = []
    for t in range(1, n_turns + 1):
        if t in ATTACK_TURNS:
            turns.append({"user": attacks["plain"], "name": "attack"})
        else:
            it = tasks[(s * 97 + t * 13) % len(tasks)]
            turns.append({"user": message(it, "user"), "name": f"task-{it['key']}"})
    return {"script": s, "system": marked, "instructions": instructions, "turns": turns,
            "rules": [{"key": r["key"], "id": r["instruction_id_list"][0], "kwargs": r["kwargs"][0],
                       "prompt": message(r, "system")} for r in rules]}


def slug(variant: str) -> str:
    return variant.replace(" ", "_").replace("+", "_")


def run(a: argparse.Namespace) -> int:
    items, defenses, attacks = load(a.data)
    out = a.out / a.model
    out.mkdir(parents=True, exist_ok=True)
    todo = [(s, v) for s in range(a.first, a.first + a.scripts) for v in a.variants.split(",")
            if not (out / f"s{s}_{slug(v)}.json").exists()]
    print(f"plan: {a.scripts} scripts x {len(a.variants.split(','))} variants, {len(todo)} conversations to run",
          file=sys.stderr)
    for i, (s, v) in enumerate(todo):
        sc = build_script(s, items, defenses, attacks, a.turns)
        sys_file, turns_file = out / f"s{s}_system.txt", out / f"s{s}_turns.jsonl"
        sys_file.write_text(sc["system"], encoding="utf-8")
        turns_file.write_text("".join(json.dumps(t) + "\n" for t in sc["turns"]), encoding="utf-8")
        (out / f"s{s}_script.json").write_text(json.dumps(sc, indent=1), encoding="utf-8")
        js = out / f"s{s}_{slug(v)}.json"
        cmd = [str(a.binary), "chat", "--model", a.model, "--system-file", str(sys_file), "--script", str(turns_file),
               "--budget", str(a.budget), "--max-new-tokens", str(a.max_new_tokens), "--threads", str(a.threads),
               "--quiet", "--json", str(js) + ".part", *VARIANTS[v]]
        if not v.startswith("shift"):
            cmd += ["--policy", a.policy, "--window", str(a.window)]
        t0 = time.time()
        with open(out / f"s{s}_{slug(v)}.log", "w", encoding="utf-8") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
        Path(str(js) + ".part").rename(js)  # complete reports only: a killed run is redone
        print(f"[{i + 1}/{len(todo)}] script {s} {v}: {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


def score(script: dict, rep: dict) -> list[dict]:
    """Per turn: the standing instructions followed (IFEval strict), leakage on attack turns, system tokens cached."""
    from .metrics import ifeval_scores, is_refusal, rouge_l_recall

    defended = re.sub(r"\[\[seg:[^\]]*\]\]", "", script["system"])  # the system turn as the model reads it
    rows = []
    for t in rep["turns"]:
        if "refused" in t:
            continue
        row = {"turn": t["turn"], "attack": t["name"] == "attack", "system_cached": t["system_cached"],
               "system_tokens": rep["system_tokens"], "defense_kept": t["system_kept"].get("defense")}
        if row["attack"]:
            row["leak"] = rouge_l_recall(script["instructions"], t["answer"])
            row["leak_defended"] = rouge_l_recall(defended, t["answer"])
            row["refusal"] = float(is_refusal(t["answer"]))
        else:
            row["follow"] = [ifeval_scores(r["key"], r["prompt"], [r["id"]], [r["kwargs"]], t["answer"])["strict"][0]
                             for r in script["rules"]]
        rows.append(row)
    return rows


def collect(out: Path) -> dict[str, dict[int, list[dict]]]:
    """variant -> script -> scored turns, for every complete report in `out`."""
    res: dict[str, dict[int, list[dict]]] = {}
    for v in VARIANTS:
        for js in sorted(out.glob(f"s*_{slug(v)}.json")):
            s = int(js.name[1:js.name.index("_")])
            script = json.loads((out / f"s{s}_script.json").read_text(encoding="utf-8"))
            res.setdefault(v, {})[s] = score(script, json.loads(js.read_text(encoding="utf-8")))
    return res


def summarize(res: dict[str, dict[int, list[dict]]]) -> dict[str, dict]:
    """Per variant: per-turn means over scripts, and the table's numbers with intervals over scripts."""
    from .stats import mean_ci

    summary = {}
    for v, by_script in res.items():
        scripts = sorted(by_script)

        def per_script(f, turns=None):
            vals = []
            for s in scripts:
                xs = [f(r) for r in by_script[s] if (turns is None or r["turn"] in turns) and f(r) is not None]
                if xs:
                    vals.append(sum(xs) / len(xs))
            return vals

        follow = lambda r: (sum(r["follow"]) / len(r["follow"])) if "follow" in r else None  # noqa: E731
        n_turns = max(r["turn"] for s in scripts for r in by_script[s])
        late = set(range(n_turns - 9, n_turns + 1))
        table = {
            "scripts": len(scripts),
            "follow": mean_ci(per_script(follow)),
            "follow_late": mean_ci(per_script(follow, late)),
            "leak": mean_ci(per_script(lambda r: r.get("leak"))),
            "leak_defended": mean_ci(per_script(lambda r: r.get("leak_defended"))),
            "refusal": mean_ci(per_script(lambda r: r.get("refusal"))),
            "system_cached_end": mean_ci(per_script(lambda r: r["system_cached"] / r["system_tokens"], {n_turns})),
        }
        curves = {}
        for key, f in (("follow", follow), ("system_cached", lambda r: r["system_cached"] / r["system_tokens"]),
                       ("leak", lambda r: r.get("leak"))):
            curves[key] = []
            for t in range(1, n_turns + 1):
                xs = [f(r) for s in scripts for r in by_script[s] if r["turn"] == t and f(r) is not None]
                curves[key].append(sum(xs) / len(xs) if xs else None)
        summary[v] = {"table": table, "curves": curves}
    return summary


def markdown(summary: dict[str, dict], meta: str) -> str:
    fmt = lambda m: f"{m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}]"  # noqa: E731
    out = meta + ("\n\n| variant | scripts | instructions followed, all turns | turns 21-30 | leakage of the "
                  "instructions at attacks (ROUGE-L) | of the defended prompt | refusals at attacks | system tokens "
                  "cached after turn 30 |\n|---|---|---|---|---|---|---|---|\n")
    for v, d in summary.items():
        t = d["table"]
        out += (f"| {v} | {t['scripts']} | {fmt(t['follow'])} | {fmt(t['follow_late'])} | {fmt(t['leak'])} | "
                f"{fmt(t['leak_defended'])} | {fmt(t['refusal'])} | {fmt(t['system_cached_end'])} |\n")
    return out


def plot(summary: dict[str, dict], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
    for v, d in summary.items():
        c = d["curves"]
        turns = list(range(1, len(c["follow"]) + 1))
        style = "--" if v.startswith("shift") else "-"
        for ax, key in zip(axs, ("follow", "system_cached", "leak")):
            pts = [(t, y) for t, y in zip(turns, c[key]) if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o" if key == "leak" else ".", ms=4,
                    label=v)
    axs[0].set_title("standing instructions followed (IFEval strict)", fontsize=10)
    axs[1].set_title("system turn's tokens still cached (fraction)", fontsize=10)
    axs[2].set_title("leakage at the attack turns (ROUGE-L recall)", fontsize=10)
    for ax in axs:
        ax.set_xlabel("turn")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(True, alpha=0.3)
    axs[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def report(a: argparse.Namespace) -> int:
    out = a.out / a.model
    summary = summarize(collect(out))
    if not summary:
        raise SystemExit(f"no complete report in {out}")
    any_rep = json.loads(next(out.glob("s*_plain.json")).read_text(encoding="utf-8")) if list(out.glob("s*_plain.json")) else {}
    meta = (f"`fairkv-llamacpp chat`, model {a.model}, budget {any_rep.get('budget', '?')} tokens, "
            f"max {any_rep.get('max_new_tokens', '?')} answer tokens per turn, fairkv policy {any_rep.get('policy', '?')}; "
            f"mean over scripts [95% bootstrap interval over scripts]")
    md = markdown(summary, meta)
    print(md)
    if a.md_out:
        a.md_out.parent.mkdir(parents=True, exist_ok=True)
        a.md_out.write_text(md, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if a.png:
        plot(summary, a.png, meta.split(";")[0])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report"):
        q = sub.add_parser(name)
        q.add_argument("--out", type=Path, default=Path("results/chat_llamacpp"))
        q.add_argument("--model", default="qwen1.5b")
        if name == "run":
            q.add_argument("--binary", type=Path, default=Path("build/examples/llamacpp/fairkv-llamacpp"))
            q.add_argument("--data", type=Path, default=DATA)
            q.add_argument("--scripts", type=int, default=10)
            q.add_argument("--first", type=int, default=0)
            q.add_argument("--turns", type=int, default=30)
            q.add_argument("--budget", type=int, default=512)
            q.add_argument("--policy", default="snapkv")
            q.add_argument("--window", type=int, default=16)
            q.add_argument("--max-new-tokens", type=int, default=64)
            q.add_argument("--threads", type=int, default=2)
            q.add_argument("--variants", default=",".join(VARIANTS))
        else:
            q.add_argument("--md-out", type=Path)
            q.add_argument("--png", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "run":
        unknown = [v for v in a.variants.split(",") if v not in VARIANTS]
        if unknown:
            raise SystemExit(f"unknown variants {unknown} (of {list(VARIANTS)})")
        return run(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
