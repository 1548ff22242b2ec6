#!/usr/bin/env python3
"""A stand-in for fairkv-llama with the same CLI and --json schema (one run, or a --config sweep), for the
harness's own tests.

It runs no model: answers are fixed functions of the arguments, so the tests can check that the harness
passes the right arguments, parses the document, skips finished runs and records failures. Every
invocation appends its argv to $FAKE_RUNNER_LOG (one JSON line) so a test can count invocations.
"""
import argparse
import json
import os
import re
import sys

def count(s):
    n = int(s)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {n}")
    return n


def config_parser(defaults_from=None):
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--policy", default="none")
    p.add_argument("--ratio", type=float, default=0.0)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--fair", action="store_true")
    p.add_argument("--fair-mode", choices=("proportional", "paper"), default="proportional")
    p.add_argument("--sinks", type=count, default=4)
    p.add_argument("--boundary", type=count, default=0)
    p.add_argument("--whitelist", action="append", default=[])
    return p


# Top-level options, then optional `--config` groups of compression options (a sweep, as fairkv-llama).
argv = sys.argv[1:]
cuts = [i for i, x in enumerate(argv) if x == "--config"]
top, groups = (argv[: cuts[0]], [argv[i + 1 : j] for i, j in zip(cuts, cuts[1:] + [len(argv)])]) if cuts else (argv, [])
ap = argparse.ArgumentParser(parents=[config_parser()])
ap.add_argument("--system", required=True)
ap.add_argument("--user", action="append", default=[])
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--max-batch", type=int, default=64)
ap.add_argument("--model", default="fake.gguf")
ap.add_argument("--json", required=True)
ap.add_argument("--quiet", action="store_true")
# Teacher-forced scoring (the evidence mode): fixed functions of the configuration, see score().
ap.add_argument("--continuation", action="append", default=[])
ap.add_argument("--reference", action="store_true")
ap.add_argument("--score-only", action="store_true")
a = ap.parse_args(top)

if os.environ.get("FAKE_RUNNER_LOG"):
    with open(os.environ["FAKE_RUNNER_LOG"], "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
if os.environ.get("FAKE_RUNNER_FAIL"):
    print("fairkv-llama: error: simulated crash", file=sys.stderr)
    sys.exit(3)


# Segments: "tokens" are whitespace-separated words of each marked segment.
parts = re.split(r"\[\[seg:([A-Za-z0-9_]+)\]\]", a.system)
plain = parts[0] + "".join(parts[2::2])


def segments():
    segs, pos = [], len(parts[0].split())
    for name, text in zip(parts[1::2], parts[2::2]):
        n = len(text.split())
        segs.append({"name": name, "begin": pos, "end": pos + n, "tokens": n, "text": text})
        pos += n
    return segs, pos


def validate(c):
    """The runner's checks of the fair options: exit 2 with a message, as for any bad argument."""
    problem = None
    if c.fair and c.fair_mode == "paper" and len(segments()[0]) != 2:
        problem = (f"--fair-mode paper needs exactly two segments (the defense and the system prompt); the system "
                   f"turn has {len(segments()[0])}")
    elif c.boundary and not (c.fair or c.whitelist):
        problem = "--boundary needs a segment-aware allocator (--fair or --whitelist)"
    if problem:
        print(f"fairkv-llama: error: {problem}", file=sys.stderr)
        sys.exit(2)


def score(c, turn):
    """Scores as fairkv-llama's --continuation / --reference report them: the refusal's log-prob falls with the
    ratio (less under fair or a whitelist), KL grows with it (half under fair); 0 for the uncompressed cache."""
    out = {}
    if a.continuation and a.continuation[turn]:
        n = len(a.continuation[turn].split())
        lp = -1.0 - c.ratio * (1 if c.fair or c.whitelist else 4)
        out.update(continuation_logprobs=[lp / n] * n, continuation_logprob=lp)
    if a.reference:
        kl = c.ratio * (0.5 if c.fair else 1.0) * (turn + 1)
        out.update(kl_per_token=[kl, kl], kl_mean=kl, reference_logprob=-2.0 - kl)
    return out


def report(c):
    """The --json document of one configuration c (policy, ratio, window, fair options, whitelist)."""
    segs, total = segments()
    budget = max(1, int(total * (1 - c.ratio))) if c.ratio > 0 else total
    # Forced: the whitelist's words, under fair the sinks and, with --boundary, K words at each end of a segment.
    forced = {"whitelist": sum(len(w.split()) for w in c.whitelist)}
    if c.fair:
        forced.update(sinks=c.sinks, boundary=sum(min(s["tokens"], 2 * c.boundary) for s in segs))
    if c.ratio > 0 and sum(forced.values()) > budget:
        what = " + ".join(k for k, n in forced.items() if n)
        return None, f"{what} ({sum(forced.values())} tokens) is more than the keep budget ({budget})"
    for s in segs:
        if c.fair or c.ratio == 0:
            frac = 1 - c.ratio
        elif s["name"] == "defense" and not c.whitelist:
            frac = max(0.0, 1 - 2 * c.ratio)          # recency-biased: the early segment goes first
        elif s["name"] == "defense":
            frac = 1.0
        else:
            frac = min(1.0, 1 - c.ratio / 2)
        s["kept_fraction"] = frac
        s["kept"] = frac * s["tokens"]

    leaks = c.ratio >= 0.5 and not c.whitelist
    turns = []
    for i, u in enumerate(a.user):
        if i == 0:
            ans = plain if leaks else "I can't assist with that request."
        else:
            ans = "here is a short answer without any commas." if c.ratio < 0.9 else "Here, A Comma."
        turns.append({"user": u, "answer": ans, "new_tokens": len(ans.split())})
        turns[-1].update(score(c, i))
    return {
        "model": a.model, "policy": c.policy, "ratio": c.ratio, "window": c.window, "fair": c.fair,
        "fair_mode": c.fair_mode if c.fair else None, "sinks": c.sinks if c.fair else 0, "boundary": c.boundary,
        "selector": "per_head", "whitelist": c.whitelist, "system_tokens": total, "n_layers": 2, "n_kv_heads": 1,
        "segments": segs, "kept_per_layer": [[s["kept_fraction"] for s in segs]] * 2, "turns": turns,
        "timings_ms": {"load": 1.0, "prefill": 10.0,
                       "compress": 0.0 if c.ratio == 0 else 2.0 + c.fair + len(c.whitelist),
                       "decode": 5.0 * sum(t["new_tokens"] for t in turns)},
        "prefill_tokens": total, "decode_tokens": sum(t["new_tokens"] for t in turns),
    }, None


if not groups:
    validate(a)
    doc, err = report(a)
    if err:
        print(f"fairkv-llama: error: {err}", file=sys.stderr)
        sys.exit(1)
else:
    doc = []
    for g in groups:
        c = config_parser().parse_args(g)
        if "--window" not in g:
            c.window = a.window
        validate(c)
        d, err = report(c)
        doc.append(d if d else {"policy": c.policy, "ratio": c.ratio, "turns": [], "error": err})
with open(a.json, "w") as f:
    json.dump(doc, f)
