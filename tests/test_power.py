"""headcount.report.power and the two-level bootstrap of seed_statistics (issue 61): Holm against
the step-down procedure written out, interpolation against numpy, the bootstrap against the
one-level paired bootstrap where the seeds are copies, its variance components against known
variances, and the seeds a margin needs against a direct search."""

import math

import numpy as np
import pytest

from headcount.report.power import POWER_FACTOR, holm, power_statement
from headcount.report.seed_statistics import SeedRun, bracketing_runs, ratio_of_sums, two_level_bootstrap
from headcount.training.perplexity import paired_bootstrap_nll


def step_down_rejections(p, alpha):
    """Holm (1979) as stated: order the p-values, reject while p_(k) <= alpha / (m - k + 1), stop at
    the first that is not."""
    order = np.argsort(p, kind="stable")
    rejected = set()
    for k, i in enumerate(order):
        if p[i] > alpha / (len(p) - k):
            break
        rejected.add(int(i))
    return rejected


@pytest.mark.parametrize("seed", range(20))
def test_holm_adjusted_p_rejects_what_the_step_down_procedure_rejects(seed):
    rng = np.random.default_rng(seed)
    p = list(rng.uniform(0, 0.2, size=rng.integers(1, 9)))
    adjusted = holm(p)
    assert all(a >= q for a, q in zip(adjusted, p))
    for alpha in (0.01, 0.05, 0.1):
        assert {i for i, a in enumerate(adjusted) if a <= alpha} == step_down_rejections(np.array(p), alpha)


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04: 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


@pytest.mark.parametrize("target", [48, 40, 33.5, 17, 12, 2, 0])
def test_the_bracketing_runs_interpolate_as_numpy_does(target):
    counts = [48, 30, 17, 12, 5, 0]
    values = np.array([0.0, -0.1, -0.4, -0.5, -1.2, -3.0])
    i, j, w = bracketing_runs(counts, target)
    assert (1 - w) * values[i] + w * values[j] == pytest.approx(np.interp(target, counts[::-1], values[::-1]))


def test_no_extrapolation_beyond_a_seeds_runs():
    assert bracketing_runs([30, 17, 5], 40) is None and bracketing_runs([30, 17, 5], 4) is None


def sentence_data(rng, n=300):
    tokens = rng.integers(5, 25, size=n)
    control = tokens * 1.8 + rng.normal(0, 3, size=n)
    return tokens, control


def test_seeds_that_are_copies_give_the_one_level_paired_bootstrap():
    rng = np.random.default_rng(0)
    tokens, control = sentence_data(rng)
    pruned = control + tokens * 0.05 + rng.normal(0, 2, size=len(tokens))
    run = SeedRun(heads=20, value=ratio_of_sums(pruned - control, tokens))
    got = two_level_bootstrap({1: [run], 2: [run], 3: [run]}, heads=20, n_sentences=len(tokens))
    expected = paired_bootstrap_nll(pruned, control, tokens)
    assert got.estimate == pytest.approx(expected["difference"])
    assert (got.low, got.high) == pytest.approx((expected["low"], expected["high"]))
    assert got.var_seeds == pytest.approx(0.0, abs=1e-20)


def test_a_count_between_runs_reads_each_seeds_curve_at_that_count():
    # every sentence's difference is a + b * heads on each seed: the interpolation is exact
    n = 50
    tokens = np.full(n, 10.0)

    def run(heads, a):
        return SeedRun(heads, ratio_of_sums(np.full(n, (a + 0.02 * heads) * 10.0), tokens))
    curves = {1: [run(40, -1.0), run(20, -1.0), run(8, -1.0)], 2: [run(36, -0.5), run(10, -0.5)],
              3: [run(50, 0.0), run(5, 0.0)]}
    got = two_level_bootstrap(curves, heads=25, n_sentences=n)
    assert got.seed_values == pytest.approx((-1.0 + 0.5, -0.5 + 0.5, 0.0 + 0.5))
    assert got.estimate == pytest.approx(0.0)
    assert two_level_bootstrap(curves, heads=45, n_sentences=n) is None  # only seed 3 reaches 45


def test_variance_components_match_their_known_values():
    rng = np.random.default_rng(1)
    n, S = 400, 6
    tokens = np.ones(n)
    # seeds differ by a constant only: drawing sentences moves nothing, drawing seeds gives the
    # bootstrap variance of a mean of S draws, population variance / S
    offsets = rng.normal(0, 0.5, size=S)
    curves = {s: [SeedRun(10, ratio_of_sums(np.full(n, offsets[s]), tokens))] for s in range(S)}
    got = two_level_bootstrap(curves, 10, n, n_samples=4000)
    assert got.var_sentences == pytest.approx(0.0, abs=1e-20)
    assert got.var_seeds == pytest.approx(np.var(offsets) / S, rel=0.1)
    # one per-sentence difference shared by every seed: the sentences' share is var / n
    shared = rng.normal(0, 2.0, size=n)
    curves = {s: [SeedRun(10, ratio_of_sums(shared, tokens))] for s in range(S)}
    got = two_level_bootstrap(curves, 10, n, n_samples=4000)
    assert got.var_seeds == pytest.approx(0.0, abs=1e-20)
    assert got.var_sentences == pytest.approx(np.var(shared) / n, rel=0.1)
    assert got.p_at_most(-10) == pytest.approx(1 / 4001)


def test_the_seeds_a_margin_needs_are_the_fewest_that_resolve_it():
    var_seeds, var_sentences, seeds, sentences, margin = 0.12, 0.01, 3, 1000, 0.6
    got = power_statement(var_seeds, var_sentences, seeds, sentences, margin)
    assert got.resolvable == pytest.approx(POWER_FACTOR * math.sqrt(0.13))

    def resolvable(s):  # the same design with s seeds: the seeds' share shrinks as 1 / s
        return POWER_FACTOR * math.sqrt(var_seeds * seeds / s + var_sentences)
    direct = next(s for s in range(2, 10_000) if resolvable(s) <= margin)
    assert got.seeds_needed == direct and not got.resolves_margin
    # the sentences' share alone exceeds the margin's budget: no number of seeds does
    hopeless = power_statement(0.01, 0.1, 3, 1000, 0.25)
    assert hopeless.seeds_needed is None
    assert POWER_FACTOR * math.sqrt(0.1 * 1000 / hopeless.sentences_needed) <= 0.25
    assert POWER_FACTOR * math.sqrt(0.1 * 1000 / (hopeless.sentences_needed - 1)) > 0.25
    assert "needs more than 1000 sentences" in hopeless.text()


def test_without_a_margin_only_the_resolution_is_stated():
    got = power_statement(0.0004, 0.0001, 3, 3532, None)
    assert got.resolvable == pytest.approx(POWER_FACTOR * math.sqrt(0.0005))
    assert got.seeds_needed is None and got.sentences_needed is None and not got.resolves_margin
    assert "margin" not in got.text()
