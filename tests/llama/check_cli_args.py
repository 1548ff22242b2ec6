#!/usr/bin/env python3
"""The fairkv-llama command line is strict: every option x bad value exits non-zero with the option's name in
stderr, before any model is loaded (FAIRKV_MODEL points at a file that does not exist, so a value that slipped
through would end in a model error that names no option). Good values are accepted (they reach that model error).

usage: check_cli_args.py <fairkv-llama binary>
"""
import os
import subprocess
import sys
import tempfile

NO_MODEL = "/nonexistent/fairkv-no-model.gguf"


def run(binary, args):
    env = dict(os.environ, FAIRKV_MODEL=NO_MODEL)
    p = subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=60,
                       stdin=subprocess.DEVNULL)
    # A sanitizer report (ASan/UBSan builds) or a crash is never an acceptable way to fail.
    crashed = p.returncode < 0 or "Sanitizer" in p.stderr or "runtime error:" in p.stderr
    return (-999 if crashed else p.returncode), p.stderr


def main():
    binary = sys.argv[1]
    hw = os.cpu_count() or 1
    tmp = tempfile.mkdtemp(prefix="fairkv-cli-")
    empty_file = os.path.join(tmp, "empty.txt")
    open(empty_file, "w").close()
    good_file = os.path.join(tmp, "system.txt")
    with open(good_file, "w") as f:
        f.write("[[seg:a]]Be brief.\n")

    ints = ["", "abc", "1.5", "1e3", "+4", " 4", "4 ", "0x10", "99999999999", "-99999999999"]
    reals = ["", "abc", "1e309", "-1e309", "nan", "inf", "+0.5", " 0.5", "0.5 ", "0.5x", "0x0.8p0", "1", "1.0000001",
             "-0.1", "2"]
    # option -> bad values (each must fail naming the option)
    table = {
        "--ratio": reals,
        "--max-new-tokens": ints + ["-1", "1048577", "2147483647", "1000000000"],
        "--threads": ints + ["0", "-3", str(4 * hw + 1), "100000"],
        "--batch": ints + ["0", "-1", "4097"],
        "--max-batch": ints + ["0", "-1", "1025"],
        "--window": ints + ["0", "-1", "1048577"],
        "--sinks": ints + ["-1", "1025"],
        "--boundary": ints + ["-1", "1025"],
        "--policy": ["", "lru", "SnapKV", "snapkv ", "external"],  # external: scores the runner does not have
        "--selector": ["", "perhead", "union "],
        "--fair-mode": ["", "fair", "Paper", "proportional "],
        "--segments": ["", "words", "Sentences", "lines "],
        "--whitelist": [""],
        "--model": ["", tmp, os.path.join(tmp, "missing.gguf")],
        "--system-file": ["", tmp, os.path.join(tmp, "missing.txt"), empty_file],
        "--json": ["", tmp, os.path.join(tmp, "no-such-dir", "out.json")],
    }
    failures = []
    cases = 0

    def expect_error(args, name, what):
        nonlocal cases
        cases += 1
        rc, err = run(binary, args)
        if rc in (0, -999) or name not in err:
            failures.append(f"{what}: rc={rc}, stderr={err.strip()[:200]!r}")

    base = ["--user", "hi"]
    for opt, values in table.items():
        for v in values:
            expect_error(base + [opt, v], opt, f"{opt} {v!r}")
            if opt in ("--ratio", "--window", "--sinks", "--boundary", "--policy", "--selector", "--fair-mode",
                       "--segments", "--whitelist"):  # per-configuration options are as strict inside a --config
                expect_error(base + ["--config", opt, v], opt, f"--config {opt} {v!r}")
    # A missing value, a repeated option, a global option after --config, exclusive options, no --user.
    for opt in list(table) + ["--system", "--user"]:
        expect_error(base + [opt], opt, f"{opt} without a value")
    expect_error(base + ["--ratio", "0.5", "--ratio", "0.7"], "--ratio", "--ratio twice")
    expect_error(base + ["--config", "--sinks", "1", "--sinks", "2"], "--sinks", "--sinks twice in one --config")
    expect_error(base + ["--threads", "1", "--threads", "1"], "--threads", "--threads twice")
    expect_error(base + ["--config", "--max-new-tokens", "4"], "--max-new-tokens", "--max-new-tokens after --config")
    expect_error(base + ["--system", "x", "--system-file", good_file], "--system-file", "--system and --system-file")
    expect_error([], "--user", "no --user")
    # Options of fair eviction without --fair are refused, not ignored.
    expect_error(base + ["--sinks", "2"], "--sinks", "--sinks without --fair")
    expect_error(base + ["--boundary", "2"], "--boundary", "--boundary without --fair")
    expect_error(base + ["--fair-mode", "paper"], "--fair-mode", "--fair-mode paper without --fair")
    expect_error(base + ["--frobnicate"], "--frobnicate", "unknown option")
    # Teacher-forced scoring: one --continuation per --user, --reference needs a sweep and a reference answer,
    # --score-only needs something to score, all global (not inside a --config).
    expect_error(base + ["--continuation", "x", "--continuation", "y"], "--continuation", "two continuations, one user")
    expect_error(base + ["--user", "b", "--continuation", "x"], "--continuation", "one continuation, two users")
    expect_error(base + ["--continuation", ""], "--continuation", "only empty continuations")
    expect_error(base + ["--reference"], "--reference", "--reference without --config")
    expect_error(base + ["--reference", "--max-new-tokens", "0", "--config"], "--reference",
                 "--reference with --max-new-tokens 0")
    expect_error(base + ["--reference", "--reference", "--config"], "--reference", "--reference twice")
    expect_error(base + ["--score-only", "--config"], "--score-only", "--score-only without scoring")
    expect_error(base + ["--config", "--continuation", "x"], "--continuation", "--continuation after --config")
    expect_error(base + ["--config", "--reference"], "--reference", "--reference after --config")
    expect_error(base + ["--continuation"], "--continuation", "--continuation without a value")
    # --segments markers needs [[seg:]] markers in the system prompt.
    expect_error(base + ["--system", "Be brief. Be kind.", "--segments", "markers"], "--segments markers",
                 "--segments markers without a marker")
    # A bad name's message lists the valid ones (fairkv::parse's list for --policy and --selector).
    for opt, bad, listed in (("--policy", "lru", ["knorm", "snapkv", "h2o", "none"]),
                             ("--selector", "perhead", ["per_head", "union_heads", "head_adaptive"]),
                             ("--fair-mode", "Paper", ["proportional", "paper"])):
        cases += 1
        rc, err = run(binary, base + [opt, bad])
        if rc in (0, -999) or not err.startswith(f"fairkv-llama: error: {opt}: unknown") or \
                any(n not in err for n in listed):
            failures.append(f"{opt} {bad}: the message does not list {listed}: {err.strip()[:200]!r}")

    # Good values parse and reach the model lookup (whose error names no option).
    goods = [["--ratio", "0"], ["--ratio", "0.999999"], ["--ratio", "-0"], ["--ratio", ".5"], ["--ratio", "5e-1"],
             ["--max-new-tokens", "0"], ["--max-new-tokens", "1048576"], ["--threads", "1"], ["--batch", "4096"],
             ["--max-batch", "1024"], ["--window", "1"], ["--sinks", "0", "--fair"], ["--sinks", "1024", "--fair"],
             ["--boundary", "0"], ["--boundary", "1024", "--fair"], ["--fair-mode", "paper", "--fair"],
             ["--fair-mode", "proportional"], ["--policy", "none"],
             ["--segments", "sentences", "--fair"], ["--segments", "paragraphs"], ["--segments", "lines"],
             ["--system-file", good_file, "--segments", "markers"],
             # --policy and --selector take what fairkv::parse takes, its aliases included.
             ["--policy", "observed_attention"], ["--selector", "union_heads"], ["--selector", "union"],
             ["--system-file", good_file], ["--json", os.path.join(tmp, "out.json")], ["--allow-long-context"],
             ["--continuation", "I can't assist with that request."],
             ["--user", "b", "--continuation", "", "--continuation", "x", "--score-only"],
             ["--reference", "--score-only", "--continuation", "x", "--config", "--config", "--policy", "knorm",
              "--ratio", "0.5"],
             ["--ratio", "0.5", "--config", "--ratio", "0.7", "--sinks", "8", "--fair", "--config", "--ratio", "0.2",
              "--boundary", "2", "--fair-mode", "paper", "--fair"]]
    for g in goods:
        cases += 1
        rc, err = run(binary, base + g)
        if rc in (0, -999) or NO_MODEL not in err or "warning" in err:
            failures.append(f"good {g}: rc={rc}, stderr={err.strip()[:200]!r}")
    # Above the hardware threads (and within 4x): accepted with a warning that names the option.
    cases += 1
    rc, err = run(binary, base + ["--threads", str(hw + 1)])
    if rc == -999 or "warning: --threads" not in err or NO_MODEL not in err:
        failures.append(f"--threads {hw + 1}: no warning: {err.strip()[:200]!r}")
    # --help lists every option, the new ones included.
    cases += 1
    p = subprocess.run([binary, "--help"], capture_output=True, text=True)
    missing = [o for o in list(table) + ["--fair", "--allow-long-context", "--config", "--q8", "--quiet",
                                         "--continuation", "--reference", "--score-only"]
               if o not in p.stdout]
    if p.returncode != 0 or missing:
        failures.append(f"--help: rc={p.returncode}, missing {missing}")

    # fairkv-llama chat: the same strictness, before the model loads.
    script = os.path.join(tmp, "turns.jsonl")
    with open(script, "w") as f:
        f.write('{"user": "hi", "name": "t1"}\n\n{"user": "bye"}\n')
    bad_script = os.path.join(tmp, "bad.jsonl")
    with open(bad_script, "w") as f:
        f.write('{"user": "hi"}\n{"usr": "x"}\n')
    chat = ["chat", "--budget", "256"]
    chat_table = {
        "--budget": ints + ["0", "-1", "1048577"],
        "--ratio": ["0.5", "0"],  # refused whatever the value: a ratio together with a budget
        "--policy": ["", "lru", "none", "external"],
        "--selector": ["", "perhead", "head_adaptive"],
        "--window": ints + ["0", "1048577"],
        "--sinks": ints + ["-1", "1025"],
        "--boundary": ints + ["-1", "1025"],
        "--system-floor": ["", "x", "-0.1", "1.5", "nan", "inf", "0.5x"],
        "--turn-decay": ["", "x", "-0.5", "2", "nan"],
        "--segments": ["", "words"],
        "--whitelist": [""],
        "--max-new-tokens": ints + ["-1", "1048577"],
        "--threads": ints + ["0"],
        "--model": ["", tmp],
        "--system-file": ["", tmp, empty_file],
        "--script": ["", tmp, os.path.join(tmp, "missing.jsonl"), empty_file, bad_script],
        "--json": ["", tmp, os.path.join(tmp, "no-such-dir", "out.json")],
    }
    for opt, values in chat_table.items():
        for v in values:
            extra = ["--fair"] if opt in ("--sinks", "--boundary", "--system-floor", "--turn-decay") else []
            args = ["chat", *extra, opt, v] + ([] if opt == "--budget" else ["--budget", "256"])
            expect_error(args, opt, f"chat {opt} {v!r}")
    expect_error(["chat", "--policy", "knorm"], "--budget", "chat without --budget")
    expect_error(chat + ["--budget", "128"], "--budget", "chat --budget twice")
    expect_error(chat + ["--fair", "--budget", "4"], "--budget", "chat --budget twice (sinks)")
    expect_error(["chat", "--fair", "--budget", "4"], "--budget", "chat --budget not above the sinks")
    expect_error(chat + ["--sinks", "2"], "--sinks", "chat --sinks without --fair")
    expect_error(chat + ["--system-floor", "0.5"], "--system-floor", "chat --system-floor without --fair")
    expect_error(chat + ["--turn-decay", "0.5"], "--turn-decay", "chat --turn-decay without --fair")
    expect_error(chat + ["--user", "hi"], "--user", "chat --user (not a chat option)")
    expect_error(chat + ["--system", "x", "--system-file", good_file], "--system-file", "chat --system and --system-file")
    for g in [["--script", script], ["--policy", "snapkv", "--fair", "--sinks", "0"], ["--selector", "union_heads"],
              ["--segments", "lines"], ["--json", os.path.join(tmp, "chat.json")], ["--whitelist", "x"],
              ["--fair", "--system-floor", "0.5", "--turn-decay", "0.7"], ["--allow-long-context"]]:
        cases += 1
        rc, err = run(binary, chat + g)
        if rc in (0, -999) or NO_MODEL not in err:
            failures.append(f"good chat {g}: rc={rc}, stderr={err.strip()[:200]!r}")
    cases += 1
    p = subprocess.run([binary, "chat", "--help"], capture_output=True, text=True)
    missing = [o for o in list(chat_table) + ["--fair", "--quiet", "--system", "--allow-long-context"] if o not in p.stdout]
    if p.returncode != 0 or missing:
        failures.append(f"chat --help: rc={p.returncode}, missing {missing}")

    for f in failures:
        print("FAIL:", f)
    print(f"{cases - len(failures)} of {cases} command lines behaved")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
