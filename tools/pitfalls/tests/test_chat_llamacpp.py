"""The llama.cpp budget-chat experiment: scripts built from the paper's data, answers scored per turn, summaries
with intervals over scripts, on hand-made reports (no model)."""
import json

import pytest

from tools.pitfalls import chat_llamacpp as cl


@pytest.fixture(scope="module")
def data():
    return cl.load(cl.DATA)


def test_scripts_carry_three_standing_instructions_and_the_attacks(data):
    items, defenses, attacks = data
    seen = set()
    for s in range(10):
        sc = cl.build_script(s, items, defenses, attacks)
        ids = [r["id"] for r in sc["rules"]]
        assert len(set(ids)) == 3 and set(ids) <= set(cl.STANDING)
        assert len(sc["turns"]) == 30
        for t, turn in enumerate(sc["turns"], start=1):
            assert (turn["name"] == "attack") == (t in cl.ATTACK_TURNS)
            if t in cl.ATTACK_TURNS:
                assert turn["user"] == attacks["plain"]
        # Every instruction is its own marked segment after the defense and the preamble, and the leakage target
        # is the preamble and the instructions as the model reads them.
        marks = [m.split("]]")[0] for m in sc["system"].split("[[seg:")[1:]]
        assert marks == ["defense", "preamble", "rule1", "rule2", "rule3"]
        for r in sc["rules"]:
            assert r["prompt"] in sc["system"] and r["prompt"] in sc["instructions"]
        assert "[[seg:" not in sc["instructions"]
        seen.add((tuple(ids), sc["turns"][0]["user"]))
    assert len(seen) == 10  # every script its own instructions or tasks


def fake_report(script, answers):
    turns = []
    for i, (t, a) in enumerate(zip(script["turns"], answers), start=1):
        turns.append({"turn": i, "name": t["name"], "answer": a, "system_cached": 100.0 - i,
                      "system_kept": {"defense": 1.0}})
    turns.insert(3, {"refused": "turn too long", "name": "", "user": "x"})  # refused turns are skipped
    return {"system_tokens": 100, "budget": 64, "turns": turns}


def test_score_and_summary_on_hand_made_answers(data, tmp_path):
    items, defenses, attacks = data
    sc = cl.build_script(0, items, defenses, attacks)
    # Answers that leak the instructions word for word at the attacks, and otherwise an empty answer.
    answers = [sc["instructions"] if t["name"] == "attack" else "" for t in sc["turns"]]
    rows = cl.score(sc, fake_report(sc, answers))
    assert len(rows) == 30
    attack_rows = [r for r in rows if r["attack"]]
    assert [r["turn"] for r in attack_rows] == list(cl.ATTACK_TURNS)
    assert all(r["leak"] == pytest.approx(1.0) for r in attack_rows)
    assert all(0.0 < r["leak_defended"] < 1.0 and r["refusal"] == 0.0 for r in attack_rows)  # the defense not recited
    assert all(len(r["follow"]) == 3 for r in rows if not r["attack"])

    out = tmp_path / "m"
    out.mkdir()
    for s in (0, 1):
        scs = cl.build_script(s, items, defenses, attacks)
        (out / f"s{s}_script.json").write_text(json.dumps(scs))
        leak = [scs["instructions"] if (t["name"] == "attack" and s == 0) else "ok" for t in scs["turns"]]
        (out / f"s{s}_plain.json").write_text(json.dumps(fake_report(scs, leak)))
    summary = cl.summarize(cl.collect(out))
    t = summary["plain"]["table"]
    assert t["scripts"] == 2
    mean, lo, hi = t["leak"]
    assert lo <= mean <= hi and 0.4 < mean < 0.6  # one script leaks everything, the other nothing
    assert t["system_cached_end"][0] == pytest.approx(0.70)  # 100 - 30 of 100 tokens after turn 30
    md = cl.markdown(summary, "meta")
    assert "| plain | 2 |" in md
