"""The paper's pruning findings checked on a pruning table (headcount.claims)."""

from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from headcount.report.claims import (
    FAILS,
    HOLDS,
    MIXED,
    NOT_SHOWN,
    decoder_layers,
    heads_prunable,
    hypergeometric_upper_tail,
    mean_layer_tails,
    pruned_beats_scratch,
    specialised_heads_last,
    types_order,
)


def test_hypergeometric_tail_against_counting_every_subset():
    heads = range(9)
    with_role = {0, 4, 7}
    for kept in range(10):
        subsets = list(combinations(heads, kept))
        for observed in range(4):
            share = sum(len(with_role.intersection(s)) >= observed for s in subsets) / len(subsets)
            assert hypergeometric_upper_tail(9, 3, kept, observed) == pytest.approx(share)


def test_mean_layer_tails_against_every_subset():
    layers = [1, 1, 2, 2, 3, 3, 4, 4]
    kept = [True, False, True, False, False, False, False, True]  # mean 7/3
    means = np.array([np.mean([layers[i] for i in s]) for s in combinations(range(8), 3)])
    observed = 7 / 3
    low, high = mean_layer_tails(layers, kept)
    assert low == pytest.approx((means <= observed + 1e-9).mean(), abs=0.01)
    assert high == pytest.approx((means >= observed - 1e-9).mean(), abs=0.01)


def _row(setting, lam, enc, dec, cross, **extra):
    return {"setting": setting, "lam": lam, "control": lam == 0, "retained_enc_self": enc, "retained_dec_self": dec,
            "retained_dec_enc": cross, "retained_total": enc + dec + cross, **extra}


def _table(*rows):
    return pd.DataFrame([_row("baseline", float("nan"), 48, 48, 48, role_none=41), *rows])


