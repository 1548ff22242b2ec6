"""Aggregation of a small fixed JSONL (data/small_runs.jsonl); expected values computed by hand."""
from pathlib import Path

import pytest

from tools.pitfalls import aggregate as agg
from tools.pitfalls import cli, jsonl

from .bad_lines import BAD_LINES, assert_named_and_counted, insert_line

DATA = Path(__file__).parent / "data" / "small_runs.jsonl"


@pytest.fixture
def records():
    return jsonl.read(DATA)


def test_latest_record_wins_and_failures_are_dropped(records):
    ok = agg.ok_records(records)
    assert sorted(r["run_id"] for r in ok) == ["A", "B", "C", "D", "E", "G"]
    assert [r["run_id"] for r in agg.infeasible(records)] == ["H"]


def test_cells(records):
    ok = agg.ok_records(records)
    g = agg.grid(ok)
    base = g[("standard", "knorm", "plain", 0.0)]          # the shared baseline (A, B)
    assert base["n"] == 2
    assert base["leak_system"] == pytest.approx(0.2)
    assert base["refusal"] == pytest.approx(0.5)
    assert base["ifeval_strict"] == pytest.approx(2 / 3)   # [T] + [T, F]
    assert base["ifeval_prompt_strict"] == pytest.approx(0.5)
    assert g[("standard", "knorm", "fair", 0.0)] == base   # ratio 0 is the same for every variant

    plain = g[("standard", "knorm", "plain", 0.5)]         # C, D
    assert plain["leak_system"] == pytest.approx(0.7)
    assert plain["leak_defended"] == pytest.approx(0.35)
    assert plain["refusal"] == 0.0
    assert plain["ifeval_strict"] == 0.0
    assert plain["kept"]["defense"] == pytest.approx(0.3)
    assert plain["kept"]["instructions"] == pytest.approx(0.8)
    assert plain["compress_ms"] == pytest.approx(5.0)
    assert plain["decode_ms_per_token"] == pytest.approx(2.5)  # (100/50 + 300/100) / 2

    fair = g[("standard", "knorm", "fair", 0.5)]           # E and the rerun of G
    assert fair["n"] == 2
    assert fair["leak_system"] == pytest.approx(0.3)
    assert fair["ifeval_strict"] == pytest.approx(1.0)
    assert fair["decode_ms_per_token"] == pytest.approx(2.7)   # (105/50 + 330/100) / 2


def test_overhead_table_is_relative_to_plain(records):
    ok = agg.ok_records(records)
    table = agg.overhead_table(ok)
    fair_row = next(line for line in table.splitlines() if line.startswith("| knorm | fair |"))
    # Medians of E and G: compress 6 ms vs plain's 5; decode (105/50, 330/100) -> 2.7 ms vs (100/50, 300/100) -> 2.5
    assert "| knorm | fair | 2 | 6.00 | +20.0% | 2.70 | +8.0% |" in fair_row
    assert "| knorm | plain | 2 | 5.00 | +0.0% | 2.50 | +0.0% |" in table


def test_class_accuracy(records):
    ca = agg.class_accuracy(agg.ok_records(records))
    assert ca[("single", "punctuation", 0.0)] == (1.0, 1)
    assert ca[("single", "punctuation", 0.5)] == (0.0, 1)
    assert ca[("multi", "change_case", 0.0)] == (0.0, 1)
    assert ca[("multi", "punctuation", 0.5)] == (0.0, 1)
    assert agg.degradation_correlation(agg.ok_records(records))["rho"] is None   # one shared class only


def _synthetic(drops_single, drops_multi):
    """Records whose per-class accuracy at ratio 0.9 is 1 - drop (all correct at ratio 0)."""
    recs, n = [], 0
    for group, drops, count in (("single", drops_single, 2), ("multi", drops_multi, 10)):
        for cls, drop in drops.items():
            for ratio in (0.0, 0.9):
                fails = round(drop * count) if ratio else 0
                for i in range(count):
                    ids = [f"{cls}:x"] if group == "single" else [f"{cls}:x", "other:y"]
                    strict = [i >= fails] + ([True] if group == "multi" else [])
                    n += 1
                    recs.append({"run_id": str(n), "key": n, "instruction_id_list": ids, "defense": "standard",
                                 "policy": "none" if ratio == 0 else "knorm", "variant": "plain", "ratio": ratio,
                                 "status": "ok", "ifeval": {"strict": strict, "loose": strict}})
    return recs


def test_spearman_of_class_degradation():
    recs = _synthetic({"a": 0.0, "b": 0.5, "c": 1.0}, {"a": 0.1, "b": 0.2, "c": 0.9})
    dc = agg.degradation_correlation(recs)
    assert dc["n_classes"] == 3                      # "other" has no single-instruction items
    assert dc["classes"]["b"] == {"single": pytest.approx(0.5), "multi": pytest.approx(0.2)}
    assert dc["rho"] == pytest.approx(1.0)
    recs = _synthetic({"a": 0.0, "b": 0.5, "c": 1.0}, {"a": 0.9, "b": 0.2, "c": 0.1})
    assert agg.degradation_correlation(recs)["rho"] == pytest.approx(-1.0)


