"""The paper's pruning findings (SPEC section 1, item 8), each checked on one run's pruning table,
and the rules that turn what a run measured into a verdict (SPEC section 3: verdicts that say what
their test resolves). Every check uses these rules and no other:

- **No loss** (the prunable findings): a run shows "no loss" only where the whole 95% paired-
  bootstrap interval of pruned - control lies above -margin, the margin being the paper's own
  largest cost for the setting (NO_LOSS_MARGIN: what the paper calls "little BLEU"); it shows a
  loss beyond the margin where the whole interval lies below -margin; otherwise it does not
  resolve the question, at a resolution of half its interval's width. Runs keeping a quarter of
  the heads or fewer test the finding; only those keeping at least the paper's fewest (4 of 48
  encoder heads, 26 of 144 in all) can refute it.
- **Directional findings** (an order of attention types, the layers survivors sit in, role heads
  kept): "holds" only where most runs (more than half) show the finding significantly and none its
  opposite, "does not hold" the mirror image, "mixed" where runs show both; otherwise not resolved.
  The verdict says "k of n significant".
- **Pruned against from scratch** is read against the schedule's share: a run that pruned no head
  differs from its twin by the training schedules alone, so a pruned run's lead over its twin
  counts for pruning only where its interval lies wholly above that schedules-only interval, and
  against it only where it lies wholly below; an overlap is not separable from the schedule.
- **Specialised heads last** is tested within layers (an exact permutation test of role labels
  within each layer), on the experiment and on the positive control, whose functions are known:
  the finding holds only where both show it.

Head counts and layers have no test sentences to resample, so they are tested against heads kept
at random in the same number: an exact hypergeometric tail for how many heads with a role survive
(pooled over layers, reported beside the within-layer test), an exact within-layer permutation
tail, and a seeded Monte Carlo tail for the mean layer of the survivors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from math import ceil, comb

import numpy as np
import pandas as pd

from headcount.analysis.roles.registry import NO_ROLE
from headcount.report.power import holm
from headcount.report.preregistered import (
    ALPHA,
    COUNTING_RULES_AGREE,
    GATE_UNDECIDED,
    MAX_UNDECIDED_SHARE,
    MONTE_CARLO_DRAWS,
    NO_LOSS_MARGIN,
)
from headcount.report.seed_statistics import t_interval
from headcount.training.convergence import control_gains

HOLDS, FAILS, MIXED, NOT_SHOWN = "holds", "does not hold", "mixed", "not shown either way"
NOT_RESOLVED = "not resolved"
NOT_SEPARABLE = "not separable from the schedule"
# ALPHA: a head-count or layer test counts when its one-sided p is below it. NO_LOSS_MARGIN: "little
# BLEU" as the paper measured it, its largest cost at the sparsity each finding names: the paper's own
# numbers, not the seeds' spread, because the claim is the paper's. Both fixed in preregistered.py.


@dataclass(frozen=True)
class Claim:
    name: str
    paper: str  # the finding as Voita et al. (2019) state it
    measured: str  # what this run shows, with intervals or p-values
    verdict: str  # HOLDS, FAILS, MIXED, NOT_RESOLVED, NOT_SEPARABLE or NOT_SHOWN
    basis: str = ""  # what the verdict rests on: "k of n significant", the margin and resolution


# --------------------------------------------------------------------------------------------
# The rules


def directional_verdict(agree: int, disagree: int, runs: int) -> str:
    """Most runs (more than half) significant for the finding and none against: HOLDS; the mirror
    image: FAILS; runs both ways: MIXED; no run: NOT_SHOWN; otherwise NOT_RESOLVED."""
    if not runs:
        return NOT_SHOWN
    if 2 * agree > runs and not disagree:
        return HOLDS
    if 2 * disagree > runs and not agree:
        return FAILS
    return MIXED if agree and disagree else NOT_RESOLVED


def significant_basis(agree: int, disagree: int, runs: int, what: str = "significant") -> str:
    return f"{agree} of {runs} {what}" + (f", {disagree} the other way" if disagree else "")


def no_loss_reading(low: float, high: float, margin: float) -> str:
    """One run's pruned - control interval against the margin: HOLDS (no loss beyond it), FAILS (a
    loss beyond it shown) or NOT_RESOLVED."""
    if low >= -margin:
        return HOLDS
    if high < -margin:
        return FAILS
    return NOT_RESOLVED


def resolution(low: float, high: float) -> float:
    """What an interval can tell apart: half its width."""
    return (high - low) / 2


def schedule_reading(low: float, high: float, schedule_low: float, schedule_high: float) -> int:
    """+1: the pruned run's lead over its twin lies wholly above the schedules-only interval (pruning
    adds to it); -1: wholly below (pruning loses what the schedule gives); 0: not separable."""
    if low > schedule_high:
        return 1
    if high < schedule_low:
        return -1
    return 0


def combined_verdict(experiment: str, control: str | None) -> str:
    """A reading of the experiment and one of the positive control: the finding holds only where
    both show it (the control is where the functions are known; what it does not confirm is no
    finding), does not hold where either shows the opposite and neither shows it, and is mixed where
    one shows it and the other the opposite. Without a control, the experiment's reading."""
    if control is None:
        return experiment
    readings = {experiment, control}
    if readings == {HOLDS}:
        return HOLDS
    if HOLDS in readings and FAILS in readings:
        return MIXED
    if FAILS in readings and HOLDS not in readings:
        return FAILS
    return NOT_RESOLVED if readings != {NOT_SHOWN} else NOT_SHOWN


# --------------------------------------------------------------------------------------------
# The tests


def hypergeometric_upper_tail(population: int, successes: int, draws: int, observed: int) -> float:
    """P(X >= observed) for X the successes among `draws` items drawn without replacement."""
    total = comb(population, draws)
    return sum(comb(successes, k) * comb(population - successes, draws - k)
               for k in range(max(observed, 0), min(successes, draws) + 1)) / total