def test_prunable_claims_need_a_quarter_of_the_heads_or_fewer_without_a_loss():
    def run(setting, kept, low, high):
        counts = (kept, 48, 48) if setting == "enc" else (kept // 3, kept // 3, kept - 2 * (kept // 3))
        return _row(setting, 0.1, *counts, d_baseline=(low + high) / 2, d_baseline_low=low, d_baseline_high=high)

    assert heads_prunable(_table(run("enc", 10, -0.8, 0.3)), "enc").verdict == HOLDS
    assert heads_prunable(_table(run("enc", 10, -1.5, -0.2)), "enc").verdict == FAILS
    assert heads_prunable(_table(run("enc", 13, -0.8, 0.3)), "enc").verdict == NOT_SHOWN  # more than a quarter
    claim = heads_prunable(_table(run("enc", 12, -0.5, 0.5), run("enc", 6, -2.0, -1.0)), "enc")
    assert claim.verdict == HOLDS and "12 of 48" in claim.measured
    # all types: a quarter of the 144 heads in all
    assert heads_prunable(_table(run("all", 36, -0.8, 0.3)), "all").verdict == HOLDS
    assert heads_prunable(_table(run("all", 37, -0.8, 0.3)), "all").verdict == NOT_SHOWN
    assert heads_prunable(_table(run("enc", 10, -0.8, 0.3)), "all").verdict == NOT_SHOWN  # no all-types run
    # with a control, the cost of pruning is measured against it, not against the baseline
    costly = dict(run("enc", 10, -0.8, 0.3), d_control=-1.2, d_control_low=-2.0, d_control_high=-0.4)
    claim = heads_prunable(_table(costly), "enc")
    assert claim.verdict == FAILS and "against the control" in claim.measured
    assert "-1.20 [-2.00, -0.40]" in claim.measured
    free = dict(run("enc", 10, -1.5, -0.2), d_control=-0.1, d_control_low=-0.6, d_control_high=0.4)
    assert heads_prunable(_table(free), "enc").verdict == HOLDS


def test_pruned_against_scratch_counts_only_intervals_that_exclude_zero():
    def run(lam, low, high):
        return _row("all", lam, 10, 20, 30, d_pruned_scratch=(low + high) / 2, d_pruned_scratch_low=low,
                    d_pruned_scratch_high=high)

    assert pruned_beats_scratch(_table(run(0.1, 0.2, 0.9), run(0.3, -0.4, 0.5))).verdict == HOLDS
    assert pruned_beats_scratch(_table(run(0.1, -0.9, -0.2))).verdict == FAILS
    assert pruned_beats_scratch(_table(run(0.1, 0.2, 0.9), run(0.3, -0.9, -0.2))).verdict == MIXED
    assert pruned_beats_scratch(_table(run(0.1, -0.4, 0.5))).verdict == NOT_SHOWN
    control = _row("all", 0, 48, 48, 48, d_pruned_scratch=2.0, d_pruned_scratch_low=1.0, d_pruned_scratch_high=3.0)
    assert pruned_beats_scratch(_table(control)).verdict == NOT_SHOWN  # the control is no pruned model
    # a run that closed no gate compares schedules, not pruning: reported, not counted
    unpruned = _row("all", 0.01, 48, 48, 48, d_pruned_scratch=1.1, d_pruned_scratch_low=0.3,
                    d_pruned_scratch_high=1.9)
    claim = pruned_beats_scratch(_table(unpruned))
    assert claim.verdict == NOT_SHOWN and "schedules alone): lambda 0.01: +1.10 [+0.30, +1.90]" in claim.measured
    claim = pruned_beats_scratch(_table(unpruned, run(0.1, -0.9, -0.2)))
    assert claim.verdict == FAILS and "from scratch better in 1, no difference shown in 0 of 1;" in claim.measured


def test_attention_types_order():
    assert types_order(_table(_row("all", 0.1, 9, 19, 36), _row("all", 1, 0, 4, 18))).verdict == HOLDS
    assert types_order(_table(_row("all", 0.1, 30, 19, 36))).verdict == FAILS
    assert types_order(_table(_row("all", 0.01, 48, 48, 48))).verdict == NOT_SHOWN  # nothing pruned


def _heads(kind, kept_layers, layers=6, n_heads=8, lam=0.3):
    """A per-head table of one all-types run: the heads kept are the first of each listed layer."""
    rows = []
    for layer in range(layers):
        for head in range(n_heads):
            rows.append({"setting": "all", "lam": lam, "type": kind, "layer": layer, "head": head,
                         "retained": head < kept_layers.count(layer)})
    return pd.DataFrame(rows)


def test_decoder_layer_claims_against_heads_kept_at_random():
    low_layers = [0, 0, 0, 1, 1, 1, 0, 1]  # eight heads kept, four in each of the two lowest layers
    assert decoder_layers(_heads("dec_self", low_layers), "dec_self").verdict == HOLDS
    assert decoder_layers(_heads("dec_enc", low_layers), "dec_enc").verdict == FAILS
    high_layers = [5 - layer for layer in low_layers]
    assert decoder_layers(_heads("dec_enc", high_layers), "dec_enc").verdict == HOLDS
    assert decoder_layers(_heads("dec_self", high_layers), "dec_self").verdict == FAILS
    spread = _heads("dec_enc", [0, 1, 2, 3, 4, 5])  # one head a layer: no preference
    assert decoder_layers(spread, "dec_enc").verdict == NOT_SHOWN


def test_specialised_heads_last_against_the_hypergeometric_tail():
    # 7 of 48 heads have a role; a run keeping 8 heads, 6 of them with a role, is far above chance
    kept_roles = _row("enc", 0.1, 8, 48, 48, role_none=2)
    claim = specialised_heads_last(_table(kept_roles))
    assert claim.verdict == HOLDS and "6 of 7" in claim.measured
    assert specialised_heads_last(_table(_row("enc", 0.1, 40, 48, 48, role_none=40))).verdict == FAILS
    no_roles = pd.DataFrame([_row("baseline", float("nan"), 48, 48, 48, role_none=48), kept_roles])
    assert specialised_heads_last(no_roles).verdict == NOT_SHOWN
