"""The pruning findings over seeds at matched head counts (docs/method.md, "The powered
design: rules fixed before it ran"): each seed's pruned - control and pruned - from scratch read off its own curve
at the counts the paper names, with intervals that resample seeds and test sentences together
(seed_statistics.two_level_bootstrap), in BLEU and in token NLL, each with what it can resolve
(power.power_statement), and the prunable findings' verdicts from them with Holm's correction
across the counts.

A run's per-sentence evidence: BLEU's sufficient statistics of each translation (sacrebleu's own),
so that a resample's corpus BLEU is recomputed from summed counts as sacrebleu's paired bootstrap
does, and each reference's NLL and token count (the reference_nll rule).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from sacrebleu.metrics import BLEU

from headcount.report.claims import (
    FAILS,
    HOLDS,
    NOT_CONVERGED,
    NOT_RESOLVED,
    NOT_SHOWN,
    has_not_decided,
    unconverged_note,
)
from headcount.report.power import holm, power_statement
from headcount.report.preregistered import (
    ALPHA,
    COUNTING_RULES_AGREE,
    GATE_UNDECIDED,
    MATCHED_HEADS,
    MAX_UNDECIDED_SHARE,
    NO_LOSS_MARGIN,
)
from headcount.report.seed_statistics import SeedRun, ratio_of_sums, two_level_bootstrap
from headcount.training.evaluate import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED

MEASURES = ("bleu", "nll")  # BLEU points (higher is better); mean token NLL in nats (lower is better)
DIFFERENCES = {"control": "pruned - control", "scratch": "pruned - from scratch"}
PAPER_FEWEST = {"enc": 4, "all": 26}  # heads: only counts at or above these can refute a prunable finding


def bleu_statistics(hypotheses: list[str], references: list[str], lowercase: bool = False) -> np.ndarray:
    """(sentences, 2 + 2 * 4) BLEU sufficient statistics of each translation, as sacrebleu counts them."""
    return np.asarray(BLEU(lowercase=lowercase)._extract_corpus_statistics(hypotheses, [references]), dtype=float)


def _draw_counts(index: np.ndarray, n: int) -> np.ndarray:
    """(draws, n): how often each sentence is drawn in each row of `index`."""
    rows = np.repeat(np.arange(index.shape[0]), index.shape[1])
    return np.bincount(rows * n + index.ravel(), minlength=index.shape[0] * n).reshape(index.shape[0], n)


def bleu_difference(system: np.ndarray, reference: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A run statistic for the two-level bootstrap: corpus BLEU of `system` minus `reference` (their
    bleu_statistics) on each draw of sentences."""
    metric = BLEU()

    def value(index: np.ndarray) -> np.ndarray:
        counts = _draw_counts(index, len(system))
        sums = [counts @ stats for stats in (system, reference)]
        return np.array([metric._compute_score_from_stats(list(a)).score - metric._compute_score_from_stats(
            list(b)).score for a, b in zip(*sums)])
    return value


def nll_difference(system: pd.DataFrame, reference: pd.DataFrame) -> Callable[[np.ndarray], np.ndarray]:
    """Mean token NLL of `system` minus `reference` on each draw (per-sentence nll and tokens)."""
    return ratio_of_sums(system["nll"].to_numpy() - reference["nll"].to_numpy(), reference["tokens"].to_numpy())


@dataclass(frozen=True)
class RunEvidence:
    """One pruning run of one seed: heads kept in its setting's count, and its differences' run
    statistics by (difference, measure), e.g. ("control", "bleu"). Where known, the heads the paper's
    counting rule keeps (log alpha < 0) and how many of its gated heads had not decided."""
    seed: int
    setting: str
    lam: float
    heads: int
    values: dict[tuple[str, str], Callable[[np.ndarray], np.ndarray]]
    paper_heads: int | None = None
    undecided: int | None = None
    gated: int | None = None


@dataclass(frozen=True)
class GateChecks:
    """What report.preregistered's rules make the verdicts over seeds say about the gates: the runs whose
    gates had not decided, and, where the two counting rules differ by more than
    COUNTING_RULES_AGREE heads in some run of a setting, the matched rows with every run counted by
    the paper's rule."""
    undecided: list[RunEvidence]
    apart: dict[str, list[RunEvidence]]  # setting -> its runs whose two counts differ
    paper_rows: pd.DataFrame | None


def gate_checks(runs: list[RunEvidence], n_sentences: int, n_samples: int = BOOTSTRAP_SAMPLES,
                seed: int = BOOTSTRAP_SEED) -> GateChecks:
    undecided = [r for r in runs if r.gated is not None and has_not_decided(r.undecided, r.gated)]
    apart: dict[str, list[RunEvidence]] = {}
    for r in runs:
        if r.paper_heads is not None and abs(r.paper_heads - r.heads) > COUNTING_RULES_AGREE:
            apart.setdefault(r.setting, []).append(r)
    recounted = [replace(r, heads=r.paper_heads) for r in runs if r.paper_heads is not None]
    paper_rows = matched_rows(recounted, n_sentences, n_samples, seed) if apart else None
    return GateChecks(undecided, apart, paper_rows)


