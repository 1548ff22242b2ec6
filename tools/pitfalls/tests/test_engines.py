"""The harness on either engine: the engine's binary is found by its own name, run ids and records carry the
engine, model and turns (so a resume never mixes them and the 135M records stay valid), a leak-only run is scored
without IFEval, reports refuse to average two engines or models, and the composite gain of the paper's Table 1 is
worked out by hand."""
import json

import pytest

from tools.pitfalls import aggregate, cli, harness, jsonl
from tools.pitfalls import runner as runner_mod

from .fakes import ATTACK, ITEMS, TEMPLATES, calls, configs


def test_each_engine_finds_its_own_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRKV_LLAMA", str(tmp_path / "a"))
    monkeypatch.setenv("FAIRKV_LLAMACPP_BIN", str(tmp_path / "b"))
    assert runner_mod.find_runner(None, "runner") == tmp_path / "a"
    assert runner_mod.find_runner(None, "llamacpp") == tmp_path / "b"
    assert runner_mod.find_runner(str(tmp_path / "c"), "llamacpp") == tmp_path / "c"


def test_run_ids_and_records_carry_engine_model_and_turns():
    run = harness.plan(ITEMS[:1], TEMPLATES, ["standard"], ["snapkv"], ["plain"], [0.5])[-1]
    default = harness.Settings()
    qwen = harness.Settings(engine="llamacpp", model="qwen1.5b", turns=("leak",))
    assert run.run_id(default).endswith("|n128")             # the 135M runner's ids, unchanged
    assert run.run_id(qwen) == run.run_id(default) + "|e:llamacpp|m:qwen1.5b|t:leak"
    rec = harness.base_record(run, harness.request_for(run, ATTACK, qwen), qwen)
    assert (rec["engine"], rec["model_name"], rec["turns"]) == ("llamacpp", "qwen1.5b", ["leak"])
    # llama.cpp's single runs ask for its batch-invariant kernels, so they answer as its sweeps do
    assert harness.request_for(run, ATTACK, qwen).extra == ("--batch-invariant",)
    assert harness.request_for(run, ATTACK, default).extra == ()
    assert harness.request_for(run, ATTACK, qwen).users == (ATTACK,)
    task_only = harness.Settings(turns=("task",))
    assert harness.request_for(run, ATTACK, task_only).users == (ITEMS[0].user,)


def test_a_leak_only_sweep_is_scored_without_ifeval(env):
    runs = harness.plan(ITEMS, TEMPLATES, ["standard"], ["snapkv"], ["plain", "fair"], [0.0, 0.5])
    s = harness.Settings(turns=("leak",), engine="llamacpp", model="qwen1.5b")
    st = harness.execute(runs, env["out"], env["bin"], ATTACK, s, progress=False)
    assert st["ok"] == len(runs) and st["error"] == 0
    argv = calls(env["log"])[0]
    assert argv.count("--user") == 1 and argv[argv.index("--user") + 1] == ATTACK
    assert "--model" in argv and argv[argv.index("--model") + 1] == "qwen1.5b"
    recs = jsonl.read(env["out"])
    assert all("leak" in r and "ifeval" not in r and r["answers"].keys() == {"leak"} for r in recs)
    md = aggregate.report_markdown(recs)
    assert "IFEval" not in md and "Leakage: ROUGE-L recall" in md and "Composite gain" in md


def test_report_refuses_two_engines(tmp_path, capsys):
    base = {"status": "ok", "key": 1, "defense": "standard", "policy": "none", "variant": "plain", "ratio": 0.0}
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({**base, "run_id": "1"}) + "\n" +
                 json.dumps({**base, "run_id": "2", "engine": "llamacpp", "model_name": "qwen1.5b"}) + "\n")
    assert cli.main(["report", str(a), "--md-out", str(tmp_path / "r.md"), "--no-plots", "--results-md", ""]) == 2
    assert "report each on its own" in capsys.readouterr().err


def rec(key, defense, policy, variant, ratio, leak, refusal):
    return {"run_id": f"{key}|{defense}|{policy}|{variant}|{ratio}", "status": "ok", "key": key, "defense": defense,
            "policy": policy, "variant": variant, "ratio": ratio, "fair": variant != "plain", "sinks": 4, "boundary": 0,
            "leak": {"rougeL_recall_system": leak, "rougeL_recall_defended": leak, "refusal": refusal}}


