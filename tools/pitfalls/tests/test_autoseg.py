"""tools.pitfalls.autoseg's measures on fixed inputs, worked by hand."""
from tools.pitfalls.autoseg import boundaries, bootstrap_ci, precision_recall, summarize
from tools.pitfalls.runner import Config, config_args


def seg(b, e):
    return {"begin": b, "end": e}


def test_boundaries_are_inner_starts_and_ends():
    # gold: [3, 10) [10, 20) [21, 30): inner points 10, 20, 21 (3 and 30 are the text's ends)
    assert boundaries([seg(3, 10), seg(10, 20), seg(21, 30)]) == {10, 20, 21}
    assert boundaries([seg(3, 30)]) == set()
    assert boundaries([]) == set()


def test_precision_recall_counts():
    gold = {10, 20, 21}
    auto = {7, 10, 21, 25}
    assert precision_recall(auto, gold) == (2, 4, 3)  # precision 2/4, recall 2/3


def test_bootstrap_ci_of_a_constant_is_the_constant_and_brackets_the_mean():
    assert bootstrap_ci([0.5] * 10) == (0.5, 0.5)
    lo, hi = bootstrap_ci([0.0, 1.0] * 20)
    assert lo < 0.5 < hi


def test_summary_micro_averages_boundaries():
    recs = [{"mode": "sentences", "n_segments": 4, "tp": 2, "n_auto": 4, "n_gold": 2, "defense_kept": 0.5,
             "instructions_kept": 0.4},
            {"mode": "sentences", "n_segments": 6, "tp": 2, "n_auto": 6, "n_gold": 3, "defense_kept": 0.5,
             "instructions_kept": 0.6}]
    row = summarize(recs).splitlines()[2]
    # precision 4/10, recall 4/5, mean 5 segments, gap 0
    assert row.startswith("| sentences | 5.0 | 0.400 | 0.800 | 0.500 [0.500, 0.500] | 0.500 [")
    assert "+0.000" in row


def test_segments_mode_reaches_the_command_line():
    assert config_args(Config("snapkv", 0.5, True, (), segments="sentences"))[-2:] == ["--segments", "sentences"]
    assert "--segments" not in config_args(Config("snapkv", 0.5, True, ()))
