"""The findings numbers (tools/pitfalls/findings.py) on hand-made records: complete items only, recitals named,
refusals counted per variant and ratio, the complete items written out in the input's order."""
import json

from tools.pitfalls import aggregate, findings


def rec(key, ratio, variant, policy="snapkv", defense="standard", refusal=1, recall=0.05, kept=None, run=None):
    fair = variant.startswith("fair")
    wl = "whitelist" in variant
    r = {"run_id": run or f"{key}-{defense}-{policy}-{variant}-{ratio}", "status": "ok", "key": key,
         "engine": "llamacpp", "model": "qwen1.5b", "defense": defense, "policy": policy, "ratio": ratio,
         "variant": variant, "fair": fair, "whitelist": ["x"] if wl else [],
         "leak": {"refusal": refusal, "rougeL_recall_system": recall},
         "kept": kept or {"defense": 0.5, "instructions": 0.5, "preamble": 0.5}}
    if fair:  # the harness's default fair settings, so the variant keeps its plain label
        spec = aggregate.VARIANT_SPECS[variant]
        r["sinks"] = spec.sinks(aggregate.DEFAULTS)
        r["boundary"] = aggregate.DEFAULTS.boundary if spec.boundary else 0
    return r


def sweep(key, missing=False):
    rs = [rec(key, 0.0, "plain")]
    rs.append(rec(key, 0.7, "plain", refusal=0, recall=0.9, kept={"defense": 0.04, "instructions": 0.99,
                                                                      "preamble": 0.5}))
    if not missing:
        rs.append(rec(key, 0.7, "fair", refusal=0, recall=0.1))
    return rs


def test_findings_count_complete_items_and_name_recitals(tmp_path, capsys):
    src = tmp_path / "leak.jsonl"
    records = sweep(1001) + sweep(1005) + sweep(1012, missing=True)
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "complete.jsonl"
    assert findings.main([str(src), "--complete-out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "left out (incomplete): items 1012" in text
    assert "items 2: 1001, 1005" in text
    assert "uncompressed refusals 2 of 2" in text
    assert "plain: refusals 0/2 (0.0 %), recitals 2, mean system recall 0.900" in text
    assert "recital: item 1001 snapkv 0.7 standard: defense kept 4.0 %, instructions 99.0 %" in text
    assert "fair: refusals 0/2 (0.0 %), recitals 0" in text
    assert "refusals by ratio: 0.7: 0/2" in text
    assert "kept gap |defense - instructions| plain: 0.95" in text
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["key"] for r in written] == [1001, 1001, 1001, 1005, 1005, 1005]


def test_findings_refuse_a_mix_of_models(tmp_path, capsys):
    src = tmp_path / "mixed.jsonl"
    a = sweep(1001)
    b = [dict(r, model="smollm2", run_id=r["run_id"] + "-s") for r in sweep(1005)]
    src.write_text("".join(json.dumps(r) + "\n" for r in a + b))
    assert findings.main([str(src)]) == 2
    assert "mixes engines or models" in capsys.readouterr().out