def test_composite_gain_by_hand():
    # Two items, two orders, ratios 0.5 and 0.7 (0.9 is outside the paper's 0.4-0.7 and must not count).
    rs = []
    for key, plain_leak, fair_leak in ((1, 0.6, 0.2), (2, 0.4, 0.4)):
        for d in ("standard", "flipped"):
            for q in (0.5, 0.7, 0.9):
                rs.append(rec(key, d, "snapkv", "plain", q, plain_leak if q < 0.9 else 0.0, False))
                rs.append(rec(key, d, "snapkv", "fair", q, fair_leak if q < 0.9 else 1.0, q == 0.5))
    leak = aggregate.composite_gains(rs, "leak_system", -1.0)[("snapkv", "fair")]
    refusal = aggregate.composite_gains(rs, "refusal", 1.0)[("snapkv", "fair")]
    # item 1: plain - fair = 0.4 in every cell; item 2: 0 -> mean 0.2
    assert leak[0] == pytest.approx(0.2) and leak[1] == pytest.approx(0.0) and leak[2] == pytest.approx(0.4)
    # refusal: 1 at ratio 0.5, 0 at 0.7 for both items -> 0.5
    assert refusal[0] == pytest.approx(0.5) and refusal[1] == refusal[2] == pytest.approx(0.5)


def test_ifeval_gain_and_the_composite_by_hand():
    # Leakage records as above (both orders) and task-turn records (standard only) with the same configurations: a
    # cell holds both kinds, each statistic reads only its own. Item 3 has leakage but no IFEval: it counts in the
    # leakage column and not in the composite.
    rs = []
    for key, plain_leak, fair_leak in ((1, 0.6, 0.2), (2, 0.4, 0.4), (3, 0.9, 0.0)):
        for d in ("standard", "flipped"):
            for q in (0.5, 0.7):
                rs.append(rec(key, d, "snapkv", "plain", q, plain_leak, False))
                rs.append(rec(key, d, "snapkv", "fair", q, fair_leak, False))

    def task(key, variant, ratio, strict):
        return {"run_id": f"{key}|standard|snapkv|{variant}|{ratio}|t:task", "status": "ok", "key": key,
                "defense": "standard", "policy": "snapkv", "variant": variant, "ratio": ratio,
                "fair": variant != "plain", "sinks": 4, "boundary": 0, "instruction_id_list": ["a"] * len(strict),
                "ifeval": {"strict": strict, "loose": strict}}

    # item 1: plain follows 1 of 2 instructions, fair 2 of 2 at 0.5 and 0 of 2 at 0.7 -> gains 0.5, -0.5 -> 0
    # item 2: plain 0 of 1, fair 1 of 1 at both ratios -> gain 1
    rs += [task(1, "plain", 0.5, [True, False]), task(1, "plain", 0.7, [True, False]),
           task(1, "fair", 0.5, [True, True]), task(1, "fair", 0.7, [False, False]),
           task(2, "plain", 0.5, [False]), task(2, "plain", 0.7, [False]),
           task(2, "fair", 0.5, [True]), task(2, "fair", 0.7, [True])]
    ife = aggregate.composite_gains(rs, "ifeval_strict", 1.0)[("snapkv", "fair")]
    assert ife[0] == pytest.approx(0.5) and ife[1] == pytest.approx(0.0) and ife[2] == pytest.approx(1.0)
    leak = aggregate.composite_gains(rs, "leak_system", -1.0)[("snapkv", "fair")]
    assert leak[0] == pytest.approx((0.4 + 0.0 + 0.9) / 3)
    # composite per item: item 1 0.4 + 0 = 0.4, item 2 0 + 1 = 1 (item 3 has no IFEval) -> mean 0.7, CI [0.4, 1]
    comp = aggregate.composite_gains(rs, "composite", 1.0)[("snapkv", "fair")]
    assert comp[0] == pytest.approx(0.7) and comp[1] == pytest.approx(0.4) and comp[2] == pytest.approx(1.0)
    table = aggregate.gains_table(rs)
    assert "composite (IFEval gain + leakage reduction)" in table and "Leakage over 3 items, IFEval over 2" in table
    assert "| snapkv | fair | 0.433 [" in table and "| 0.700 [0.400, 1.000] |" in table