def test_report_writes_tables_plots_and_results_block(tmp_path):
    results_md = tmp_path / "results.md"
    results_md.write_text(f"# Results\n\nbefore\n{cli.BEGIN}\nold\n{cli.END}\nafter\n")
    md_out, img = tmp_path / "report.md", tmp_path / "img"
    rc = cli.main(["report", str(DATA), "--img-dir", str(img), "--md-out", str(md_out),
                   "--results-md", str(results_md), "--all-items"])
    assert rc == 0
    md = md_out.read_text()
    # Two items: a mean of two values a, b has the bootstrap interval [min, max] (a resample is aa, ab or bb).
    assert "| knorm | plain | 0.200 [0.100, 0.300] | 0.700 [0.600, 0.800] |" in md   # leakage: baseline A, B; C, D
    assert "| knorm | fair | 0.200 [0.100, 0.300] | 0.300 [0.200, 0.400] |" in md    # E, G (G's error superseded)
    assert "| standard | knorm | whitelist | 0.5 | 1 |" in md  # the infeasible run is listed, not scored
    # IFEval pooled over instructions: A [T], B [T, F] -> 2/3; resamples AA 1, BB 1/2, AB 2/3 -> [0.5, 1].
    assert "| uncompressed (ratio 0) | 0.200 [0.100, 0.300] | 0.50 [0.00, 1.00] | 0.667 [0.500, 1.000] | " \
           "0.00 [0.00, 0.00] |" in md
    # Gap of the cell means: |0.3 - 0.8| = 0.5, and so in every resample (C: |0.2-0.7|, D: |0.4-0.9|).
    assert "| plain | 0.700 [0.600, 0.800] | 0.00 [0.00, 0.00] | 0.000 [0.000, 0.000] | 0.50 [0.50, 0.50] |" in md
    assert "| fair | 0.300 [0.200, 0.400] | 0.50 [0.00, 1.00] | 1.000 [1.000, 1.000] | 0.00 [0.00, 0.00] |" in md
    assert "| knorm | plain | 1.00 [1.00, 1.00] / 1.00 [1.00, 1.00] | 0.30 [0.20, 0.40] / 0.80 [0.70, 0.90] |" in md
    for name in ("pitfalls_leakage.png", "pitfalls_refusal.png", "pitfalls_ifeval.png", "pitfalls_kept_fraction.png"):
        p = img / name
        assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    text = results_md.read_text()
    assert "old" not in text and "before" in text and "after" in text and "| knorm | plain | 0.200 [0.100, 0.300] | 0.700" in text


def test_report_into_a_named_block_with_prefixed_figures(tmp_path):
    # A second report (another model's) fills its own block and leaves the default one alone; a block the file
    # lacks is an error, not a silent no-op.
    results_md = tmp_path / "results.md"
    results_md.write_text(f"{cli.BEGIN}\nkeep\n{cli.END}\n<!-- BEGIN GENERATED: other -->\nold\n"
                          "<!-- END GENERATED: other -->\n")
    img = tmp_path / "img"
    args = ["report", str(DATA), "--img-dir", str(img), "--md-out", str(tmp_path / "r.md"), "--all-items",
            "--overhead", "", "--results-md", str(results_md), "--img-prefix", "q_"]
    assert cli.main(args + ["--block", "other"]) == 0
    text = results_md.read_text()
    assert "keep" in text and "old" not in text and "| knorm | plain | 0.200 [0.100, 0.300] | 0.700" in text
    for name in ("q_leakage.png", "q_leakage_variants.png", "q_refusal_variants.png", "q_ifeval.png"):
        assert (img / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (img / "pitfalls_leakage.png").exists()
    assert cli.main(args + ["--block", "missing", "--no-plots"]) == 2


def test_complete_only_drops_items_of_a_stopped_sweep(records):
    # Item 1 has baseline, knorm plain/fair and an infeasible whitelist run; item 2 lacks the whitelist run.
    kept, dropped = agg.complete_only(records)
    assert dropped == [2]
    assert {r["key"] for r in kept} == {1} and {r["run_id"] for r in kept} == {"A", "C", "E", "H"}


def _report(tmp_path, path, tag):
    md = tmp_path / f"{tag}.md"
    rc = cli.main(["report", str(path), "--img-dir", str(tmp_path / "img"), "--md-out", str(md), "--results-md", "",
                   "--all-items", "--no-plots", "--overhead", ""])
    return rc, md.read_text() if md.is_file() else None


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_report_skips_and_counts_a_bad_line(tmp_path, capsys, kind):
    clean = _report(tmp_path, DATA, "clean")
    assert clean[0] == 0
    path = tmp_path / "runs.jsonl"
    path.write_bytes(DATA.read_bytes())
    insert_line(path, 4, BAD_LINES[kind])
    capsys.readouterr()
    assert _report(tmp_path, path, "bad") == clean      # every valid record is still there
    assert_named_and_counted(capsys.readouterr().err, path, 4, 9)


def test_report_of_a_file_cut_in_its_last_line(tmp_path, capsys):
    """A sweep still writing (or killed): the report uses every finished record and names the torn line."""
    lines = DATA.read_bytes().split(b"\n")[:-1]
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines) + b'{"run_id": "X", "key": 1, "sta')
    capsys.readouterr()
    assert _report(tmp_path, path, "torn") == _report(tmp_path, DATA, "clean")
    err = capsys.readouterr().err
    assert f"warning: {path}:9: unfinished last line" in err
    assert f"warning: {path}: skipped 1 unreadable line(s) of 9" in err
