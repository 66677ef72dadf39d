"""Intervals over training seeds: Student's t for the mean of a few seeds' numbers (or of paired
differences, seed by seed), and Welch's for the difference of two unpaired groups of seeds.

A workflow runs few seeds, so the t quantile matters: 4.30 for three seeds where the normal gives
1.96. Written by hand because scipy is not a dependency: a table of the 0.975 quantiles up to 30
degrees of freedom, and beyond it the Cornish-Fisher expansion around the normal quantile (within
0.001 of t there). Such an interval spans training seeds on one test set; a paired bootstrap over
test sentences (headcount.training.evaluate) spans the other source of noise.
"""

from __future__ import annotations

import math
import statistics

# Student's t, 0.975 quantile, by degrees of freedom (tests/test_seed_statistics.py integrates the
# density to check each entry).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
        19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052,
        28: 2.048, 29: 2.045, 30: 2.042}
Z975 = 1.959964


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (rounded down: the wider
    interval, as Welch-Satterthwaite's fractional df asks)."""
    df = int(df)
    if df < 1:
        raise ValueError(f"a t quantile needs at least 1 degree of freedom, got {df}")
    if df in T975:
        return T975[df]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t_interval(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of its 95% t-interval); no half-width for one value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """mean(a) - mean(b) with its 95% Welch interval (unpaired: seeds of two arms do not pair), the
    Welch-Satterthwaite degrees of freedom rounded down; None with fewer than two values a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    difference = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return difference, difference, difference
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t975(df) * math.sqrt(va + vb)
    return difference, difference - half, difference + half
