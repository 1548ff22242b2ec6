"""stats.item_ci: a bootstrap over items of any statistic, hand-worked."""
import pytest

from tools.pitfalls import stats


def test_item_ci_of_a_pooled_rate_hand_worked():
    # Item a: 1 of 1 instructions followed; item b: 1 of 2. Pooled: 2/3. A resample is aa (1), bb (1/2) or ab
    # (2/3), each of aa and bb with probability 1/4, so the 2.5 % and 97.5 % quantiles of 2000 draws are 1/2 and 1.
    by = {"a": [1.0], "b": [1.0, 0.0]}
    pooled = lambda groups: sum(sum(g) for g in groups) / sum(len(g) for g in groups)  # noqa: E731
    assert stats.item_ci(by, pooled) == (pytest.approx(2 / 3), 0.5, 1.0)
    # The same seed gives the same interval; a statistic undefined on the items gives None.
    assert stats.item_ci(by, pooled) == stats.item_ci(dict(reversed(by.items())), pooled)
    assert stats.item_ci(by, lambda groups: None) is None
    assert stats.item_ci({}, pooled) is None


def test_item_ci_skips_resamples_where_the_statistic_is_undefined():
    # Defined only when item b is drawn: every defined draw is b's value or the mean with a's.
    by = {"a": None, "b": 4.0}
    stat = lambda groups: (sum(g for g in groups if g is not None) / sum(g is not None for g in groups)  # noqa: E731
                           if any(g is not None for g in groups) else None)
    assert stats.item_ci(by, stat) == (4.0, 4.0, 4.0)


def test_item_ci_of_a_plain_mean_equals_bootstrap_ci():
    xs = [0.3, 1.7, -2.0, 0.9, 4.4, 0.0]
    mean = lambda groups: sum(groups) / len(groups)  # noqa: E731
    m, lo, hi = stats.item_ci(dict(enumerate(xs)), mean)
    assert m == pytest.approx(sum(xs) / len(xs))
    # Same seed and the same draw order as bootstrap_ci: the same interval up to float summation.
    blo, bhi = stats.bootstrap_ci(xs)
    assert lo == pytest.approx(blo) and hi == pytest.approx(bhi)