def matched_rows(runs: list[RunEvidence], n_sentences: int, n_samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> pd.DataFrame:
    """One row per (setting, difference, measure, matched count): the two-level estimate and
    interval, the seeds that reach the count, the variance components and the power statement
    (BLEU against the paper's margin; NLL: what it resolves), and for BLEU pruned - control the
    one-sided p of a loss beyond the margin."""
    rows = []
    for setting, counts in MATCHED_HEADS.items():
        for difference in DIFFERENCES:
            for measure in MEASURES:
                curves: dict[int, list[SeedRun]] = {}
                for r in runs:
                    if r.setting == setting and (difference, measure) in r.values:
                        curves.setdefault(r.seed, []).append(SeedRun(r.heads, r.values[(difference, measure)]))
                for heads in counts:
                    got = two_level_bootstrap(curves, heads, n_sentences, n_samples, seed) if curves else None
                    row = {"setting": setting, "difference": difference, "measure": measure, "heads": heads,
                           "seeds_run": len(curves)}
                    if got is not None:
                        margin = NO_LOSS_MARGIN[setting] if measure == "bleu" else None  # the paper's are BLEU
                        power = power_statement(got.var_seeds, got.var_sentences, len(got.seeds), n_sentences,
                                                margin)
                        row.update(estimate=got.estimate, low=got.low, high=got.high,
                                   seeds=",".join(map(str, got.seeds)), var_seeds=got.var_seeds,
                                   var_sentences=got.var_sentences, resolvable=power.resolvable,
                                   half_width=power.half_width,
                                   seeds_needed=power.seeds_needed, sentences_needed=power.sentences_needed,
                                   p_loss_beyond_margin=(got.p_at_most(-margin)
                                                         if measure == "bleu" and difference == "control"
                                                         else float("nan")))
                    rows.append(row)
    return pd.DataFrame(rows)


def prunable_verdict(rows: pd.DataFrame, setting: str) -> tuple[str, str]:
    """The prunable finding of `setting` from its BLEU pruned - control rows at the matched counts:
    HOLDS where some count's Holm-adjusted p of a loss beyond the margin is below ALPHA (no loss
    beyond it shown); FAILS where every count at or above the paper's fewest has its whole interval
    below -margin; else NOT_RESOLVED. -> (verdict, basis)."""
    mine = rows[(rows["setting"] == setting) & (rows["difference"] == "control") & (rows["measure"] == "bleu")]
    mine = mine.dropna(subset=["estimate"]) if "estimate" in mine else mine.iloc[0:0]
    if mine.empty:
        return NOT_SHOWN, "no count reached by two seeds"
    margin = NO_LOSS_MARGIN[setting]
    adjusted = holm(mine["p_loss_beyond_margin"].tolist())
    if min(adjusted) < ALPHA:
        best = mine.iloc[int(np.argmin(adjusted))]
        return HOLDS, (f"{int(best.heads)} heads: no loss beyond {margin:g} BLEU (Holm-adjusted p = "
                       f"{min(adjusted):.3f} across {len(mine)} counts)")
    refuting = mine[mine["heads"] >= PAPER_FEWEST[setting]]
    if len(refuting) and (refuting["high"] < -margin).all():
        return FAILS, f"a loss beyond {margin:g} BLEU at every count of {PAPER_FEWEST[setting]} heads or more"
    widest = mine.loc[mine["resolvable"].idxmax()]
    return NOT_RESOLVED, (f"resolves {widest.resolvable:.2f} BLEU at 80% power (margin {margin:g}); "
                          + needs_text(widest))


def _runs_text(runs) -> str:
    return ", ".join(f"seed {r.seed} lambda {r.lam:g}" for r in runs)


def needs_text(row) -> str:
    if not pd.isna(row.get("seeds_needed", float("nan"))) and row.get("seeds_needed") is not None:
        return f"the margin needs about {int(row.seeds_needed)} seeds"
    return f"the margin needs at least {int(row.sentences_needed)} test sentences, whatever the seeds"


def _cell(row, digits: int) -> str:
    if pd.isna(row.get("estimate", float("nan"))):
        if row.get("seeds_run", 2) < 2:  # e.g. twins for training.seed alone (seed_from_scratch: false)
            n = int(row.seeds_run)
            return f"{n} seed{'' if n == 1 else 's'} ran this difference: no interval over seeds"
        return f"fewer than two seeds reach {int(row.heads)} heads"
    return (f"{row.estimate:+.{digits}f} [{row.low:+.{digits}f}, {row.high:+.{digits}f}] "
            f"(seeds {row.seeds}; resolves {row.resolvable:.{digits}f})")


def unconverged_seeds(spread: pd.DataFrame | None, setting: str) -> dict[int, str]:
    """seed -> what its verdicts say, for each seed whose baseline the control's check finds
    unconverged in `setting`: seeds/spread.tsv's rows "control <setting> - baseline" (BLEU) and
    "..., NLL", each seed's difference with its paired interval."""
    if spread is None:
        return {}
    by_system = spread.set_index("system")
    seeds = sorted(int(c.split("_")[1]) for c in spread.columns if re.fullmatch(r"seed_\d+", c))

    def interval(system: str, seed: int) -> tuple[float, float, float]:
        if system not in by_system.index:
            return (np.nan,) * 3
        row = by_system.loc[system]
        return tuple(float(row.get(f"seed_{seed}{end}", np.nan)) for end in ("", "_low", "_high"))

    notes = {seed: unconverged_note(interval(f"control {setting} - baseline", seed),
                                    interval(f"control {setting} - baseline, NLL", seed)) for seed in seeds}
    return {seed: note for seed, note in notes.items() if note}


def matched_markdown(experiment: str, rows: pd.DataFrame, n_sentences: int, spread: pd.DataFrame | None = None,
                     gates: GateChecks | None = None) -> str:
    """The table over seeds at matched head counts, with the prunable verdicts; given the seeds'
    spread table (seed_spread), each verdict names the seeds whose baseline had not converged by the
    control's check, and a line per such seed gives the control's gain. Given the `gates` checks,
    each verdict names its setting's runs whose gates had not decided, and where the counting rules
    differ it is given under the paper's count as well."""
    lines = [f"### {experiment}: the pruning findings over seeds at matched head counts", "",
             "| setting | heads kept | difference | BLEU | NLL (nats/token) |", "|---|---|---|---|---|"]
    for (setting, difference, heads), group in rows.groupby(["setting", "difference", "heads"], sort=False):
        cells = {m: _cell(group[group["measure"] == m].iloc[0], 2 if m == "bleu" else 4) for m in MEASURES}
        lines.append(f"| {setting} | {heads} | {DIFFERENCES[difference]} | {cells['bleu']} | {cells['nll']} |")
    lines += ["", "| finding | verdict | basis |", "|---|---|---|"]
    unconverged = {setting: unconverged_seeds(spread, setting) for setting in MATCHED_HEADS}
    for setting in MATCHED_HEADS:
        verdict, basis = prunable_verdict(rows, setting)
        if unconverged[setting]:
            seeds = ", ".join(map(str, unconverged[setting]))
            basis += f"; {NOT_CONVERGED}: seed{'s' if len(unconverged[setting]) > 1 else ''} {seeds}"
        if gates is not None and any(r.setting == setting for r in gates.undecided):
            basis += "; gates undecided in " + _runs_text(r for r in gates.undecided if r.setting == setting)
        if gates is not None and gates.apart.get(setting):
            paper_verdict, paper_basis = prunable_verdict(gates.paper_rows, setting)
            basis += (f"; by the paper's count (log alpha < 0; it differs from headcount's by more than "
                      f"{COUNTING_RULES_AGREE} heads in {_runs_text(gates.apart[setting])}): **{paper_verdict}** "
                      f"({paper_basis})")
        name = "most encoder heads prunable (encoder only)" if setting == "enc" else "most heads prunable (all types)"
        lines.append(f"| {name} | **{verdict}** | {basis} |")
    if gates is not None and gates.undecided:
        low, high = GATE_UNDECIDED
        lines += ["", f"Runs whose gates had not decided (more than {MAX_UNDECIDED_SHARE:.0%} of the gated heads with "
                  f"P(open) strictly between {low:g} and {high:g}): "
                  + "; ".join(f"seed {r.seed}, {r.setting} lambda {r.lam:g}: {r.undecided} of {r.gated}"
                              for r in gates.undecided) + "."]
    notes = [f"- seed {seed}, {setting}: {note}" for setting, by_seed in unconverged.items()
             for seed, note in by_seed.items()]
    if notes:
        lines += ["", "Baselines the control's check finds unconverged (docs/method.md, \"The powered design: "
                  "rules fixed before it ran\"; seeds/spread.md has every seed's control - baseline):", *notes]
    elif spread is not None:
        lines += ["", "The control's check finds every seed's baseline converged: no lambda = 0 control gains over its "
                  "baseline in BLEU or NLL beyond its paired interval (seeds/spread.md)."]
    lines += ["", f"Each seed's difference read off its own curve at the head count (linear interpolation between "
              f"the runs that bracket it, never extrapolated), averaged over the seeds that reach it; 95% "
              f"intervals from {BOOTSTRAP_SAMPLES} resamples of seeds and of the {n_sentences} test sentences "
              f"together (seed_statistics.two_level_bootstrap). Resolves: the smallest true difference detected "
              f"with 80% power (power.power_statement). BLEU: sacrebleu's statistics summed per resample; NLL: "
              f"mean per reference token (positive: the first model is worse). Verdicts: docs/method.md, \"Rules "
              f"fixed before the rerun\" (margins {', '.join(f'{s} {m:g}' for s, m in NO_LOSS_MARGIN.items())} "
              f"BLEU; Holm across the counts)."]
    return "\n".join(lines) + "\n"
