"""The paper's pruning findings (SPEC section 1, item 8), each checked on one run's pruning table.

A check states the paper's finding, what this run measured and a verdict. BLEU differences use
the pruning table's 95% paired-bootstrap intervals and count as differences only when the
interval excludes 0. Head counts and layers have no test sentences to resample, so they are
tested against heads kept at random in the same number: an exact hypergeometric tail for how many
heads with a role survive, a seeded Monte Carlo tail for the mean layer of the survivors.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np
import pandas as pd

from headcount.analysis.roles.registry import NO_ROLE

HOLDS, FAILS, MIXED, NOT_SHOWN = "holds", "does not hold", "mixed", "not shown either way"
ALPHA = 0.05  # a head-count or layer test counts when its one-sided p is below this
MONTE_CARLO_DRAWS = 20_000


@dataclass(frozen=True)
class Claim:
    name: str
    paper: str  # the finding as Voita et al. (2019) state it
    measured: str  # what this run shows, with intervals or p-values
    verdict: str  # HOLDS, FAILS, MIXED or NOT_SHOWN


def verdict_from(agree: int, disagree: int) -> str:
    """Runs that show the finding against runs that show its opposite (runs showing neither
    count for nothing)."""
    if agree and not disagree:
        return HOLDS
    if disagree and not agree:
        return FAILS
    return MIXED if agree else NOT_SHOWN


def hypergeometric_upper_tail(population: int, successes: int, draws: int, observed: int) -> float:
    """P(X >= observed) for X the successes among `draws` items drawn without replacement."""
    total = comb(population, draws)
    return sum(comb(successes, k) * comb(population - successes, draws - k)
               for k in range(observed, min(successes, draws) + 1)) / total


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


def _pruned_runs(pruning: pd.DataFrame, setting: str) -> pd.DataFrame:
    return pruning[(pruning["setting"] == setting) & ~pruning["control"].astype(bool)].sort_values("lam")


def _baseline(pruning: pd.DataFrame) -> pd.Series:
    return pruning[pruning["setting"] == "baseline"].iloc[0]


# setting -> (name, the paper's finding, the pruning table's column of heads counted)
PRUNABLE = {
    "enc": ("encoder heads prunable", "Most encoder heads can be pruned for little BLEU (encoder only): 10 of 48 "
            "kept cost 0.15 BLEU on WMT, 4 of 48 cost 0.25 on OpenSubtitles.", "retained_enc_self"),
    "all": ("most heads prunable", "Table 2: with all attention types gated, 36 and 26 of 144 heads kept cost 0.54 "
            "and 0.70 BLEU on WMT, 28 kept cost 0.13 on OpenSubtitles.", "retained_total"),
}


def heads_prunable(pruning: pd.DataFrame, setting: str) -> Claim:
    """A run of the setting keeping a quarter of its gated heads or fewer (the paper: 4-10 of 48
    encoder heads, 26-36 of 144 in all) with no BLEU loss shown. The loss is measured against the
    setting's lambda = 0 control where it has one, the cost of pruning alone: fine-tuning by
    itself can move BLEU (the published run's controls gain about 1 point), which a comparison
    with the baseline would credit to pruning. Without a control, against the baseline."""
    name, paper, column = PRUNABLE[setting]
    total = int(_baseline(pruning)[column])
    runs = _pruned_runs(pruning, setting)
    reference = "control" if "d_control_low" in runs and runs["d_control_low"].notna().any() else "baseline"
    diff = f"d_{reference}"
    runs = runs.dropna(subset=[f"{diff}_low", f"{diff}_high"])
    parts = [f"lambda {lam:g}: {int(kept)}/{total} kept, {d:+.2f} [{low:+.2f}, {high:+.2f}]"
             for lam, kept, d, low, high in runs[["lam", column, diff, f"{diff}_low",
                                                  f"{diff}_high"]].itertuples(index=False)]
    against = f"pruned - {reference}: " + "; ".join(parts)
    sparse = runs[runs[column] <= total / 4]
    if sparse.empty:
        return Claim(name, paper, f"no run kept a quarter of the heads or fewer. {against}", NOT_SHOWN)
    free = sparse[sparse[f"{diff}_high"] >= 0]  # no loss shown
    if free.empty:
        return Claim(name, paper, f"every run keeping a quarter of the heads or fewer loses BLEU against the "
                     f"{reference}. {against}", FAILS)
    fewest = free.sort_values(column).iloc[0]
    measured = (f"fewest heads kept with no loss against the {reference} shown: {int(fewest[column])} of {total} "
                f"(lambda {fewest['lam']:g}). {against}")
    return Claim(name, paper, measured, HOLDS)


def pruned_beats_scratch(pruning: pd.DataFrame) -> Claim:
    """Table 2: a pruned model beats the same head configuration trained from scratch.

    Only runs that pruned a head count. A run that kept every head (a small lambda) set against
    its twin compares training schedules alone, so it is reported as that: the part of the other
    runs' lead that pruning does not explain."""
    paper = ("Table 2: each pruned model scores above the same configuration trained from scratch "
             "(by 0.01-0.51 BLEU).")
    total = int(_baseline(pruning)["retained_total"])
    twinned = _pruned_runs(pruning, "all").dropna(subset=["d_pruned_scratch_low", "d_pruned_scratch_high"])
    runs, unpruned = twinned[twinned["retained_total"] < total], twinned[twinned["retained_total"] >= total]

    def describe(r) -> str:
        return (f"lambda {r.lam:g}: {r.d_pruned_scratch:+.2f} [{r.d_pruned_scratch_low:+.2f}, "
                f"{r.d_pruned_scratch_high:+.2f}]")

    schedule = ("" if unpruned.empty else " With no head pruned, the continued model against its twin (the "
                "schedules alone): " + "; ".join(describe(r) for r in unpruned.itertuples()) + ".")
    if runs.empty:
        return Claim("pruned beats from scratch", paper, "no all-types run that pruned a head has a from-scratch twin."
                     + schedule, NOT_SHOWN)
    better = int((runs["d_pruned_scratch_low"] > 0).sum())
    worse = int((runs["d_pruned_scratch_high"] < 0).sum())
    measured = (f"pruned better in {better}, from scratch better in {worse}, no difference shown in "
                f"{len(runs) - better - worse} of {len(runs)}; pruned - from scratch, "
                + "; ".join(describe(r) for r in runs.itertuples()) + "." + schedule)
    return Claim("pruned beats from scratch", paper, measured, verdict_from(better, worse))


def types_order(pruning: pd.DataFrame) -> Claim:
    """All types gated: encoder self-attention loses most heads, decoder-encoder attention fewest."""
    paper = "Encoder self-attention heads are pruned first; decoder-encoder attention is the most important."
    total = int(_baseline(pruning)["retained_total"])
    runs = _pruned_runs(pruning, "all")
    runs = runs[runs["retained_total"] < total]  # runs that pruned something
    if runs.empty:
        return Claim("attention types", paper, "no all-types run pruned a head", NOT_SHOWN)
    agree = 0
    parts = []
    for r in runs.itertuples():
        enc, dec, cross = int(r.retained_enc_self), int(r.retained_dec_self), int(r.retained_dec_enc)
        ok = enc <= min(dec, cross) and cross >= max(enc, dec)
        agree += ok
        parts.append(f"lambda {r.lam:g}: {enc}/{dec}/{cross}{'' if ok else ' (not in that order)'}")
    measured = (f"retained enc-self/dec-self/dec-enc in that order in {agree} of {len(runs)} runs: "
                + "; ".join(parts))
    return Claim("attention types", paper, measured, verdict_from(agree, len(runs) - agree))


DECODER_LAYER_FINDING = {"dec_self": "lower", "dec_enc": "higher"}  # where the paper finds survivors


def decoder_layers(heads: pd.DataFrame, kind: str) -> Claim:
    """Surviving heads of one decoder attention type sit in lower (dec_self) or higher (dec_enc)
    layers than heads kept at random would: the all-types runs' per-head table (setting, lam, type,
    layer, retained)."""
    where = DECODER_LAYER_FINDING[kind]
    paper = (f"Decoder {'self' if kind == 'dec_self' else 'decoder-encoder'} attention heads survive in "
             f"{where} layers.")
    name = f"{kind} heads in {where} layers"
    rows = heads[(heads["setting"] == "all") & (heads["type"] == kind) & (heads["lam"] > 0)]
    agree = disagree = 0
    parts = []
    for lam, run in rows.groupby("lam"):
        kept = run["retained"].astype(bool).tolist()
        if not 0 < sum(kept) < len(kept):
            continue
        low, high = mean_layer_tails((run["layer"] + 1).tolist(), kept)
        p_agree, p_disagree = (low, high) if where == "lower" else (high, low)
        agree += p_agree < ALPHA
        disagree += p_disagree < ALPHA
        mean = (run["layer"][run["retained"].astype(bool)] + 1).mean()
        parts.append(f"lambda {lam:g}: {sum(kept)} kept, mean layer {mean:.2f} (all: {(run['layer'] + 1).mean():.2f}), "
                     f"p {where} = {p_agree:.3f}")
    if not parts:
        return Claim(name, paper, "no all-types run kept some but not all of these heads", NOT_SHOWN)
    measured = (f"against as many heads kept at random (one-sided, p < {ALPHA}): {agree} of {len(parts)} runs "
                f"{where}, {disagree} the other way. " + "; ".join(parts))
    return Claim(name, paper, measured, verdict_from(agree, disagree))


def specialised_heads_last(pruning: pd.DataFrame) -> Claim:
    """Encoder heads with a role survive encoder-only pruning more often than heads kept at random."""
    paper = "Specialised heads (positional, syntactic, rare-token) are the last to be pruned."
    base = _baseline(pruning)
    total = int(base["retained_enc_self"])
    with_role = total - int(base.get(f"role_{NO_ROLE}", total))
    if with_role == 0:
        return Claim("specialised heads last", paper, "no encoder head has a role", NOT_SHOWN)
    agree = disagree = 0
    parts = []
    for r in _pruned_runs(pruning, "enc").itertuples():
        kept = int(r.retained_enc_self)
        if not 0 < kept < total:
            continue
        kept_with_role = kept - int(getattr(r, f"role_{NO_ROLE}"))
        p_more = hypergeometric_upper_tail(total, with_role, kept, kept_with_role)
        p_fewer = 1 - hypergeometric_upper_tail(total, with_role, kept, kept_with_role + 1)
        agree += p_more < ALPHA
        disagree += p_fewer < ALPHA
        parts.append(f"lambda {r.lam:g}: {kept_with_role} of {with_role} heads with a role among {kept} kept "
                     f"(at random: {kept * with_role / total:.1f}), p = {p_more:.3f}")
    if not parts:
        return Claim("specialised heads last", paper, "no encoder-only run kept some but not all heads", NOT_SHOWN)
    measured = (f"heads with a role kept more often than at random (hypergeometric, p < {ALPHA}) in {agree} of "
                f"{len(parts)} runs, less often in {disagree}. " + "; ".join(parts))
    return Claim("specialised heads last", paper, measured, verdict_from(agree, disagree))


def pruning_claims(pruning: pd.DataFrame, heads: pd.DataFrame) -> list[Claim]:
    """Every check, in the paper's order: pruning.tsv's rows and the per-head table of the runs."""
    return [*(heads_prunable(pruning, setting) for setting in PRUNABLE), pruned_beats_scratch(pruning),
            types_order(pruning),
            *(decoder_layers(heads, kind) for kind in DECODER_LAYER_FINDING),
            specialised_heads_last(pruning)]


def claims_markdown(experiment: str, claims: list[Claim]) -> str:
    lines = [f"### {experiment}: the paper's pruning findings", "",
             "| finding (Voita et al., 2019) | this run | verdict |", "|---|---|---|"]
    for c in claims:
        lines.append(f"| {c.paper} | {c.measured} | **{c.verdict}** |")
    lines += ["", "A BLEU difference counts only when its 95% paired-bootstrap interval excludes 0. Head counts "
              "and layers are tested against as many heads kept at random (one-sided). A verdict is "
              f"\"{HOLDS}\" when some runs show the finding and none its opposite, \"{FAILS}\" when runs show "
              f"only the opposite, \"{MIXED}\" when both occur and \"{NOT_SHOWN}\" when no run shows either; "
              "the encoder finding holds when some encoder-only run keeping a quarter of the encoder heads or "
              "fewer shows no loss against the setting's lambda = 0 control (the baseline where there is no "
              "control), and does not hold when every such run shows one (the same for all heads with all "
              "types gated)."]
    return "\n".join(lines) + "\n"
