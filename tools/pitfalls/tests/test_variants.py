"""The fair-eviction variants of issue 16 (fair with sinks, fair_paper, fair_boundary) against the stand-in runner:
the arguments each passes, paper mode's two spans and its refusal, not-applicable runs, ids, labels, tables."""
import pytest

from tools.pitfalls import aggregate as agg
from tools.pitfalls import cli, harness, jsonl
from tools.pitfalls.runner import Request, RunnerError, run as run_one
from tools.pitfalls.segments import SYSTEM_PROMPT, build_system_turn, paper_spans

from .fakes import ATTACK, ITEMS, MINI, TEMPLATES, all_configs, calls

NEW = ["plain", "fair", "fair_paper", "fair_boundary"]


def opt(group, flag):
    return group[group.index(flag) + 1] if flag in group else None


def sweep(env, variants=NEW, defenses=("standard", "flipped", "none"), **settings):
    runs = harness.plan(ITEMS, TEMPLATES, defenses, ["knorm"], variants, [0.0, 0.5])
    return runs, harness.execute(runs, env["out"], env["bin"], ATTACK, harness.Settings(**settings), progress=False)


def test_each_variant_passes_its_options(env):
    runs, st = sweep(env)
    # per item: 3 defenses x (baseline + 4 variants), fair_paper without a defense recorded as not applicable
    assert st["planned"] == 2 * 3 * 5 and st["not_applicable"] == 2 and st["ok"] == 28 and st["error"] == 0
    # per item: standard and flipped twice (three segments; the paper's two spans), none once
    assert st["invocations"] == 10 and len(calls(env["log"])) == 10
    by_variant = {}
    for top, g in all_configs(env["log"]):
        if opt(g, "--policy") != "none":
            by_variant.setdefault((opt(g, "--fair-mode"), opt(g, "--boundary")), []).append((top, g))
    assert sorted(by_variant, key=str) == sorted([(None, None), ("proportional", None), ("paper", None),
                                                  ("proportional", "2")], key=str)
    for (mode, boundary), cs in by_variant.items():
        for top, g in cs:
            assert ("--fair" in g) == (mode is not None)
            assert opt(g, "--sinks") == {None: None, "paper": "0"}.get(mode, "4")  # paper: no sinks of its own
            marked = opt(top, "--system")
            if mode == "paper":
                assert marked.count("[[seg:") == 2 and f"[[seg:{SYSTEM_PROMPT}]]" in marked
            else:
                assert "[[seg:preamble]]" in marked and "[[seg:instructions]]" in marked
    assert len(by_variant[("paper", None)]) == 2 * 2          # items x (standard, flipped)

    recs = {(r["key"], r["defense"], r["variant"], r["ratio"]): r for r in jsonl.read(env["out"])}
    na = recs[(1, "none", "fair_paper", 0.5)]
    assert na["status"] == "not_applicable" and na["reason"] == harness.NO_PAPER_SPANS and "answers" not in na
    paper = recs[(1, "standard", "fair_paper", 0.5)]
    assert paper["status"] == "ok" and set(paper["kept"]) == {"defense", SYSTEM_PROMPT}
    assert (paper["fair_mode"], paper["sinks"], paper["boundary"]) == ("paper", 0, 0)
    b = recs[(2, "flipped", "fair_boundary", 0.5)]
    assert (b["fair_mode"], b["sinks"], b["boundary"]) == ("proportional", 4, 2)
    assert b["run_id"].endswith("|fair:proportional,s4,b2")
    assert recs[(2, "flipped", "plain", 0.5)]["run_id"] == "2|flipped|knorm|plain|0.50|w16|wl:-|n128"

    _, st = sweep(env)                                         # resumed: nothing to do, not_applicable included
    assert st["skipped"] == 30 and st["invocations"] == 0 and len(calls(env["log"])) == 10


def test_sinks_and_boundary_over_the_budget_are_infeasible(env):
    # 0.9 keeps 3 of item 1's 35 words: the 4 sinks alone do not fit (the fake's message names what was forced)
    _, st = sweep(env, variants=["fair", "fair_boundary"], defenses=("standard",), sinks=4)
    assert st["ok"] == 2 * 3 and st["infeasible"] == 0
    runs = harness.plan(ITEMS[:1], TEMPLATES, ["standard"], ["knorm"], ["fair", "fair_boundary"], [0.9])
    st = harness.execute(runs, env["out"], env["bin"], ATTACK, harness.Settings(), progress=False)
    assert st["infeasible"] == 2
    errors = {r["variant"]: r["error"] for r in jsonl.read(env["out"]) if r["status"] == "infeasible"}
    assert errors["fair"].startswith("sinks (4 tokens)") and errors["fair_boundary"].startswith("sinks + boundary")


def test_other_sinks_or_boundary_are_other_runs(env):
    sweep(env, defenses=("standard",))
    _, st = sweep(env, defenses=("standard",), sinks=0, boundary=3)
    # baseline, plain and fair_paper (its sinks are always 0) kept; the proportional fair ones redone
    assert st["skipped"] == 3 * 2 and st["ok"] == 2 * 2
    new = [g for _, g in all_configs(env["log"])[-4:]]
    assert {opt(g, "--sinks") for g in new} == {"0"} and {opt(g, "--boundary") for g in new} == {None, "3"}
    labels = {agg.variant_label(r) for r in jsonl.read(env["out"]) if r["ratio"] > 0}
    assert labels == {"plain", "fair", "fair_paper", "fair_boundary", "fair [sinks 0]",
                      "fair_boundary [sinks 0] [boundary 3]"}