def mean_layer_tails(layers: list[int], kept: list[bool], draws: int = MONTE_CARLO_DRAWS,
                     seed: int = 0) -> tuple[float, float]:
    """(P(mean <= observed), P(mean >= observed)) for the mean layer of as many heads as were kept,
    drawn at random without replacement from all heads (Monte Carlo, add-one smoothed)."""
    layers_arr = np.asarray(layers, dtype=float)
    kept_arr = np.asarray(kept, dtype=bool)
    n = int(kept_arr.sum())
    observed = layers_arr[kept_arr].mean()
    rng = np.random.default_rng(seed)
    # One random permutation per draw: its first n heads are the random survivors.
    order = np.argsort(rng.random((draws, len(layers_arr))), axis=1)[:, :n]
    means = layers_arr[order].mean(axis=1)
    eps = 1e-9  # the same mean, computed in another order
    low = (1 + int((means <= observed + eps).sum())) / (draws + 1)
    high = (1 + int((means >= observed - eps).sum())) / (draws + 1)
    return low, high


def order_gap(kept: Sequence[int], heads: Sequence[int]) -> float:
    """How far three attention types' retained shares are in the paper's order (enc-self, then
    dec-self, then dec-enc, fewest to most): the smaller of the two gaps; negative where out of order."""
    share = [k / h for k, h in zip(kept, heads)]
    return min(share[1] - share[0], share[2] - share[1])


def types_order_tails(kept: Sequence[int], heads: Sequence[int], draws: int = MONTE_CARLO_DRAWS,
                      seed: int = 0) -> tuple[float, float]:
    """(P(gap >= observed), P(reversed gap >= observed reversed)) with as many heads kept at random
    among all the types' heads, without replacement (Monte Carlo, add-one smoothed): the test behind
    "encoder self-attention first, decoder-encoder last", and the same for the opposite order."""
    rng = np.random.default_rng(seed)
    counts = rng.multivariate_hypergeometric(list(heads), sum(kept), size=draws)  # (draws, 3)
    shares = counts / np.asarray(heads, dtype=float)
    gaps = np.minimum(shares[:, 1] - shares[:, 0], shares[:, 2] - shares[:, 1])
    reversed_gaps = np.minimum(shares[:, 0] - shares[:, 1], shares[:, 1] - shares[:, 2])
    eps = 1e-12
    observed, observed_reversed = order_gap(kept, heads), order_gap(kept[::-1], heads[::-1])
    return ((1 + int((gaps >= observed - eps).sum())) / (draws + 1),
            (1 + int((reversed_gaps >= observed_reversed - eps).sum())) / (draws + 1))


def holm_counts(p_agree: Sequence[float], p_disagree: Sequence[float]) -> tuple[int, int]:
    """Runs significant for the finding and against it, each family corrected by Holm's method
    (preregistered.CORRECTION) across the finding's runs."""
    return (sum(p < ALPHA for p in holm(list(p_agree))), sum(p < ALPHA for p in holm(list(p_disagree))))


@dataclass(frozen=True)
class WithinLayers:
    """Role heads kept against what each layer's own survival predicts."""
    observed: int  # heads with a role kept
    expected: float  # the same, were each layer's survivors drawn at random from that layer
    p_more: float  # P(T >= observed) over every relabelling of roles within the layers
    p_fewer: float  # P(T <= observed)
    informative: int  # layers with heads of both kinds and some but not all kept


def within_layer_test(strata: Iterable[tuple[int, int, int, int]]) -> WithinLayers:
    """The permutation test of role labels within each layer, exact: strata are, per layer, (heads
    with a role, of them kept, heads without, of them kept). Given each layer's number of
    survivors, the role heads kept in a layer are hypergeometric, and the statistic T (role heads
    kept, summed over layers) is distributed as the convolution of the layers' distributions: what
    enumerating every within-layer permutation gives, so no seed is needed. A layer whose heads all
    have a role, or none, or whose heads are all kept or all closed, cannot move T: it tells
    nothing about role given layer (the exact conditional test of a common odds ratio of 1 in
    stratified 2x2 tables)."""
    distribution = np.array([1.0])
    observed, expected, informative = 0, 0.0, 0
    for role, role_kept, other, other_kept in strata:
        heads, kept = role + other, role_kept + other_kept
        if not heads:
            continue
        pmf = np.array([comb(role, x) * comb(other, kept - x) for x in range(min(role, kept) + 1)], dtype=float)
        distribution = np.convolve(distribution, pmf / pmf.sum())
        observed += role_kept
        expected += kept * role / heads
        informative += 0 < role < heads and 0 < kept < heads
    p_more = float(min(1.0, distribution[observed:].sum()))
    p_fewer = float(min(1.0, distribution[:observed + 1].sum()))
    return WithinLayers(observed, expected, p_more, p_fewer, informative)


# --------------------------------------------------------------------------------------------
# The pruning table and the table of heads kept per layer


def _pruned_runs(pruning: pd.DataFrame, setting: str) -> pd.DataFrame:
    return pruning[(pruning["setting"] == setting) & ~pruning["control"].astype(bool)].sort_values("lam")


def _baseline(pruning: pd.DataFrame) -> pd.Series:
    return pruning[pruning["setting"] == "baseline"].iloc[0]


def _layer_rows(layers: pd.DataFrame | None, setting: str, kind: str) -> pd.DataFrame:
    """The rows of a layer-survival table (pruning_report.layer_survival: setting, lam, type, layer,
    role, heads, kept) for one setting and attention type."""
    if layers is None or layers.empty:
        return pd.DataFrame(columns=["setting", "lam", "type", "layer", "role", "heads", "kept"])
    return layers[(layers["setting"] == setting) & (layers["type"] == kind)]


