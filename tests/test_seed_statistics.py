"""headcount.report.seed_statistics: the t quantiles against the t density integrated numerically,
the interval's coverage on simulated seeds, and Welch's interval by hand."""

import math
import statistics

import numpy as np
import pytest

from headcount.report.seed_statistics import T975, t975, t_interval, welch_interval


def t_cdf(q: float, df: int) -> float:
    """P(T <= q) for q > 0: one half plus the density integrated from 0 to q (Simpson's rule)."""
    x = np.linspace(0.0, q, 20001)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(x**2 / df))
    h = x[1] - x[0]
    return 0.5 + h / 3 * (density[0] + density[-1] + 4 * density[1:-1:2].sum() + 2 * density[2:-1:2].sum())


def t_quantile(df: int, p: float = 0.975) -> float:
    """The p quantile by bisection on the integrated density: a computation independent of the table."""
    low, high = 0.0, 50.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


@pytest.mark.parametrize("df", [*range(1, 31), 31, 45, 120, 1000])
def test_each_quantile_is_where_the_t_density_leaves_two_and_a_half_percent(df):
    # the table is rounded to three decimals; beyond it the Cornish-Fisher expansion is within 0.001
    assert t975(df) == pytest.approx(t_quantile(df), abs=0.001 if df > max(T975) else 0.0006)


def test_fractional_degrees_of_freedom_round_down_and_none_is_an_error():
    assert t975(2.94) == T975[2]
    with pytest.raises(ValueError, match="degree of freedom"):
        t975(0.5)


def test_three_seeds_intervals_cover_the_true_mean_95_percent_of_the_time():
    """Normal draws of three 'seeds': the t interval covers the mean at its nominal rate, where the
    normal quantile's interval (1.96) would cover about 80%."""
    rng = np.random.default_rng(0)
    draws = rng.normal(loc=1.5, scale=0.7, size=(4000, 3))
    covered = []
    for values in draws:
        mean, half = t_interval(list(values))
        covered.append(abs(mean - 1.5) <= half)
    assert np.mean(covered) == pytest.approx(0.95, abs=0.012)  # binomial sd 0.0034
    assert t_interval([2.0]) == (2.0, None)
    mean, half = t_interval([1.0, 2.0, 4.0])
    assert (mean, half) == pytest.approx((7 / 3, 4.303 * statistics.stdev([1.0, 2.0, 4.0]) / math.sqrt(3)))


def test_welch_interval_matches_the_hand_computation():
    # means 2 and 6; standard errors^2 1/3 and 4/3; Welch-Satterthwaite df 2.94, rounded down to 2
    # (t = 4.303); half-width 4.303 * sqrt(5/3) = 5.555
    difference, low, high = welch_interval([1.0, 2.0, 3.0], [4.0, 6.0, 8.0])
    assert (difference, low, high) == pytest.approx((-4.0, -9.555, 1.555), abs=1e-3)
    assert welch_interval([1.0], [2.0, 3.0]) is None
    assert welch_interval([1.0, 1.0], [2.0, 2.0]) == (-1.0, -1.0, -1.0)  # no spread: no width