def test_paper_mode_on_three_segments_is_refused_by_the_runner(env):
    """A fair_paper configuration sent with the three-segment marking: the runner exits non-zero, the harness records
    the error (and retries it next time), and nothing else of the plan is lost."""
    turn = build_system_turn(ITEMS[0].system, "standard", TEMPLATES)
    wrong = harness.Run(ITEMS[0], turn, "knorm", "fair_paper", 0.5)
    st = harness.execute([wrong], env["out"], env["bin"], ATTACK, harness.Settings(), progress=False)
    assert st["error"] == 1
    (rec,) = jsonl.read(env["out"])
    assert rec["status"] == "error" and "--fair-mode paper needs exactly two segments" in rec["error"]
    assert "has 3" in rec["error"]
    req = Request(system_marked=turn.marked, users=("hi",), policy="knorm", ratio=0.5, fair=True, whitelist=(),
                  fair_mode="paper")
    with pytest.raises(RunnerError) as e:
        run_one(env["bin"], req)
    assert e.value.returncode == 2
    ok = Request(system_marked=paper_spans(turn).marked, users=("hi",), policy="knorm", ratio=0.5, fair=True,
                 whitelist=(), fair_mode="paper", sinks=4)
    doc, _ = run_one(env["bin"], ok)
    assert [s["name"] for s in doc["segments"]] == ["defense", SYSTEM_PROMPT] and doc["fair_mode"] == "paper"
    with pytest.raises(RunnerError, match="segment-aware"):     # boundary protection needs segments in use
        run_one(env["bin"], Request(system_marked=turn.marked, users=("hi",), policy="knorm", ratio=0.5, fair=False,
                                    whitelist=(), boundary=2))


def test_report_with_the_new_variants(env, tmp_path):
    sweep(env)
    md, img = tmp_path / "r.md", tmp_path / "img"
    assert cli.main(["report", str(env["out"]), "--img-dir", str(img), "--md-out", str(md), "--results-md", "",
                     "--overhead", ""]) == 0
    text = md.read_text()
    ok = agg.ok_records(jsonl.read(env["out"]))
    g = agg.grid(ok)
    # The fake keeps 1 - ratio of every segment under fair: paper mode's system-prompt span stands in for the
    # instructions; its preamble is not measured on its own.
    paper = g[("standard", "knorm", "fair_paper", 0.5)]["kept"]
    assert paper["defense"] == paper["instructions"] == paper[SYSTEM_PROMPT] == pytest.approx(0.5)
    assert paper["preamble"] is None
    plain = g[("standard", "knorm", "plain", 0.5)]["kept"]
    assert plain["instructions"] == pytest.approx(0.75) and plain[SYSTEM_PROMPT] == pytest.approx(0.75)
    assert "| knorm | fair_paper | 1.00 [1.00, 1.00] / 1.00 [1.00, 1.00] | 0.50 [0.50, 0.50] / 0.50 [0.50, 0.50] |" in text and agg.KEPT_NOTE in text
    assert "| knorm | fair_boundary | 1.00 [1.00, 1.00] / 1.00 [1.00, 1.00] | 0.50 [0.50, 0.50] / 0.50 [0.50, 0.50] |" in text
    assert f"| none | knorm | fair_paper | 0.5 | {harness.NO_PAPER_SPANS} | 2 |" in text
    assert "| fair_paper | " in text and "none defense" in text
    assert (img / "pitfalls_kept_fraction.png").stat().st_size > 5000


def test_runs_recorded_before_the_fair_options_are_labelled_and_redone(env, tmp_path):
    """A fair record of the runner before issue 16 (no fair_mode, sinks, boundary; an id without them): labelled
    `fair [sinks 0]` in the tables and not taken for the new fair run, which is run again."""
    old_id = "1|standard|knorm|fair|0.50|w16|wl:-|n128"
    old = {"run_id": old_id, "key": 1, "defense": "standard", "policy": "knorm", "variant": "fair", "ratio": 0.5,
           "fair": True, "status": "ok"}
    assert agg.variant_label(old) == "fair [sinks 0]"
    with jsonl.Writer(env["out"]) as w:
        w.write([old])
    runs = harness.plan(ITEMS[:1], TEMPLATES, ["standard"], ["knorm"], ["fair"], [0.5])
    st = harness.execute(runs, env["out"], env["bin"], ATTACK, harness.Settings(), progress=False)
    assert st["skipped"] == 0 and st["ok"] == 1
    assert [agg.variant_label(r) for r in jsonl.read(env["out"])] == ["fair [sinks 0]", "fair"]


def test_quick_includes_the_new_variants(env, capsys):
    assert cli.main(["run", "--quick", "--data-dir", str(MINI), "--out", str(env["out"]), "--dry-run"]) == 0
    err = capsys.readouterr().err
    # 4 items x 2 defenses x (baseline + 2 ratios x 5 policies x 6 variants); per prompt two invocations
    assert "plan: 4 items x 2 defenses, ratios [0.0, 0.5, 0.9]: 488 runs" in err
    assert "488 to do in 16 runner invocations" in err


def test_segments_paper_spans():
    for d, order in (("standard", ["defense", SYSTEM_PROMPT]), ("flipped", [SYSTEM_PROMPT, "defense"])):
        t = build_system_turn("Use no commas.", d, TEMPLATES)
        p = paper_spans(t)
        assert [s.name for s in p.segments] == order and p.marked.count("[[seg:") == 2
        assert p.plain == t.plain and p.system_prompt == t.system_prompt and p.defense_text == t.defense_text
        assert p.segment("defense") == t.segment("defense")
        assert p.segment(SYSTEM_PROMPT).text == t.segment("preamble").text + t.segment("instructions").text
    with pytest.raises(ValueError, match="has no defense"):
        paper_spans(build_system_turn("Use no commas.", "none", TEMPLATES))
