"""Percentile bootstrap intervals, resampling items: every mean the harness reports comes with one.

Items are the unit of resampling because configurations of one item share its text and its uncompressed
reference: their values are not independent draws, items are."""
from __future__ import annotations

import math
import random
import statistics
from typing import Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")

RESAMPLES = 2000
SEED = 0


def percentile(sorted_xs: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted values, linear interpolation between order statistics (numpy's
    default): position q * (n - 1)."""
    if not sorted_xs:
        raise ValueError("percentile of no values")
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def bootstrap_ci(values: list[float], n: int = RESAMPLES, seed: int = SEED,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: n resamples (with replacement, same size) of the values, with a
    fixed seed; the (1-level)/2 and (1+level)/2 quantiles of the resampled means."""
    if not values:
        raise ValueError("bootstrap of no values")
    rng = random.Random(seed)
    k = len(values)
    means = sorted(math.fsum(values[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    return percentile(means, (1 - level) / 2), percentile(means, (1 + level) / 2)


def mean_ci(values: list[float], n: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float]:
    """(mean, low, high)."""
    lo, hi = bootstrap_ci(values, n, seed)
    return statistics.fmean(values), lo, hi


def item_ci(by_item: Mapping[object, T], stat: Callable[[Sequence[T]], float | None], n: int = RESAMPLES,
            seed: int = SEED, level: float = 0.95) -> tuple[float, float, float] | None:
    """(statistic, low, high) of any statistic of the items' data (a pooled rate, a gap between two cell means):
    the items are resampled with replacement, the statistic recomputed on each resample, and the interval is the
    percentile interval of those values. A resample on which the statistic is undefined (None) is skipped. None if
    the statistic is undefined on the items themselves."""
    data = [by_item[k] for k in sorted(by_item, key=repr)]   # a fixed order: the same interval on every machine
    point = stat(data) if data else None
    if point is None:
        return None
    rng = random.Random(seed)
    k = len(data)
    draws = sorted(v for v in (stat([data[rng.randrange(k)] for _ in range(k)]) for _ in range(n)) if v is not None)
    return point, percentile(draws, (1 - level) / 2), percentile(draws, (1 + level) / 2)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> tuple[float | None, float | None]:
    """(rho, p) of the Spearman rank correlation, or (None, None) where it is undefined or meaningless: fewer
    than 3 pairs, or a constant side."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None, None
    from scipy.stats import spearmanr

    res = spearmanr(xs, ys)
    return float(res.statistic), float(res.pvalue)
