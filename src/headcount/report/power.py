"""What a test can resolve, and corrections for making several.

- **Resolvable difference**: the smallest true difference a test detects with 80% power at
  two-sided 5%, (z_0.975 + z_0.80) times its standard error; the interval's half-width
  (z_0.975 SE) is what it tells apart once observed.
- **Seeds and sentences a margin needs**: a mean over S seeds scored on N shared test sentences
  has variance sigma_seed^2 / S + v_sentences (crossed design: the sentences' noise is common to
  every seed and does not shrink with S; it shrinks as 1/N). The components come from the
  two-level bootstrap (seed_statistics.two_level_bootstrap). A margin m is resolvable when the
  resolvable difference is at most m.
- **Holm's step-down correction** of p-values within a finding (across its lambdas or runs).

Written by hand: a few lines of arithmetic on which no dependency of the project has a function
(statsmodels' multipletests would, but statsmodels is not a dependency).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z975, Z80 = 1.959964, 0.841621  # normal quantiles: two-sided 5%, and 80% power
POWER_FACTOR = Z975 + Z80  # 2.80: resolvable difference per standard error


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input's order: the i-th smallest p times (m - i + 1),
    made monotone along the order and capped at 1. A hypothesis is rejected at level alpha where
    its adjusted p is below alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class PowerStatement:
    resolvable: float  # smallest true difference detected with 80% power
    half_width: float  # of the 95% interval: what it tells apart once observed
    margin: float | None  # None: no margin to resolve (e.g. NLL, where the paper states none)
    seeds: int
    sentences: int
    seeds_needed: int | None  # for the margin with this many sentences; None: no number of seeds does
    sentences_needed: int | None  # for the margin with unlimited seeds (the sentences' share alone)

    @property
    def resolves_margin(self) -> bool:
        return self.margin is not None and self.resolvable <= self.margin

    def text(self) -> str:
        if self.margin is None:
            return (f"resolves {self.resolvable:.4g} (80% power; ±{self.half_width:.4g} interval) with "
                    f"{self.seeds} seeds")
        if self.resolves_margin:
            need = f"resolves the {self.margin:g} margin"
        elif self.seeds_needed is not None:
            need = f"the {self.margin:g} margin needs {self.seeds_needed} seeds on {self.sentences} sentences"
        else:
            need = (f"the {self.margin:g} margin needs more than {self.sentences} sentences "
                    f"(at least {self.sentences_needed} with unlimited seeds)")
        return f"resolves {self.resolvable:.2f} (80% power; ±{self.half_width:.2f} interval) with {self.seeds} " \
               f"seeds: {need}"


def power_statement(var_seeds: float, var_sentences: float, seeds: int, sentences: int,
                    margin: float | None) -> PowerStatement:
    """From a two-level bootstrap's variance components at the current design (`var_seeds`: the
    mean's variance from drawing seeds, `var_sentences`: from drawing sentences), what the design
    resolves and what the margin would need (nothing of that without a margin)."""
    se = math.sqrt(var_seeds + var_sentences)
    if margin is None:
        return PowerStatement(POWER_FACTOR * se, Z975 * se, None, seeds, sentences, None, None)
    budget = (margin / POWER_FACTOR) ** 2  # the variance at which the margin is resolvable
    sigma2_seed = var_seeds * seeds
    if var_sentences < budget:
        seeds_needed = max(2, math.ceil(sigma2_seed / (budget - var_sentences))) if sigma2_seed > 0 else 2
    else:
        seeds_needed = None
    sentences_needed = math.ceil(var_sentences * sentences / budget) if var_sentences > 0 else 1
    return PowerStatement(POWER_FACTOR * se, Z975 * se, margin, seeds, sentences, seeds_needed, sentences_needed)
