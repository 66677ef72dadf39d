"""Intervals over training seeds: Student's t for the mean of a few seeds' numbers (or of paired
differences, seed by seed), and Welch's for the difference of two unpaired groups of seeds.

A workflow runs few seeds, so the t quantile matters: 4.30 for three seeds where the normal gives
1.96. Written by hand because scipy is not a dependency: a table of the 0.975 quantiles up to 30
degrees of freedom, and beyond it the Cornish-Fisher expansion around the normal quantile (within
0.001 of t there). Such an interval spans training seeds on one test set; a paired bootstrap over
test sentences (headcount.training.evaluate) spans the other source of noise; the two-level
bootstrap at the end spans both at once, at matched head counts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from headcount.training.evaluate import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, bootstrap_interval

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


# --------------------------------------------------------------------------------------------
# Seeds and sentences together: a two-level bootstrap at matched head counts
#
# A pruning difference (pruned - control) varies with the training seed and with the test
# sentences. The runs of different seeds keep different numbers of heads at the same lambda, so
# they are compared at a head count, each seed's value read off its own curve by linear
# interpolation between the two runs that bracket the count (no extrapolation). Seeds share one
# test set: the design is crossed, so each replicate draws seeds with replacement and one draw of
# sentences that every drawn seed is scored on.


def bracketing_runs(counts: Sequence[float], target: float) -> tuple[int, int, float] | None:
    """(i, j, w): the curve at `target` heads is (1 - w) * value[i] + w * value[j], i and j the runs
    keeping the fewest heads >= target and the most heads <= target; None where `target` lies
    outside the runs' counts. Several runs at one count: the first of them."""
    above = [(c, i) for i, c in enumerate(counts) if c >= target]
    below = [(-c, i) for i, c in enumerate(counts) if c <= target]
    if not above or not below:
        return None
    (c_hi, i), (c_lo, j) = min(above), min(below)
    c_lo = -c_lo
    return (i, j, 0.0) if c_hi == c_lo else (i, j, (c_hi - target) / (c_hi - c_lo))


@dataclass(frozen=True)
class SeedRun:
    """One pruning run of one seed: heads kept and what its per-sentence statistic needs.
    `value(index)` maps (n_samples, n_sentences) sentence indices to the run's statistic on each
    resample (e.g. pruned - control mean token NLL, or BLEU difference, from per-sentence sums)."""
    heads: float
    value: Callable[[np.ndarray], np.ndarray]


def ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A run statistic sum(numerator) / sum(denominator) over the drawn sentences, e.g. the
    pruned - control NLL of each sentence over its token count: the mean token NLL difference."""
    numerator, denominator = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    return lambda index: numerator[index].sum(axis=-1) / denominator[index].sum(axis=-1)


@dataclass(frozen=True)
class TwoLevelInterval:
    heads: float
    estimate: float  # mean over the seeds of each seed's interpolated value on all sentences
    low: float
    high: float
    seeds: tuple[int, ...]  # the seeds whose curves reach the count
    seed_values: tuple[float, ...]
    var_seeds: float  # bootstrap variance with the sentences fixed (seeds drawn only)
    var_sentences: float  # bootstrap variance with the seeds fixed (sentences drawn only)
    n_sentences: int
    replicates: np.ndarray = field(repr=False, compare=False)  # the two-level resamples of the mean

    def p_at_most(self, bound: float) -> float:
        """One-sided bootstrap p of "the difference is at most `bound`" (e.g. a loss beyond the
        paper's margin, bound = -margin): the share of replicates at or below it, +1 smoothed."""
        return float((np.sum(self.replicates <= bound) + 1) / (len(self.replicates) + 1))

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def two_level_bootstrap(curves: dict[int, Sequence[SeedRun]], heads: float, n_sentences: int,
                        n_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> TwoLevelInterval | None:
    """The mean over seeds of a difference at `heads` heads kept, with a 95% interval from resampling
    seeds and test sentences together (each replicate: seeds with replacement, one draw of sentences
    for all of them), and the two variance components for the power statement (power.py). None where
    fewer than two seeds' curves reach the count."""
    reached = {}
    for s, runs in sorted(curves.items()):
        bracket = bracketing_runs([r.heads for r in runs], heads)
        if bracket is not None:
            reached[s] = (runs, bracket)
    if len(reached) < 2:
        return None
    rng = np.random.default_rng(seed)
    index = np.concatenate([np.arange(n_sentences)[None], rng.choice(n_sentences, (n_samples, n_sentences))])
    values = []  # per seed: row 0 the full sample, rows 1.. the resamples
    for runs, (i, j, w) in reached.values():
        v = runs[i].value(index)
        values.append(v if w == 0 else (1 - w) * v + w * runs[j].value(index))
    values = np.stack(values)  # (seeds, 1 + n_samples)
    full, resampled = values[:, 0], values[:, 1:]
    S = len(reached)
    pick = rng.integers(0, S, size=(n_samples, S))  # seeds drawn for each replicate
    both = resampled[pick, np.arange(n_samples)[:, None]].mean(axis=1)
    seeds_only = full[pick].mean(axis=1)
    sentences_only = resampled.mean(axis=0)
    low, high = bootstrap_interval(both)
    return TwoLevelInterval(heads, float(full.mean()), low, high, tuple(reached), tuple(map(float, full)),
                            float(np.var(seeds_only, ddof=1)), float(np.var(sentences_only, ddof=1)), n_sentences,
                            both)
