"""The 30-turn experiment of issue 14: `fairkv-llama chat` under a fixed token budget.

A defended system prompt (the standard defense template of defenses.json around an item of sys_ifeval.jsonl, as
the harness builds it: segments.build_system_turn, defense first, every segment marked), 29 benign user turns (the
user prompts of the next sys_ifeval items) and the attack of attacks.json last, run for plain / fair / whitelist /
fair+whitelist / fair+priorities (--system-floor, --turn-decay). Plots the defense's kept fraction per turn for
every variant, and the cache tokens, RSS and decode tokens/s per turn.

    python3 -m tools.pitfalls.chat_budget --binary build/examples/llama/fairkv-llama --out /tmp/chat_budget \
        --png docs/img/chat_budget.png

Needs only the standard library to run; matplotlib for the figure (--no-plot skips it).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from .segments import build_system_turn, whitelist_phrases

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "pitfalls"
VARIANTS = ("plain", "fair", "whitelist", "fair+whitelist", "fair+priorities")


def load_items(data: Path) -> list[dict]:
    with open(data / "sys_ifeval.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def build(data: Path, n_turns: int, defense: str = "standard") -> tuple[str, list[dict], list[str]]:
    """(marked system prompt, turns, whitelist phrases). Item 0's system message is the defended prompt's
    instructions; the user prompts of items 1..n_turns-1 are the benign turns; the attack is the last turn."""
    items = load_items(data)
    defenses = json.loads((data / "defenses.json").read_text(encoding="utf-8"))
    attacks = json.loads((data / "attacks.json").read_text(encoding="utf-8"))
    if len(items) < n_turns:
        raise SystemExit(f"sys_ifeval.jsonl has {len(items)} items, fewer than the {n_turns} turns")
    sys_msg = next(m["content"] for m in items[0]["messages"] if m["role"] == "system")
    turn = build_system_turn(sys_msg, defense, defenses)
    turns = []
    for it in items[1:n_turns]:
        user = next(m["content"] for m in it["messages"] if m["role"] == "user")
        turns.append({"user": user, "name": f"ifeval-{it['key']}"})
    turns.append({"user": attacks["plain"], "name": "attack"})
    return turn.marked, turns, whitelist_phrases(turn, "refusal")


def run_variant(binary: Path, out: Path, variant: str, system_file: Path, script: Path, whitelist: list[str],
                a: argparse.Namespace) -> dict:
    js = out / f"{variant.replace('+', '_')}.json"
    cmd = ["nice", "-n", "10", str(binary), "chat", "--system-file", str(system_file), "--script", str(script),
           "--budget", str(a.budget), "--policy", a.policy, "--window", str(a.window), "--max-new-tokens",
           str(a.max_new_tokens), "--threads", str(a.threads), "--json", str(js)]
    if "fair" in variant:
        cmd.append("--fair")
    if "priorities" in variant:  # the prioritized allocator: a floor for the system, older turns weigh less
        cmd += ["--system-floor", str(a.system_floor), "--turn-decay", str(a.turn_decay)]
    if "whitelist" in variant:
        for w in whitelist:
            cmd += ["--whitelist", w]
    print("$", " ".join(cmd[3:]), file=sys.stderr)
    with open(out / f"{variant.replace('+', '_')}.log", "w", encoding="utf-8") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    return json.loads(js.read_text(encoding="utf-8"))


def plot(docs: dict[str, dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"plain": "-", "whitelist": "--", "fair": ":", "fair+whitelist": "-.", "fair+priorities": "-"}
    fig, axs = plt.subplots(2, 2, figsize=(11, 7))
    for v, d in docs.items():
        t = [r["turn"] for r in d["turns"]]
        axs[0][0].plot(t, [r["system_kept"]["defense"] for r in d["turns"]], styles[v], marker="o", ms=3, label=v)
        axs[0][1].plot(t, [max(r["cache_max"]) for r in d["turns"]], styles[v], marker=".", label=v)
        axs[1][0].plot(t, [r["rss_bytes"] / 2**20 for r in d["turns"]], styles[v], marker=".", label=v)
        axs[1][1].plot(t, [r["decode_tps"] for r in d["turns"]], styles[v], marker=".", label=v)
    d0 = next(iter(docs.values()))
    axs[0][0].set_title(f"defense kept fraction ({d0['policy']}, budget {d0['budget']})", fontsize=10)
    axs[0][0].set_ylim(-0.02, 1.02)
    axs[0][1].axhline(d0["budget"], color="grey", lw=0.8)
    axs[0][1].set_title("cache tokens per KV head after the turn (max)", fontsize=10)
    axs[1][0].set_title("RSS (MiB)", fontsize=10)
    axs[1][1].set_title("decode tokens/s", fontsize=10)
    for a in axs.flat:
        a.set_xlabel("turn")
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def table(docs: dict[str, dict]) -> str:
    """Markdown: the defense's kept fraction per variant at selected turns."""
    d0 = next(iter(docs.values()))
    n = len(d0["turns"])
    picks = sorted({t for t in (1, 3, 5, 10, 15, 20, 25, n) if t <= n})
    out = "| variant | " + " | ".join(f"turn {t}" for t in picks) + " |\n"
    out += "|---|" + "---|" * len(picks) + "\n"
    for v, d in docs.items():
        by = {r["turn"]: r for r in d["turns"]}
        out += f"| {v} | " + " | ".join(f"{by[t]['system_kept']['defense']:.3f}" for t in picks) + " |\n"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", type=Path, default=Path("build/examples/llama/fairkv-llama"))
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=Path("/tmp/chat_budget"))
    p.add_argument("--png", type=Path, default=Path("docs/img/chat_budget.png"))
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--budget", type=int, default=384)
    p.add_argument("--policy", default="snapkv")
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--system-floor", type=float, default=0.5, help="fair+priorities: the system segments' floor")
    p.add_argument("--turn-decay", type=float, default=0.8, help="fair+priorities: a turn's weight per turn of age")
    p.add_argument("--replot", action="store_true", help="plot the JSON reports already in --out")
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    system, turns, whitelist = build(a.data, a.turns)
    system_file, script = a.out / "system.txt", a.out / "turns.jsonl"
    system_file.write_text(system, encoding="utf-8")
    script.write_text("".join(json.dumps(t) + "\n" for t in turns), encoding="utf-8")
    docs = {}
    for v in a.variants.split(","):
        js = a.out / f"{v.replace('+', '_')}.json"
        docs[v] = (json.loads(js.read_text(encoding="utf-8")) if a.replot
                   else run_variant(a.binary, a.out, v, system_file, script, whitelist, a))
    print(table(docs))
    if not a.no_plot:
        plot(docs, a.png)
        print(f"wrote {a.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