def role_strata(rows: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    """One run's encoder rows as within_layer_test's strata."""
    strata = []
    for _, layer in rows.groupby("layer", sort=True):
        with_role = layer[layer["role"].fillna(NO_ROLE) != NO_ROLE]
        without = layer[layer["role"].fillna(NO_ROLE) == NO_ROLE]
        strata.append((int(with_role["heads"].sum()), int(with_role["kept"].sum()),
                       int(without["heads"].sum()), int(without["kept"].sum())))
    return strata


# --------------------------------------------------------------------------------------------
# The checks

# setting -> (name, the paper's finding, the pruning table's column of heads counted, the margin's source,
# the fewest heads the paper kept, of how many)
PRUNABLE = {
    "enc": ("encoder heads prunable", "Most encoder heads can be pruned for little BLEU (encoder only): 10 of 48 "
            "kept cost 0.15 BLEU on WMT, 4 of 48 cost 0.25 on OpenSubtitles.", "retained_enc_self",
            "the paper's largest encoder-only cost", (4, 48)),
    "all": ("most heads prunable", "Table 2: with all attention types gated, 36 and 26 of 144 heads kept cost 0.54 "
            "and 0.70 BLEU on WMT, 28 kept cost 0.13 on OpenSubtitles.", "retained_total",
            "the paper's largest all-types cost", (26, 144)),
}
PAPER_FEWEST = ", ".join(f"{kept} of {of} {'encoder heads' if s == 'enc' else 'in all'}"
                         for s, (*_, (kept, of)) in PRUNABLE.items())


NOT_CONVERGED = "baseline not converged"  # what a verdict's basis adds where the control's check fails


def unconverged_note(bleu: tuple[float, float, float], nll: tuple[float, float, float]) -> str:
    """What a verdict says where the control's check (training.convergence.control_gains) finds that
    the baseline had not converged; "" where it had. `bleu`, `nll`: control - baseline and its paired
    interval (NaN where not measured)."""
    if not control_gains(bleu[1], nll[2]):
        return ""
    parts = [f"{label} {d:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"
             for label, (d, low, high), digits in (("BLEU", bleu, 2), ("NLL (nats/token)", nll, 4))
             if not np.isnan(low)]
    return (f"The baseline has not converged in the sense that matters: its lambda = 0 control gains over "
            f"it ({', '.join(parts)}), so fine-tuning alone still improves it.")


def _control_against_baseline(pruning: pd.DataFrame, setting: str) -> tuple[tuple, tuple] | None:
    """The setting's control - baseline, BLEU and NLL with their intervals, from the pruning table."""
    controls = pruning[(pruning["setting"] == setting) & pruning["control"].astype(bool)]
    if controls.empty:
        return None
    row = controls.iloc[0]
    return tuple(tuple(float(row.get(f"{d}{end}", np.nan)) for end in ("", "_low", "_high"))
                 for d in ("d_baseline", "dnll_baseline"))


def heads_prunable(pruning: pd.DataFrame, setting: str) -> Claim:
    """A run of the setting keeping a quarter of its gated heads or fewer (the paper: 4-10 of 48
    encoder heads, 26-36 of 144 in all) with no loss beyond the setting's margin (the rules above).
    Only a run keeping at least as many heads as the paper's fewest can refute the finding: a loss
    where fewer heads are left than the paper ever kept is not one the paper denies. The loss is
    measured against the setting's lambda = 0 control where it has one, the cost of pruning alone:
    fine-tuning by itself can move BLEU (the published run's controls gain about 1 point), which a
    comparison with the baseline would credit to pruning. Without a control, against the
    baseline.

    The powered design's rules (report.preregistered) add three notes, each to the measured text
    and the basis: runs whose gates had not decided (more than MAX_UNDECIDED_SHARE of them inside
    GATE_UNDECIDED), the verdict under the paper's counting rule where it differs from headcount's
    by more than COUNTING_RULES_AGREE heads in some run, and a baseline the control's check finds
    unconverged."""
    claim = _prunable_reading(pruning, setting)
    notes, basis = [], []
    undecided = undecided_runs(_pruned_runs(pruning, setting))
    if undecided:
        low, high = GATE_UNDECIDED
        runs = ", ".join(f"lambda {lam:g} ({k} of {n})" for lam, k, n in undecided)
        notes.append(f"Gates not decided (more than {MAX_UNDECIDED_SHARE:.0%} with P(open) strictly between {low:g} "
                     f"and {high:g}): {runs}.")
        basis.append("gates undecided at lambda " + ", ".join(f"{lam:g}" for lam, _, _ in undecided))
    paper_count = _paper_rule_reading(pruning, setting)
    if paper_count is not None:
        lambdas, other = paper_count
        notes.append(f"By the paper's counting rule (log alpha < 0), which differs from headcount's by more than "
                     f"{COUNTING_RULES_AGREE} heads at lambda {lambdas}: {other.verdict} ({other.basis}).")
        basis.append(f"by the paper's count: {other.verdict}")
    against = _control_against_baseline(pruning, setting)
    note = unconverged_note(*against) if against else ""
    if note:
        notes.append(note)
        basis.append(NOT_CONVERGED)
    if not notes:
        return claim
    return replace(claim, measured=" ".join([claim.measured, *notes]), basis="; ".join([claim.basis, *basis]))


def has_not_decided(undecided: int, gated: int) -> bool:
    """report.preregistered's rule: a run whose gated heads are more than MAX_UNDECIDED_SHARE undecided."""
    return gated > 0 and undecided / gated > MAX_UNDECIDED_SHARE


def undecided_runs(runs: pd.DataFrame) -> list[tuple[float, int, int]]:
    """(lambda, undecided gates, gated heads) of each run whose gates had not decided by report.preregistered's
    rule: more than MAX_UNDECIDED_SHARE of its gated heads ended with P(open) inside
    GATE_UNDECIDED (the pruning table's gates_undecided of gates_gated; tables without them: none)."""
    if "gates_undecided" not in runs or "gates_gated" not in runs:
        return []
    counted = runs.dropna(subset=["gates_undecided", "gates_gated"])
    return [(float(r.lam), int(r.gates_undecided), int(r.gates_gated)) for r in counted.itertuples()
            if has_not_decided(r.gates_undecided, r.gates_gated)]


def paper_rule_count(table: pd.DataFrame, setting: str) -> pd.Series | None:
    """Heads kept in `setting`'s count (PRUNABLE's column) by the paper's counting rule, log alpha < 0
    (the pruning table's retained_paper_rule_* columns); None for a table without them."""
    types = ["enc_self"] if setting == "enc" else ["enc_self", "dec_self", "dec_enc"]
    columns = [f"retained_paper_rule_{t}" for t in types]
    if any(c not in table for c in columns):
        return None
    return table[columns].sum(axis=1, min_count=len(columns))


def _paper_rule_reading(pruning: pd.DataFrame, setting: str) -> tuple[str, Claim] | None:
    """The prunable reading with every run's heads counted by the paper's rule, where the two rules
    differ by more than COUNTING_RULES_AGREE heads in some run: (those lambdas, the claim)."""
    column = PRUNABLE[setting][2]
    runs = _pruned_runs(pruning, setting)
    paper = paper_rule_count(runs, setting)
    if paper is None:
        return None
    apart = runs[(runs[column] - paper).abs() > COUNTING_RULES_AGREE]
    if apart.empty:
        return None
    recounted = pruning.copy()
    recounted.loc[runs.index, column] = paper.where(paper.notna(), runs[column])
    return ", ".join(f"{lam:g}" for lam in apart["lam"]), _prunable_reading(recounted, setting)


def _prunable_reading(pruning: pd.DataFrame, setting: str) -> Claim:
    name, paper, column, source, paper_fewest = PRUNABLE[setting]
    margin = NO_LOSS_MARGIN[setting]
    total = int(_baseline(pruning)[column])
    runs = _pruned_runs(pruning, setting)
    reference = "control" if "d_control_low" in runs and runs["d_control_low"].notna().any() else "baseline"
    diff = f"d_{reference}"
    runs = runs.dropna(subset=[f"{diff}_low", f"{diff}_high"])
    parts = [f"lambda {lam:g}: {int(kept)}/{total} kept, {d:+.2f} [{low:+.2f}, {high:+.2f}]"
             for lam, kept, d, low, high in runs[["lam", column, diff, f"{diff}_low",
                                                  f"{diff}_high"]].itertuples(index=False)]
    against = f"pruned - {reference}: " + "; ".join(parts)
    stated = f"margin {margin:.2f} BLEU, {source}"
    sparse = runs[runs[column] <= total / 4]
    if sparse.empty:
        return Claim(name, paper, f"no run kept a quarter of the heads or fewer. {against}", NOT_SHOWN, stated)
    readings = [no_loss_reading(r[f"{diff}_low"], r[f"{diff}_high"], margin) for _, r in sparse.iterrows()]
    sparse = sparse.assign(_reading=readings)
    free = sparse[sparse["_reading"] == HOLDS]
    if not free.empty:
        fewest = free.sort_values(column).iloc[0]
        return Claim(name, paper, f"fewest heads kept with no loss beyond {margin:.2f} BLEU against the {reference}: "
                     f"{int(fewest[column])} of {total} (lambda {fewest['lam']:g}). {against}", HOLDS, stated)
    fewest = ceil(paper_fewest[0] / paper_fewest[1] * total - 1e-9)
    span = f"{fewest}-{int(total // 4)} of {total}"
    testable = sparse[sparse[column] >= fewest]
    if testable.empty:
        fewer = ", ".join(f"{lam:g}" for lam in sparse["lam"])
        return Claim(name, paper, f"no run kept {span} heads, the paper's range; the runs keeping fewer (lambda "
                     f"{fewer}) are beyond what the paper claims. {against}", NOT_RESOLVED,
                     f"no run in the paper's range, {span} heads; {stated}")
    if (testable["_reading"] == FAILS).all():
        return Claim(name, paper, f"every run keeping {span} heads (the paper's fewest to a quarter) loses more than "
                     f"{margin:.2f} BLEU against the {reference}. {against}", FAILS,
                     f"{len(testable)} of {len(testable)} beyond the margin; {stated}")
    open_runs = testable[testable["_reading"] == NOT_RESOLVED]
    finest = min(resolution(r[f"{diff}_low"], r[f"{diff}_high"]) for _, r in open_runs.iterrows())
    lambdas = ", ".join(f"{lam:g}" for lam in open_runs["lam"])
    return Claim(name, paper, f"no run keeping a quarter of the heads or fewer resolves a loss of {margin:.2f} BLEU "
                 f"against the {reference} (lambda {lambdas}: the interval reaches below -{margin:.2f} and above "
                 f"it). {against}", NOT_RESOLVED, f"at this resolution, ±{finest:.2f} BLEU; {stated}")


def pruned_beats_scratch(pruning: pd.DataFrame) -> Claim:
    """Table 2: a pruned model beats the same head configuration trained from scratch.

    Only runs that pruned a head count. A run that kept every head (a small lambda) set against its
    twin compares training schedules alone: its interval is the schedule's share, and a pruned run's
    lead over a Noam twin counts for pruning only beyond it (the rules above). Twins trained on the
    pruned model's own schedule (prune.scratch_schedule: pruned; the table's schedule_scratch) have no
    schedule to separate, and neither has a grid without a run that pruned nothing: those leads are
    read against 0."""
    paper = ("Table 2: each pruned model scores above the same configuration trained from scratch "
             "(by 0.01-0.50 BLEU).")
    name = "pruned beats from scratch"
    total = int(_baseline(pruning)["retained_total"])
    twinned = _pruned_runs(pruning, "all").dropna(subset=["d_pruned_scratch_low", "d_pruned_scratch_high"])
    matched = twinned.get("schedule_scratch", pd.Series("", index=twinned.index)).fillna("") == "pruned"
    runs = twinned[twinned["retained_total"] < total]
    unpruned = twinned[(twinned["retained_total"] >= total) & ~matched]  # Noam twins: the schedules alone

    def describe(r) -> str:
        return (f"lambda {r.lam:g}: {r.d_pruned_scratch:+.2f} [{r.d_pruned_scratch_low:+.2f}, "
                f"{r.d_pruned_scratch_high:+.2f}]" + (" (schedule-matched twin)" if matched[r.Index] else ""))

    schedule = ("" if unpruned.empty else " With no head pruned, the continued model against its twin (the "
                "schedules alone): " + "; ".join(describe(r) for r in unpruned.itertuples()) + ".")
    if runs.empty:
        return Claim(name, paper, "no all-types run that pruned a head has a from-scratch twin." + schedule, NOT_SHOWN)
    low, high = (unpruned["d_pruned_scratch_low"].min(), unpruned["d_pruned_scratch_high"].max()) \
        if not unpruned.empty else (0.0, 0.0)
    readings, noam = [], []  # per run: +1, -1 or 0 (schedule_reading); and the runs read against the schedule
    for r in runs.itertuples():
        against = not matched[r.Index] and not unpruned.empty
        reference = (low, high) if against else (0.0, 0.0)
        readings.append(schedule_reading(r.d_pruned_scratch_low, r.d_pruned_scratch_high, *reference))
        noam.append(against)
    agree, disagree = readings.count(1), readings.count(-1)
    better = int((runs["d_pruned_scratch_low"] > 0).sum())
    worse = int((runs["d_pruned_scratch_high"] < 0).sum())
    measured = f"pruned better than its twin in {better} of {len(runs)}, from scratch better in {worse}"
    if any(noam):
        read = [x for x, against in zip(readings, noam) if against]
        measured += (f"; of the {len(read)} against Noam twins, beyond the schedules' share [{low:+.2f}, {high:+.2f}] "
                     f"in {read.count(1)}, below it in {read.count(-1)}, overlapping it in {read.count(0)}")
    measured += "; pruned - from scratch, " + "; ".join(describe(r) for r in runs.itertuples()) + "." + schedule
    verdict = directional_verdict(agree, disagree, len(runs))
    if verdict == NOT_RESOLVED and any(noam):
        verdict = NOT_SEPARABLE
    what = "beyond the schedule" if all(noam) else "significant" if not any(noam) else "beyond the schedule or 0"
    return Claim(name, paper, measured, verdict, significant_basis(agree, disagree, len(runs), what))


def types_order(pruning: pd.DataFrame) -> Claim:
    """All types gated: encoder self-attention loses most heads, decoder-encoder attention fewest."""
    paper = "Encoder self-attention heads are pruned first; decoder-encoder attention is the most important."
    total = int(_baseline(pruning)["retained_total"])
    runs = _pruned_runs(pruning, "all")
    runs = runs[runs["retained_total"] < total]  # runs that pruned something
    if runs.empty:
        return Claim("attention types", paper, "no all-types run pruned a head", NOT_SHOWN)
    base = _baseline(pruning)
    heads = [int(base[f"retained_{k}"]) for k in ("enc_self", "dec_self", "dec_enc")]
    in_order, p_agree, p_disagree, parts = 0, [], [], []
    for r in runs.itertuples():
        kept = [int(r.retained_enc_self), int(r.retained_dec_self), int(r.retained_dec_enc)]
        ok = kept[0] <= min(kept[1:]) and kept[2] >= max(kept[:2])
        in_order += ok
        p, p_reversed = types_order_tails(kept, heads)
        p_agree.append(p)
        p_disagree.append(p_reversed)
        parts.append(f"lambda {r.lam:g}: {'/'.join(map(str, kept))}{'' if ok else ' (not in that order)'}, "
                     f"p = {p:.3f}")
    agree, disagree = holm_counts(p_agree, p_disagree)
    measured = (f"retained enc-self/dec-self/dec-enc in that order in {in_order} of {len(runs)} runs; against as "
                f"many heads kept at random among all types (one-sided, Holm across runs, p < {ALPHA}): {agree} "
                f"of {len(runs)} significant. " + "; ".join(parts))
    return Claim("attention types", paper, measured, directional_verdict(agree, disagree, len(runs)),
                 significant_basis(agree, disagree, len(runs), "significant after Holm"))


DECODER_LAYER_FINDING = {"dec_self": "lower", "dec_enc": "higher"}  # where the paper finds survivors


def decoder_layers(layers: pd.DataFrame, kind: str) -> Claim:
    """Surviving heads of one decoder attention type sit in lower (dec_self) or higher (dec_enc)
    layers than heads kept at random would: the all-types runs' rows of the layer-survival table."""
    where = DECODER_LAYER_FINDING[kind]
    paper = (f"Decoder {'self' if kind == 'dec_self' else 'decoder-encoder'} attention heads survive in "
             f"{where} layers.")
    name = f"{kind} heads in {where} layers"
    rows = _layer_rows(layers, "all", kind)
    rows = rows[rows["lam"] > 0]
    p_agrees, p_disagrees, parts = [], [], []
    for lam, run in rows.groupby("lam"):
        per_layer = run.groupby("layer")[["heads", "kept"]].sum()
        heads_layer = np.repeat(per_layer.index.to_numpy() + 1, per_layer["heads"])
        kept = np.concatenate([np.arange(h) < k for h, k in zip(per_layer["heads"], per_layer["kept"])])
        if not 0 < kept.sum() < len(kept):
            continue
        low, high = mean_layer_tails(heads_layer.tolist(), kept.tolist())
        p_agree, p_disagree = (low, high) if where == "lower" else (high, low)
        p_agrees.append(p_agree)
        p_disagrees.append(p_disagree)
        parts.append(f"lambda {lam:g}: {int(kept.sum())} kept, mean layer {heads_layer[kept].mean():.2f} "
                     f"(all: {heads_layer.mean():.2f}), p {where} = {p_agree:.3f}")
    if not parts:
        return Claim(name, paper, "no all-types run kept some but not all of these heads", NOT_SHOWN)
    agree, disagree = holm_counts(p_agrees, p_disagrees)
    measured = (f"against as many heads kept at random (one-sided, Holm across runs, p < {ALPHA}): {agree} of "
                f"{len(parts)} runs {where}, {disagree} the other way. " + "; ".join(parts))
    return Claim(name, paper, measured, directional_verdict(agree, disagree, len(parts)),
                 significant_basis(agree, disagree, len(parts), "significant after Holm"))


def within_layer_runs(layers: pd.DataFrame | None, setting: str = "enc") -> list[tuple[float, WithinLayers]]:
    """The within-layer test of every run of the setting that kept some but not all encoder heads."""
    rows = _layer_rows(layers, setting, "enc_self")
    out = []
    for lam, run in rows.groupby("lam", sort=True):
        if 0 < run["kept"].sum() < run["heads"].sum():
            out.append((float(lam), within_layer_test(role_strata(run))))
    return out


def _within_layer_text(runs: list[tuple[float, WithinLayers]]) -> str:
    return "; ".join(f"lambda {lam:g}: {t.observed} kept with a role (given each layer's survivors: "
                     f"{t.expected:.2f}), p = {t.p_more:.3f}, {t.informative} informative layer"
                     f"{'' if t.informative == 1 else 's'}" for lam, t in runs)


def _pooled_control_text(layers: pd.DataFrame, setting: str = "enc") -> str:
    """The control's pooled reading (role heads among all kept, no layers), as the hypergeometric
    test of the experiment reads its runs."""
    rows = _layer_rows(layers, setting, "enc_self")
    parts = []
    for lam, run in rows.groupby("lam", sort=True):
        total, kept = int(run["heads"].sum()), int(run["kept"].sum())
        if not 0 < kept < total:
            continue
        role = run["role"].fillna(NO_ROLE) != NO_ROLE
        with_role, kept_role = int(run.loc[role, "heads"].sum()), int(run.loc[role, "kept"].sum())
        p_fewer = 1 - hypergeometric_upper_tail(total, with_role, kept, kept_role + 1)
        parts.append(f"lambda {lam:g}: {kept_role} of {with_role} heads with a role kept against "
                     f"{kept - kept_role} of {total - with_role} without (p fewer = {p_fewer:.3f})")
    return "; ".join(parts)


def specialised_heads_last(pruning: pd.DataFrame, layers: pd.DataFrame | None = None,
                           control_layers: pd.DataFrame | None = None) -> Claim:
    """Encoder heads with a role survive encoder-only pruning more often than other heads of their
    own layer (within_layer_test), on the experiment and, where given, on the positive control
    (combined_verdict). Beside it, the pooled test the verdict used to rest on: role heads against
    heads kept at random from the whole encoder (hypergeometric), which a layer that is all role
    heads, and survives for being that layer, passes."""
    paper = "Specialised heads (positional, syntactic, rare-token) are the last to be pruned."
    name = "specialised heads last"
    base = _baseline(pruning)
    total = int(base["retained_enc_self"])
    with_role = total - int(base.get(f"role_{NO_ROLE}", total))
    if with_role == 0:
        return Claim(name, paper, "no encoder head has a role", NOT_SHOWN)
    pooled, pooled_lams = [], []
    for r in _pruned_runs(pruning, "enc").itertuples():
        kept = int(r.retained_enc_self)
        if not 0 < kept < total:
            continue
        kept_with_role = kept - int(getattr(r, f"role_{NO_ROLE}"))
        p_more = hypergeometric_upper_tail(total, with_role, kept, kept_with_role)
        pooled_lams.append(r.lam)
        pooled.append(f"lambda {r.lam:g}: {kept_with_role} of {with_role} heads with a role among {kept} kept "
                      f"(at random: {kept * with_role / total:.1f}), p = {p_more:.3f}")
    if not pooled:
        return Claim(name, paper, "no encoder-only run kept some but not all heads", NOT_SHOWN)
    runs = within_layer_runs(layers)
    agree, disagree = holm_counts([t.p_more for _, t in runs], [t.p_fewer for _, t in runs])
    reading = directional_verdict(agree, disagree, len(runs))
    missing = ", ".join(f"{lam:g}" for lam in pooled_lams if not any(np.isclose(lam, done) for done, _ in runs))
    measured = (f"within layers (role labels permuted within each layer, exact; Holm across runs, p < {ALPHA}): "
                + significant_basis(agree, disagree, len(runs), "runs significant") + ". "
                + (_within_layer_text(runs) + ". " if runs else "")
                + (f"Runs with no per-layer record: lambda {missing}. " if missing else ""))
    basis = "experiment: " + significant_basis(agree, disagree, len(runs))
    control_reading = None
    if control_layers is not None:
        control = within_layer_runs(control_layers)
        c_agree, c_disagree = holm_counts([t.p_more for _, t in control], [t.p_fewer for _, t in control])
        control_reading = directional_verdict(c_agree, c_disagree, len(control))
        measured += (f"Positive control, within layers: "
                     f"{significant_basis(c_agree, c_disagree, len(control), 'runs significant')}"
                     + (f" ({_within_layer_text(control)})" if control else "")
                     + f"; pooled: {_pooled_control_text(control_layers)}. ")
        basis += "; control: " + significant_basis(c_agree, c_disagree, len(control))
    measured += "Pooled over layers (hypergeometric), as before: " + "; ".join(pooled)
    return Claim(name, paper, measured, combined_verdict(reading, control_reading), basis + " within layers")


def pruning_claims(pruning: pd.DataFrame, layers: pd.DataFrame,
                   control_layers: pd.DataFrame | None = None) -> list[Claim]:
    """Every check, in the paper's order: pruning.tsv's rows, the layer-survival table of the runs
    (pruning_report.layer_survival) and, where there is one, the positive control's."""
    return [*(heads_prunable(pruning, setting) for setting in PRUNABLE), pruned_beats_scratch(pruning),
            types_order(pruning),
            *(decoder_layers(layers, kind) for kind in DECODER_LAYER_FINDING),
            specialised_heads_last(pruning, layers, control_layers)]


def claims_markdown(experiment: str, claims: list[Claim]) -> str:
    lines = [f"### {experiment}: the paper's pruning findings", "",
             "| finding (Voita et al., 2019) | this run | verdict |", "|---|---|---|"]
    for c in claims:
        lines.append(f"| {c.paper} | {c.measured} | **{c.verdict}**{f' ({c.basis})' if c.basis else ''} |")
    margins = " and ".join(f"{m:.2f} BLEU ({s})" for s, m in NO_LOSS_MARGIN.items())
    lines += ["", f"Rules (headcount.report.claims). A prunable finding holds when some run keeping a quarter of "
              f"the heads or fewer shows no loss beyond the margin: the whole 95% paired-bootstrap interval of "
              f"pruned - control (the baseline where there is no control) above -margin, the margin being the "
              f"paper's own largest cost, {margins}; it does not hold when every such run that keeps at least "
              f"the paper's fewest heads ({PAPER_FEWEST}) shows a loss beyond it, and "
              f"is {NOT_RESOLVED} otherwise, at the resolution of half the interval's width. A "
              f"directional finding holds when more than half of the runs show it at p < {ALPHA} after Holm's "
              f"correction across the finding's runs (one-sided, against as many heads kept at random; the "
              f"attention types' order: the smaller of its two gaps in retained share, against as many heads "
              f"kept at random among all types; since 2026-11-27) and none the opposite; \"{MIXED}\" when runs "
              f"show both, "
              f"\"{NOT_RESOLVED}\" otherwise. Pruned - from scratch counts for pruning only where its interval "
              f"lies above that of a run that pruned no head against its twin (the schedules alone); "
              f"\"{NOT_SEPARABLE}\" where the intervals overlap. Specialised heads last: role labels "
              f"permuted within each layer (exact), on this run and on the positive control; it holds only "
              f"where both show it. \"{NOT_SHOWN}\": no run measured it."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Over seeds

CLAIM_COLUMNS = ["name", "paper", "measured", "verdict", "basis"]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    """One row per claim (claims.tsv beside claims.md): the verdicts, machine-readable."""
    return pd.DataFrame([{c: getattr(claim, c) for c in CLAIM_COLUMNS} for claim in claims], columns=CLAIM_COLUMNS)


def over_seeds_verdict(verdicts: list[str]) -> str:
    """The seeds' verdicts on one finding, counted: "holds in 3 of 3 seeds", or, where they differ,
    each verdict with its count, the most frequent first (ties in the rules' order)."""
    order = [HOLDS, FAILS, MIXED, NOT_SEPARABLE, NOT_RESOLVED, NOT_SHOWN]
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    ranked = sorted(counts, key=lambda v: (-counts[v], order.index(v) if v in order else len(order)))
    return "; ".join(f"{v} in {counts[v]} of {len(verdicts)} seeds" for v in ranked)


def _lambda_key(lam: float) -> float:
    """A lambda as the seeds' tables are matched on: rounded, so that one read back from two tables
    (or reached by arithmetic) compares equal."""
    return round(float(lam), 10)


def shared_lambdas(prunings: Iterable[pd.DataFrame]) -> dict[str, list[float]]:
    """Per pruning setting, the lambdas that every seed's pruning table holds (seed 1 runs the full
    grid, the other seeds `seed_lambdas`). Rounded, so that a lambda read back from two tables
    matches."""
    grids = [{setting: {_lambda_key(lam) for lam in rows["lam"]}
              for setting, rows in table[table["setting"] != "baseline"].groupby("setting")}
             for table in prunings]
    settings = set.intersection(*(set(g) for g in grids))
    return {s: sorted(set.intersection(*(g[s] for g in grids))) for s in sorted(settings)}


def on_lambdas(table: pd.DataFrame, lambdas: dict[str, list[float]]) -> pd.DataFrame:
    """The rows of a pruning or layer-survival table whose setting ran one of `lambdas`; rows of
    other settings (the baseline) stay."""
    keep = [setting not in lambdas or _lambda_key(lam) in lambdas[setting]
            for setting, lam in zip(table["setting"], table["lam"])]
    return table[keep]


def claims_over_seeds_markdown(experiment: str, runs: dict[int, tuple[pd.DataFrame, pd.DataFrame]],
                               control_layers: pd.DataFrame | None = None) -> str:
    """Each finding's verdict on every seed, judged on the lambdas all seeds ran so that the seeds
    are counted alike, with a seed's verdict on its own grid beside it where that differs, and how
    many seeds agree: a finding holds over seeds only as far as the count says. `runs`: seed ->
    (its pruning table, its layer-survival table), as pruning_report writes them."""
    seeds = sorted(runs)
    lambdas = shared_lambdas(pruning for pruning, _ in runs.values())
    shared = {s: pruning_claims(on_lambdas(runs[s][0], lambdas), on_lambdas(runs[s][1], lambdas), control_layers)
              for s in seeds}
    own = {s: {c.name: c.verdict for c in pruning_claims(*runs[s], control_layers)} for s in seeds}
    lines = [f"### {experiment}: the paper's pruning findings over {len(seeds)} seeds", "",
             "| finding (Voita et al., 2019) | " + " | ".join(f"seed {s}" for s in seeds) + " | over seeds |",
             "|---|" + "---|" * (len(seeds) + 1)]
    for i, claim in enumerate(shared[seeds[0]]):
        verdicts = [shared[s][i].verdict for s in seeds]
        cells = [v if own[s][claim.name] == v else f"{v} (own grid: {own[s][claim.name]})"
                 for s, v in zip(seeds, verdicts)]
        lines.append(f"| {claim.paper} | " + " | ".join(cells) + f" | **{over_seeds_verdict(verdicts)}** |")
    grid = "; ".join(f"{setting}: " + ", ".join(f"{lam:g}" for lam in lams) for setting, lams in lambdas.items())
    lines += ["", f"Each seed's verdict by the rules of headcount.report.claims on the lambdas every seed ran "
              f"({grid}), so that the last column counts like with like; in brackets, where it differs, "
              "the verdict on that seed's own grid (results/<seed's experiment>/prune/claims.md)."]
    return "\n".join(lines) + "\n"


# The differences each seed's runs carry into the tables and the figure over seeds.
RUN_DIFFERENCES = ("d_control", "d_pruned_scratch")


def runs_over_seeds(prunings: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """The runs behind the verdicts over seeds, on the lambdas every seed ran (the controls left
    out): a row per setting, lambda and seed with the heads kept (`kept` of `heads`: the encoder's
    self-attention heads for enc, all heads for all) and each of RUN_DIFFERENCES with that seed's
    95% paired-bootstrap interval (NaN where the seed has none: no twin). Settings in PRUNABLE's
    order, lambdas ascending, seeds ascending."""
    seeds = sorted(prunings)
    lambdas = shared_lambdas(prunings.values())
    columns = ["setting", "lam", "seed", "kept", "heads",
               *(f"{d}{end}" for d in RUN_DIFFERENCES for end in ("", "_low", "_high"))]
    rows = []
    for setting in (s for s in PRUNABLE if s in lambdas):
        column = PRUNABLE[setting][2]
        for lam in (lam for lam in lambdas[setting] if lam != 0):
            for seed in seeds:
                run = _pruned_runs(on_lambdas(prunings[seed], {setting: [lam]}), setting).iloc[0]
                rows.append({"setting": setting, "lam": lam, "seed": seed, "kept": int(run[column]),
                             "heads": int(_baseline(prunings[seed])[column]),
                             **{name: run.get(name, np.nan) for name in columns[5:]}})
    return pd.DataFrame(rows, columns=columns)


def runs_over_seeds_markdown(prunings: dict[int, pd.DataFrame]) -> str:
    """The runs behind the verdicts over seeds (`runs_over_seeds`) as tables: for each seed its heads
    kept and pruned - control, then, where twins were trained, pruned - from scratch, each with that
    seed's 95% paired-bootstrap interval, and with two seeds or more the seeds' mean with its 95%
    t-interval over seeds (training noise, which no seed's own interval holds)."""
    seeds = sorted(prunings)
    runs = runs_over_seeds(prunings)
    if runs.empty:
        return "No lambda besides the lambda = 0 controls ran on every seed (`seed_lambdas`).\n"
    pooled = len(seeds) > 1
    columns = [f"seed {s}" for s in seeds] + (["mean over seeds"] if pooled else [])
    header = ["| setting | lambda | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]

    def difference(row: pd.Series, diff: str) -> str:
        if pd.isna(row[f"{diff}_low"]):
            return "-"
        return f"{row[diff]:+.2f} [{row[f'{diff}_low']:+.2f}, {row[f'{diff}_high']:+.2f}]"

    def over_seeds(rows: pd.DataFrame, diff: str) -> list[str]:
        if not pooled:
            return []
        if rows[f"{diff}_low"].isna().any():
            return ["-"]  # a seed without the run: no mean that counts every seed alike
        mean, half = t_interval([float(v) for v in rows[diff]])
        return [f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]"]

    against_control, against_scratch = [], []
    for (setting, lam), rows in runs.groupby(["setting", "lam"], sort=False):
        each = [row for _, row in rows.iterrows()]
        against_control.append(f"| {setting} | {lam:g} | " + " | ".join(
            [f"{row['kept']}/{row['heads']} kept, {difference(row, 'd_control')}" for row in each]
            + over_seeds(rows, "d_control")) + " |")
        if rows["d_pruned_scratch_low"].notna().any():
            against_scratch.append(f"| {setting} | {lam:g} | " + " | ".join(
                [difference(row, "d_pruned_scratch") for row in each] + over_seeds(rows, "d_pruned_scratch")) + " |")
    lines = ["#### Heads kept and pruned - control, by seed", "", *header, *against_control]
    if against_scratch:
        lines += ["", "#### Pruned - from scratch, by seed", "", *header, *against_scratch]
    lines += ["", "BLEU differences on the test set the pruning report scores, each with its seed's 95% "
              "paired-bootstrap interval (test sentences resampled); heads kept: of the encoder's self-attention "
              "heads (enc), of all heads (all)."
              + (" Mean over seeds: the seeds' differences averaged, with a 95% Student's t interval over the "
                 "seeds (headcount.report.seed_statistics), which spans training seeds on this one test set; "
                 "the verdicts above count seeds and do not use it." if pooled else "")]
    return "\n".join(lines) + "\n"
