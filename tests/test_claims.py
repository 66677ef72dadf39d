"""The paper's pruning findings checked on a pruning table (headcount.report.claims), and the rules
that turn them into verdicts: each rule has a test here that fails when the reading it replaced (a
verdict from any one significant run, "no loss" from an interval reaching 0, pruned - from scratch
against 0, role heads against the whole encoder) is put back."""

from itertools import combinations, product

import numpy as np
import pandas as pd
import pytest

import headcount.report.claims as claims_module
from headcount.report.claims import (
    FAILS,
    HOLDS,
    MIXED,
    NOT_RESOLVED,
    NOT_SEPARABLE,
    NOT_SHOWN,
    Claim,
    claims_markdown,
    claims_over_seeds_markdown,
    decoder_layers,
    heads_prunable,
    hypergeometric_upper_tail,
    mean_layer_tails,
    on_lambdas,
    order_gap,
    over_seeds_verdict,
    pruned_beats_scratch,
    runs_over_seeds,
    runs_over_seeds_markdown,
    shared_lambdas,
    specialised_heads_last,
    types_order,
    types_order_tails,
    within_layer_test,
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


def _table(*rows, with_role=7):
    return pd.DataFrame([_row("baseline", float("nan"), 48, 48, 48, role_none=48 - with_role), *rows])


# --------------------------------------------------------------------------------------------
# The within-layer test


def _heads_of(strata):
    """Per-head arrays (layer, has a role, kept) of strata (role, role kept, other, other kept)."""
    layers, role, kept = [], [], []
    for layer, (r, rk, o, ok) in enumerate(strata):
        layers += [layer] * (r + o)
        role += [True] * r + [False] * o
        kept += [i < rk for i in range(r)] + [i < ok for i in range(o)]
    return np.array(layers), np.array(role), np.array(kept)


def test_within_layer_test_is_every_relabelling_within_layers():
    strata = [(2, 1, 2, 2), (1, 1, 3, 0), (2, 0, 1, 1)]  # 4 + 4 + 3 heads
    layers, role, kept = _heads_of(strata)
    observed = int((role & kept).sum())
    totals = []
    # every assignment of each layer's role labels to its heads, equally likely under the null
    per_layer = [list(combinations(np.flatnonzero(layers == layer), int(role[layers == layer].sum())))
                 for layer in range(3)]
    for choice in product(*per_layer):
        totals.append(sum(int(kept[list(c)].sum()) for c in choice))
    totals = np.array(totals)
    test = within_layer_test(strata)
    assert test.observed == observed == 2
    assert test.p_more == pytest.approx((totals >= observed).mean())
    assert test.p_fewer == pytest.approx((totals <= observed).mean())
    assert test.expected == pytest.approx(totals.mean())
    assert test.informative == 3


def test_within_layer_test_against_a_seeded_permutation_of_role_labels():
    strata = [(3, 3, 5, 1), (2, 2, 6, 2), (4, 1, 4, 1), (8, 8, 0, 0), (0, 0, 8, 3)]
    layers, role, kept = _heads_of(strata)
    rng = np.random.default_rng(0)
    draws = 20_000
    totals = np.zeros(draws, dtype=int)
    for layer in np.unique(layers):
        idx = np.flatnonzero(layers == layer)
        shuffled = np.argsort(rng.random((draws, len(idx))), axis=1)  # role labels permuted within the layer
        totals += (role[idx][shuffled] & kept[idx][None, :]).sum(axis=1)
    observed = int((role & kept).sum())
    test = within_layer_test(strata)
    assert test.p_more == pytest.approx((totals >= observed).mean(), abs=0.01)
    assert test.p_fewer == pytest.approx((totals <= observed).mean(), abs=0.01)
    assert test.informative == 3  # layer 4 is all role heads, layer 5 has none


# Planted survival: the first layer is all role heads and survives whole (as Multi30k's rare-token
# layer does); the second has 2 role heads of 8 and keeps half of each kind; the rest keep few.
LAYER_ONLY = [(8, 8, 0, 0), (2, 1, 6, 3), (0, 0, 8, 1), (0, 0, 8, 0)]
# Role within layer: every layer keeps its two role heads and one other.
ROLE_WITHIN_LAYER = [(2, 2, 6, 1)] * 4


def test_survival_by_layer_alone_is_not_significant_within_layers_but_is_pooled():
    within = within_layer_test(LAYER_ONLY)
    assert within.p_more > 0.5 and within.observed == 9 and within.expected == pytest.approx(9.0)
    # the pooled test the verdict used to rest on calls the same data significant
    kept, with_role, kept_role = 13, 10, 9
    assert hypergeometric_upper_tail(32, with_role, kept, kept_role) < 0.01


def test_survival_by_role_within_layers_is_significant():
    within = within_layer_test(ROLE_WITHIN_LAYER)
    assert within.p_more == pytest.approx((6 / 56) ** 4) and within.p_more < 0.001
    assert within_layer_test([(2, 0, 6, 3)] * 4).p_fewer == pytest.approx((20 / 56) ** 4)  # role heads closed first


def _enc_layers(lam, strata, setting="enc"):
    rows = []
    for layer, (r, rk, o, ok) in enumerate(strata):
        rows += [{"setting": setting, "lam": lam, "type": "enc_self", "layer": layer, "role": "rare", "heads": r,
                  "kept": rk}] if r else []
        rows += [{"setting": setting, "lam": lam, "type": "enc_self", "layer": layer, "role": "none", "heads": o,
                  "kept": ok}] if o else []
    return pd.DataFrame(rows)


def _enc_pruning(strata, lam=0.1):
    """pruning.tsv's rows for one encoder-only run with these strata."""
    heads = sum(r + o for r, _, o, _ in strata)
    with_role = sum(r for r, _, _, _ in strata)
    kept = sum(rk + ok for _, rk, _, ok in strata)
    kept_none = sum(ok for _, _, _, ok in strata)
    return pd.DataFrame([_row("baseline", float("nan"), heads, 48, 48, role_none=heads - with_role),
                         _row("enc", lam, kept, 48, 48, role_none=kept_none)])


def test_specialised_heads_last_is_read_within_layers():
    # layer-confounded: the pooled test is significant, the within-layer one is not
    claim = specialised_heads_last(_enc_pruning(LAYER_ONLY), _enc_layers(0.1, LAYER_ONLY))
    assert claim.verdict == NOT_RESOLVED and "0 of 1 significant" in claim.basis
    assert "p = 0.00" in claim.measured.split("Pooled")[1]  # reported beside, no longer the verdict
    claim = specialised_heads_last(_enc_pruning(ROLE_WITHIN_LAYER), _enc_layers(0.1, ROLE_WITHIN_LAYER))
    assert claim.verdict == HOLDS and "1 of 1 significant" in claim.basis
    closed_first = [(2, 0, 6, 3)] * 4
    assert specialised_heads_last(_enc_pruning(closed_first), _enc_layers(0.1, closed_first)).verdict == FAILS
    # a run without a per-layer record is named, and cannot make the finding hold
    claim = specialised_heads_last(_enc_pruning(ROLE_WITHIN_LAYER), None)
    assert claim.verdict == NOT_SHOWN and "no per-layer record: lambda 0.1" in claim.measured
    assert specialised_heads_last(_table(_row("enc", 0.1, 8, 48, 48, role_none=8), with_role=0)).verdict == NOT_SHOWN


def test_the_positive_control_counts_in_the_specialised_verdict():
    pruning, layers = _enc_pruning(ROLE_WITHIN_LAYER), _enc_layers(0.1, ROLE_WITHIN_LAYER)
    confirms = _enc_layers(0.3, ROLE_WITHIN_LAYER)
    assert specialised_heads_last(pruning, layers, confirms).verdict == HOLDS
    claim = specialised_heads_last(pruning, layers, _enc_layers(0.3, LAYER_ONLY))  # the control cannot confirm
    assert claim.verdict == NOT_RESOLVED and "control: 0 of 1 significant" in claim.basis
    assert "Positive control" in claim.measured and "pooled" in claim.measured
    contradicts = _enc_layers(0.3, [(2, 0, 6, 3)] * 4)
    assert specialised_heads_last(pruning, layers, contradicts).verdict == MIXED


# --------------------------------------------------------------------------------------------
# No loss within a stated margin


def test_prunable_claims_need_no_loss_within_the_papers_margin():
    def run(setting, kept, low, high, diff="d_baseline"):
        counts = (kept, 48, 48) if setting == "enc" else (kept // 3, kept // 3, kept - 2 * (kept // 3))
        return _row(setting, 0.1, *counts, **{diff: (low + high) / 2, f"{diff}_low": low, f"{diff}_high": high})

    # encoder only: margin 0.25 BLEU, the paper's largest encoder-only cost
    assert heads_prunable(_table(run("enc", 10, -0.2, 0.6)), "enc").verdict == HOLDS
    claim = heads_prunable(_table(run("enc", 10, -0.8, 0.3)), "enc")  # reaches 0, but also -0.8
    assert claim.verdict == NOT_RESOLVED and "±0.55 BLEU" in claim.basis and "margin 0.25 BLEU" in claim.basis
    assert heads_prunable(_table(run("enc", 10, -0.6, -0.1)), "enc").verdict == NOT_RESOLVED  # a loss, but how big
    assert heads_prunable(_table(run("enc", 10, -1.5, -0.3)), "enc").verdict == FAILS  # beyond the margin
    assert heads_prunable(_table(run("enc", 13, -0.1, 0.3)), "enc").verdict == NOT_SHOWN  # more than a quarter
    claim = heads_prunable(_table(run("enc", 12, -0.2, 0.5), run("enc", 6, -2.0, -1.0)), "enc")
    assert claim.verdict == HOLDS and "12 of 48" in claim.measured
    # a loss with fewer heads than the paper ever kept (4 of 48, 26 of 144) does not refute it
    claim = heads_prunable(_table(run("enc", 3, -2.0, -1.0), run("enc", 0, -3.0, -2.0)), "enc")
    assert claim.verdict == NOT_RESOLVED and "no run in the paper's range, 4-12 of 48 heads" in claim.basis
    assert heads_prunable(_table(run("enc", 4, -2.0, -1.0), run("enc", 2, -3.0, -2.0)), "enc").verdict == FAILS
    claim = heads_prunable(_table(run("enc", 8, -0.9, 0.2), run("enc", 2, -3.0, -2.0)), "enc")
    assert claim.verdict == NOT_RESOLVED and "±0.55 BLEU" in claim.basis  # the run in range decides
    assert heads_prunable(_table(run("all", 25, -2.0, -1.0)), "all").verdict == NOT_RESOLVED
    assert heads_prunable(_table(run("all", 26, -2.0, -1.0)), "all").verdict == FAILS
    # all types: a quarter of the 144 heads in all, margin 0.70 (the paper's largest all-types cost)
    assert heads_prunable(_table(run("all", 36, -0.6, 0.3)), "all").verdict == HOLDS
    assert heads_prunable(_table(run("all", 36, -0.9, 0.3)), "all").verdict == NOT_RESOLVED
    assert heads_prunable(_table(run("all", 37, -0.6, 0.3)), "all").verdict == NOT_SHOWN
    assert heads_prunable(_table(run("enc", 10, -0.2, 0.3)), "all").verdict == NOT_SHOWN  # no all-types run
    # with a control, the cost of pruning is measured against it, not against the baseline
    costly = dict(run("enc", 10, -0.1, 0.3), d_control=-1.2, d_control_low=-2.0, d_control_high=-0.4)
    claim = heads_prunable(_table(costly), "enc")
    assert claim.verdict == FAILS and "against the control" in claim.measured
    assert "-1.20 [-2.00, -0.40]" in claim.measured
    free = dict(run("enc", 10, -1.5, -0.3), d_control=0.1, d_control_low=-0.2, d_control_high=0.4)
    assert heads_prunable(_table(free), "enc").verdict == HOLDS
    assert "0.25 BLEU" in claims_markdown("toy", [claim]) and "not resolved" in claims_markdown("toy", [claim])


def test_a_prunable_verdict_says_when_the_control_gains_over_the_baseline():
    # the control's check (rules of 2026-11-27): a control - baseline interval that excludes 0 on the
    # side of a gain, in BLEU or in NLL, means the baseline had not converged, and the verdict says so
    pruned = _row("enc", 0.1, 10, 48, 48, d_control=0.1, d_control_low=-0.2, d_control_high=0.4)

    def control(bleu, nll):
        return _row("enc", 0.0, 48, 48, 48, d_baseline=sum(bleu) / 2, d_baseline_low=bleu[0], d_baseline_high=bleu[1],
                    dnll_baseline=sum(nll) / 2, dnll_baseline_low=nll[0], dnll_baseline_high=nll[1])

    settled = heads_prunable(_table(pruned, control((-0.3, 0.4), (-0.002, 0.001))), "enc")
    assert settled.verdict == HOLDS and "not converged" not in settled.measured + settled.basis
    lost = heads_prunable(_table(pruned, control((-0.6, -0.1), (0.01, 0.02))), "enc")  # a loss is no gain
    assert "not converged" not in lost.measured + lost.basis
    for gain in [control((0.02, 0.68), (-0.002, 0.001)), control((-0.3, 0.4), (-0.0064, -0.0011))]:
        claim = heads_prunable(_table(pruned, gain), "enc")
        assert claim.verdict == HOLDS and claim.basis.endswith("baseline not converged")
        assert "has not converged" in claim.measured
    claim = heads_prunable(_table(pruned, control((0.02, 0.68), (-0.0064, -0.0011))), "enc")
    assert "BLEU +0.35 [+0.02, +0.68], NLL (nats/token) -0.0038 [-0.0064, -0.0011]" in claim.measured
    # only the setting's own control counts
    other = dict(control((0.02, 0.68), (-0.0064, -0.0011)), setting="all")
    assert "not converged" not in heads_prunable(_table(pruned, other), "enc").basis


def test_a_prunable_verdict_names_the_runs_whose_gates_had_not_decided():
    # the rules of 2026-11-27: above 5% of the gated heads with P(open) inside (0.1, 0.9), a run has
    # not decided, and the verdict says so
    def run(lam, undecided):
        return _row("enc", lam, 10, 48, 48, d_control=0.1, d_control_low=-0.2, d_control_high=0.4,
                    gates_undecided=undecided, gates_gated=48)

    assert "undecided" not in heads_prunable(_table(run(0.1, 2), run(0.2, 0)), "enc").basis  # 2 of 48: 4.2%
    claim = heads_prunable(_table(run(0.1, 3), run(0.2, 0)), "enc")  # 3 of 48: 6.2%
    assert claim.verdict == HOLDS and claim.basis.endswith("gates undecided at lambda 0.1")
    assert "lambda 0.1 (3 of 48)" in claim.measured and "lambda 0.2 (" not in claim.measured
    # a table from before the rule (no gate counts) claims nothing about them
    bare = _row("enc", 0.1, 10, 48, 48, d_control=0.1, d_control_low=-0.2, d_control_high=0.4)
    assert "undecided" not in heads_prunable(_table(bare), "enc").basis


def test_a_prunable_verdict_is_given_under_both_counting_rules_where_they_differ():
    # the rules of 2026-11-27: where the paper's count (log alpha < 0) and headcount's (evaluation gate
    # 0) differ by more than 2 heads, the verdict is given under both
    def run(kept, paper, low=-0.2, high=0.4, setting="enc"):
        counts = (kept, 48, 48) if setting == "enc" else (kept - 96, 48, 48)
        papers = (paper, 48, 48) if setting == "enc" else (paper - 96, 48, 48)
        return _row(setting, 0.1, *counts, d_control=(low + high) / 2, d_control_low=low, d_control_high=high,
                    **dict(zip(["retained_paper_rule_enc_self", "retained_paper_rule_dec_self",
                                "retained_paper_rule_dec_enc"], papers)))

    assert "paper's count" not in heads_prunable(_table(run(10, 12)), "enc").basis  # 2 apart: they agree
    # headcount's count keeps 10 (a quarter or fewer: holds); the paper's keeps 20 (more than a quarter)
    claim = heads_prunable(_table(run(10, 20)), "enc")
    assert claim.verdict == HOLDS and claim.basis.endswith(f"by the paper's count: {NOT_SHOWN}")
    assert "which differs from headcount's by more than 2 heads at lambda 0.1" in claim.measured
    # all types: the counts are totals over the three attention types
    claim = heads_prunable(_table(run(130, 30, setting="all")), "all")
    assert claim.verdict == NOT_SHOWN and claim.basis.endswith(f"by the paper's count: {HOLDS}")
    assert "paper's count" not in heads_prunable(_table(run(30, 32, setting="all")), "all").basis


# --------------------------------------------------------------------------------------------
# Pruned against from scratch, against the schedule's share


def _scratch_run(lam, low, high, kept=(10, 20, 30)):
    return _row("all", lam, *kept, d_pruned_scratch=(low + high) / 2, d_pruned_scratch_low=low,
                d_pruned_scratch_high=high)


def test_pruned_against_scratch_without_a_schedule_reference_needs_most_runs():
    assert pruned_beats_scratch(_table(_scratch_run(0.1, 0.2, 0.9))).verdict == HOLDS
    claim = pruned_beats_scratch(_table(_scratch_run(0.1, 0.2, 0.9), _scratch_run(0.3, -0.4, 0.5)))
    assert claim.verdict == NOT_RESOLVED and claim.basis == "1 of 2 significant"  # was "holds"
    assert pruned_beats_scratch(_table(_scratch_run(0.1, -0.9, -0.2))).verdict == FAILS
    assert pruned_beats_scratch(_table(_scratch_run(0.1, 0.2, 0.9), _scratch_run(0.3, -0.9, -0.2))).verdict == MIXED
    assert pruned_beats_scratch(_table(_scratch_run(0.1, -0.4, 0.5))).verdict == NOT_RESOLVED
    control = _row("all", 0, 48, 48, 48, d_pruned_scratch=2.0, d_pruned_scratch_low=1.0, d_pruned_scratch_high=3.0)
    assert pruned_beats_scratch(_table(control)).verdict == NOT_SHOWN  # the control is no pruned model


def test_pruned_against_scratch_is_read_against_the_schedules_share():
    unpruned = _scratch_run(0.01, 0.3, 1.9, kept=(48, 48, 48))  # the same heads: the schedules alone
    assert pruned_beats_scratch(_table(unpruned)).verdict == NOT_SHOWN
    # leads whose intervals exclude 0 but overlap the schedule's (the published run's reading)
    overlapping = [_scratch_run(0.1, 1.15, 3.45), _scratch_run(0.3, 0.81, 2.91), _scratch_run(0.5, 0.41, 2.72)]
    claim = pruned_beats_scratch(_table(unpruned, *overlapping))
    assert claim.verdict == NOT_SEPARABLE and claim.basis == "0 of 3 beyond the schedule"
    assert "schedules alone): lambda 0.01: +1.10 [+0.30, +1.90]" in claim.measured
    assert "better than its twin in 3 of 3" in claim.measured
    beyond = [_scratch_run(0.1, 2.0, 3.0), _scratch_run(0.3, 2.1, 3.5)]
    assert pruned_beats_scratch(_table(unpruned, *beyond)).verdict == HOLDS
    below = [_scratch_run(0.1, -0.9, 0.2), _scratch_run(0.3, -1.5, 0.1)]
    assert pruned_beats_scratch(_table(unpruned, *below)).verdict == FAILS


# --------------------------------------------------------------------------------------------
# Directional findings: most runs


def test_attention_types_order():
    """The order now has a test (issue 61): each run against as many heads kept at random among
    all types, Holm across runs; an order shown by a count alone no longer holds."""
    assert types_order(_table(_row("all", 0.1, 9, 19, 36), _row("all", 1, 2, 10, 30))).verdict == HOLDS
    assert types_order(_table(_row("all", 0.1, 40, 20, 5))).verdict == FAILS  # the reverse, significantly
    assert types_order(_table(_row("all", 0.1, 30, 19, 36))).verdict == NOT_RESOLVED  # out of order, no test
    assert types_order(_table(_row("all", 0.01, 48, 48, 48))).verdict == NOT_SHOWN  # nothing pruned
    half = types_order(_table(_row("all", 0.1, 9, 19, 36), _row("all", 1, 40, 20, 5)))
    assert half.verdict == MIXED and half.basis == "1 of 2 significant after Holm, 1 the other way"
    # in order, but too close to random to count once two runs share the correction
    weak = types_order(_table(_row("all", 0.1, 9, 19, 36), _row("all", 1, 0, 2, 19), _row("all", 3, 1, 2, 3)))
    assert weak.verdict == NOT_RESOLVED and weak.basis == "1 of 3 significant after Holm"


@pytest.mark.parametrize("kept", [(1, 2, 4), (0, 2, 3), (2, 2, 2), (4, 1, 0), (0, 0, 4)])
def test_the_type_order_tail_against_every_subset(kept):
    """Exact: every way to keep as many of 3 x 4 heads, the share of them at least as far in order."""
    heads = (4, 4, 4)
    labels = [t for t in range(3) for _ in range(heads[t])]
    subsets = list(combinations(range(12), sum(kept)))
    counts = [[sum(labels[i] == t for i in s) for t in range(3)] for s in subsets]
    exact = sum(order_gap(c, heads) >= order_gap(kept, heads) - 1e-12 for c in counts) / len(subsets)
    exact_rev = sum(order_gap(c[::-1], heads) >= order_gap(kept[::-1], heads) - 1e-12 for c in counts) / len(subsets)
    p, p_rev = types_order_tails(list(kept), list(heads), draws=40_000)
    assert p == pytest.approx(exact, abs=0.01) and p_rev == pytest.approx(exact_rev, abs=0.01)


def _decoder(kind, kept_per_layer, lam=0.3, heads=8):
    """The layer-survival rows of one all-types run for one decoder attention type."""
    return pd.DataFrame([{"setting": "all", "lam": lam, "type": kind, "layer": layer, "role": float("nan"),
                          "heads": heads, "kept": kept} for layer, kept in enumerate(kept_per_layer)])


LOW, SPREAD = [4, 4, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]  # eight heads kept in the two lowest layers; one a layer


def test_decoder_layer_claims_against_heads_kept_at_random():
    assert decoder_layers(_decoder("dec_self", LOW), "dec_self").verdict == HOLDS
    assert decoder_layers(_decoder("dec_enc", LOW), "dec_enc").verdict == FAILS
    high = LOW[::-1]
    assert decoder_layers(_decoder("dec_enc", high), "dec_enc").verdict == HOLDS
    assert decoder_layers(_decoder("dec_self", high), "dec_self").verdict == FAILS
    assert decoder_layers(_decoder("dec_enc", SPREAD), "dec_enc").verdict == NOT_RESOLVED  # no preference
    assert decoder_layers(_decoder("dec_enc", [8] * 6), "dec_enc").verdict == NOT_SHOWN  # nothing pruned


def test_a_directional_finding_holds_only_in_most_runs():
    runs = pd.concat([_decoder("dec_enc", LOW[::-1], lam=0.1), _decoder("dec_enc", LOW[::-1], lam=0.3),
                      _decoder("dec_enc", SPREAD, lam=0.5), _decoder("dec_enc", SPREAD, lam=1.0)])
    claim = decoder_layers(runs, "dec_enc")
    assert claim.verdict == NOT_RESOLVED and claim.basis == "2 of 4 significant after Holm"  # was "holds"
    three = pd.concat([runs, _decoder("dec_enc", LOW[::-1], lam=2.0)])
    assert decoder_layers(three, "dec_enc").verdict == HOLDS  # 3 of 5


def test_schedule_matched_twins_are_read_against_zero():
    """Twins on the pruned model's own schedule (prune.scratch_schedule: pruned) have no schedule to
    separate: a lead whose interval excludes 0 counts, even beside a run that pruned nothing."""
    unpruned = dict(_scratch_run(0.01, 0.3, 1.9, kept=(48, 48, 48)), schedule_scratch="pruned")
    leads = [dict(_scratch_run(0.1, 1.15, 3.45), schedule_scratch="pruned"),
             dict(_scratch_run(0.3, 0.81, 2.91), schedule_scratch="pruned")]
    claim = pruned_beats_scratch(_table(unpruned, *leads))
    assert claim.verdict == HOLDS and claim.basis == "2 of 2 significant"
    assert "(schedule-matched twin)" in claim.measured and "schedules alone" not in claim.measured
    # a Noam twin in the same grid is still read against the schedules' share of a Noam twin
    noam_unpruned = _scratch_run(0.01, 0.3, 1.9, kept=(48, 48, 48))
    mixed = pruned_beats_scratch(_table(noam_unpruned, leads[0], _scratch_run(0.5, 0.41, 2.72)))
    assert mixed.verdict == NOT_SEPARABLE and "of the 1 against Noam twins" in mixed.measured


def test_over_seeds_counts_each_verdict_most_frequent_first():
    assert over_seeds_verdict([HOLDS, HOLDS, HOLDS]) == "holds in 3 of 3 seeds"
    assert over_seeds_verdict([NOT_RESOLVED, HOLDS, NOT_RESOLVED]) == (
        "not resolved in 2 of 3 seeds; holds in 1 of 3 seeds")
    # a tie goes in the rules' order: holds before does not hold
    assert over_seeds_verdict([FAILS, HOLDS]) == "holds in 1 of 2 seeds; does not hold in 1 of 2 seeds"


def _grid(enc, all_):
    """A pruning (or layer-survival) table's setting and lambda columns: the baseline, then each run."""
    return pd.DataFrame([{"setting": "baseline", "lam": float("nan")}, *({"setting": "enc", "lam": lam} for lam in enc),
                         *({"setting": "all", "lam": lam} for lam in all_)])


def test_the_lambdas_every_seed_ran_and_the_rows_of_them():
    seed1 = _grid([0, 0.03, 0.07, 0.1], [0, 0.1, 0.1 + 0.2, 0.5])  # 0.30000000000000004, as arithmetic gives it
    seed2 = _grid([0, 0.03, 0.1], [0, 0.3, 0.5])
    lambdas = shared_lambdas([seed1, seed2])
    assert lambdas == {"all": [0, 0.3, 0.5], "enc": [0, 0.03, 0.1]}
    kept = on_lambdas(seed1, lambdas)
    assert kept["setting"].tolist() == ["baseline", "enc", "enc", "enc", "all", "all", "all"]
    assert kept["lam"].tolist()[1:] == [0, 0.03, 0.1, 0, 0.1 + 0.2, 0.5]


def test_seeds_are_judged_on_the_lambdas_all_ran_with_their_own_grid_beside(monkeypatch):
    """Seed 1 runs more lambdas than the others: counting its verdict on its own grid would count
    unlike with unlike. A stand-in rule makes finding x fail on any all-types lambda outside 0 and
    0.5, so only the judging on shared lambdas gives seed 1 "holds"."""
    seen = []

    def rule(pruning, layers, control):
        seen.append((len(pruning), len(layers), control))
        extra = set(pruning.loc[pruning["setting"] == "all", "lam"]) - {0, 0.5}
        return [Claim("x", "paper x", "m", FAILS if extra else HOLDS), Claim("y", "paper y", "m", NOT_RESOLVED)]

    monkeypatch.setattr(claims_module, "pruning_claims", rule)
    seed1, seed2 = _grid([0, 0.1], [0, 0.1, 0.5]), _grid([0, 0.1], [0, 0.5])
    text = claims_over_seeds_markdown("toy", {1: (seed1, seed1), 2: (seed2, seed2)}, control_layers="control")
    assert "| paper x | holds (own grid: does not hold) | holds | **holds in 2 of 2 seeds** |" in text
    assert "| paper y | not resolved | not resolved | **not resolved in 2 of 2 seeds** |" in text
    assert "(all: 0, 0.5; enc: 0, 0.1)" in text
    # judged twice per seed, on shared and own lambdas, pruning and layer tables cut alike, the control kept
    assert sorted(seen) == [(5, 5, "control"), (5, 5, "control"), (5, 5, "control"), (6, 6, "control")]


def test_the_runs_over_seeds_are_each_seeds_own_numbers_on_the_shared_lambdas():
    def seed(shift, extra_lambda=None):
        rows = [_row("baseline", float("nan"), 48, 48, 48)]
        for lam, enc in [(0, 48), (0.1, 10 + shift), *([(extra_lambda, 3)] if extra_lambda else [])]:
            rows.append(_row("enc", lam, enc, 48, 48, d_control=-0.5 - shift, d_control_low=-1.25 - shift,
                             d_control_high=0.25 - shift))
        rows.append(_row("all", 0.5, 5 + shift, 10, 20, d_control=-2, d_control_low=-3, d_control_high=-1,
                         d_pruned_scratch=0.1 * shift, d_pruned_scratch_low=-1, d_pruned_scratch_high=1))
        return pd.DataFrame(rows)

    text = runs_over_seeds_markdown({2: seed(1), 1: seed(0, extra_lambda=0.3)})
    # the mean over seeds: -0.5 and -1.5, sd 1/sqrt(2), t(0.975, 1 df) 12.706, half-width 12.706 / 2 = 6.353
    assert ("| enc | 0.1 | 10/48 kept, -0.50 [-1.25, +0.25] | 11/48 kept, -1.50 [-2.25, -0.75] "
            "| -1.00 [-7.35, +5.35] |") in text
    assert ("| all | 0.5 | 35/144 kept, -2.00 [-3.00, -1.00] | 36/144 kept, -2.00 [-3.00, -1.00] "
            "| -2.00 [-2.00, -2.00] |") in text
    # the twins' table: 0 and 0.1, half-width 12.706 * 0.05 = 0.635
    assert "| all | 0.5 | +0.00 [-1.00, +1.00] | +0.10 [-1.00, +1.00] | +0.05 [-0.59, +0.69] |" in text
    # a seed without a twin at a lambda: no mean over the others
    no_twin = seed(2)
    no_twin.loc[no_twin["setting"] == "all", "d_pruned_scratch_low"] = float("nan")
    assert "| all | 0.5 | +0.00 [-1.00, +1.00] | +0.10 [-1.00, +1.00] | - | - |" in runs_over_seeds_markdown(
        {1: seed(0), 2: seed(1), 3: no_twin})
    assert "mean over seeds" not in runs_over_seeds_markdown({1: seed(0)})  # one seed: nothing to pool
    assert "| enc | 0.3 |" not in text and "| enc | 0 |" not in text  # seed 1's alone, and the control itself
    assert runs_over_seeds_markdown({1: seed(0), 2: _table(_row("enc", 0, 48, 48, 48))}).startswith(
        "No lambda besides the lambda = 0 controls ran on every seed")
    # no twin in any seed: no twins' table
    assert "from scratch" not in runs_over_seeds_markdown({1: seed(0).drop(columns=["d_pruned_scratch_low"])})


def _seed_grid(shift, lambdas):
    """A seed's all-types pruning table: a twin only for seed shift 0, differences that tell seeds apart."""
    rows = [_row("all", lam, 10 + shift, 10, 10 + int(10 * lam), d_control=-lam - shift,
                 d_control_low=-lam - shift - 1, d_control_high=-lam - shift + 1,
                 **({} if shift else {"d_pruned_scratch": lam, "d_pruned_scratch_low": lam - 1,
                                      "d_pruned_scratch_high": lam + 1}))
            for lam in lambdas]
    return _table(*rows)


def test_the_runs_over_seeds_table_is_each_seeds_rows_on_the_shared_lambdas():
    """The rows the markdown and the seeds' figure read: every seed's own run at each shared lambda,
    looked up here by hand, none of a lambda one seed alone ran, no control, NaN where no twin."""
    seed = _seed_grid
    prunings = {3: seed(2, [0, 0.3, 1]), 1: seed(0, [0, 0.1, 0.3, 1])}
    runs = runs_over_seeds(prunings)
    assert list(zip(runs["lam"], runs["seed"])) == [(0.3, 1), (0.3, 3), (1, 1), (1, 3)]
    for row in runs.itertuples():
        table = prunings[row.seed]
        own = table[(table["setting"] == "all") & (table["lam"] == row.lam)].iloc[0]
        assert (row.kept, row.heads) == (own["retained_total"], 144)
        assert (row.d_control, row.d_control_low, row.d_control_high) == (
            own["d_control"], own["d_control_low"], own["d_control_high"])
    assert runs.loc[runs["seed"] == 3, "d_pruned_scratch_low"].isna().all()  # seed 3 trained no twin
    assert runs.loc[runs["seed"] == 1, "d_pruned_scratch"].tolist() == [0.3, 1]
    assert runs_over_seeds({1: seed(0, [0]), 2: seed(1, [0])}).empty


def test_the_runs_over_seeds_figure_draws_each_seeds_differences(monkeypatch):
    """Each panel's points are its seed's rows: pruned - control for every seed, pruned - from scratch
    for the seed with twins only, with minus the paper's all-types cost drawn; no shared lambda: no panel."""
    from headcount.report import plots

    drawn = {}

    def save(fig, path):
        for ax in fig.axes:
            drawn[ax.get_title()] = {c.get_label(): (list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata()))
                                     for c in ax.containers}
            drawn[ax.get_title(), "levels"] = {float(line.get_ydata()[0]) for line in ax.get_lines()
                                               if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2}

    monkeypatch.setattr(plots, "save", save)
    plots.runs_over_seeds_figure(runs_over_seeds({1: _seed_grid(0, [0, 0.3, 1]), 3: _seed_grid(2, [0, 0.3, 1])}),
                                 "unused.png", "toy")
    control = drawn["all attention types pruned: pruned - control"]
    # heads kept: enc + dec + dec-enc, 10 + shift, 10, 10 + 10 lambda
    assert control == {"seed 1": ([33, 40], [-0.3, -1]), "seed 3": ([35, 42], [-2.3, -3])}
    assert drawn["all attention types pruned: pruned - control", "levels"] == {0.0, -0.70}
    assert drawn["all attention types pruned: pruned - from scratch"] == {"seed 1": ([33, 40], [0.3, 1])}
    drawn.clear()
    plots.runs_over_seeds_figure(runs_over_seeds({1: _seed_grid(0, [0]), 2: _seed_grid(1, [0])}), "unused.png", "toy")
    assert drawn == {"": {}, ("", "levels"): set()}
