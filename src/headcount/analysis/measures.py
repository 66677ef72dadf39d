"""The registry of head importance measures, and the score table it assembles.

Each measure names its columns in the score table (heads/scores.csv) and says how it is
computed; the head-scores stage (`score_table`), the rank correlations (correlations.
rank_correlations) and the workflow's heatmaps (workflow/rules/common.smk) iterate `MEASURES`, so
a new measure is one `register_measure` here. This module imports neither torch nor pandas at
load time: the workflow's rule files read the score names from it when Snakemake parses them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from headcount.analysis.tables import KEYS, MICHEL_UNDEFINED


@dataclass
class ScoringInputs:
    """What the measures read."""

    model: Any  # a seq2seq.Seq2SeqWithHeads
    batches: Sequence  # (src, tgt_in, tgt_out) tensors with the reference translations
    translation_batches: Sequence | None = None  # (src, BOS + the model's own translation, ...): LRP
    lrp_rule: str = "ding"
    bleu_fn: Callable | None = None  # model -> BLEU, for ablation's delta_bleu; None: no delta_bleu
    log: Callable[[str], None] | None = None
    notes: dict = field(default_factory=dict)  # what measures report beside their columns (LRP's conservation)


@dataclass(frozen=True)
class Measure:
    """One importance measure: its columns in the score table (the first is its score, the one
    plotted and ranked) and how it is computed (-> a DataFrame, one row per (type, layer, head):
    KEYS + columns)."""

    name: str
    columns: tuple[str, ...]
    compute: Callable[[ScoringInputs], Any]
    ranked: bool = True  # ranked against the reference in the correlation table
    reference: bool = False  # the causal reference the ranked scores are compared with (ablation)
    optional: bool = False  # computed only when the settings ask (heads.ablation)
    # Model objectives (seq2seq.ModelKind.objective) the measure means nothing for, each with why:
    # its columns are left out of their score tables and the log says why (pipeline.head_scores).
    undefined_for: dict[str, str] = field(default_factory=dict)

    @property
    def score(self) -> str:
        return self.columns[0]


MEASURES: dict[str, Measure] = {}  # in the score table's column order
LRP_MEASURE = "lrp"  # the measure that needs the model's lrp_forward (left out where it has none)
ORDER_BY = LRP_MEASURE  # the measure whose score orders each layer's heads in figures (the paper's Figure 1)


def register_measure(measure: Measure) -> Measure:
    MEASURES[measure.name] = measure
    return measure


def ranked_scores() -> tuple[str, ...]:
    """The scores compared with the reference, in name order."""
    return tuple(sorted(m.score for m in MEASURES.values() if m.ranked))


def reference_score() -> str:
    return next(m.score for m in MEASURES.values() if m.reference)


def score_names(optional: bool = True) -> list[str]:
    """Every measure's score (what the heatmaps show), the optional measures' only if asked."""
    return [m.score for m in MEASURES.values() if optional or not m.optional]


def order_score() -> str:
    return MEASURES[ORDER_BY].score


def undefined_measures(objective: str | None) -> dict[str, str]:
    """{measure: why} of the measures a model of this objective does not get."""
    return {m.name: m.undefined_for[objective] for m in MEASURES.values() if objective in m.undefined_for}


def score_undefined(score: str, objective: str | None) -> str | None:
    """Why a score column is absent from a score table of this objective's model, or None (a
    ranked pruning method over it has no curve there: the workflow plans none)."""
    return next((m.undefined_for[objective] for m in MEASURES.values()
                 if score in m.columns and objective in m.undefined_for), None)


def _confidence(inputs: ScoringInputs):
    from headcount.analysis.importance import head_confidence

    return head_confidence(inputs.model, inputs.batches)


def _michel(inputs: ScoringInputs):
    from headcount.analysis.importance import michel_importance

    return michel_importance(inputs.model, inputs.batches)


def _lrp(inputs: ScoringInputs):
    """LRP relevance; without its `lrp` column (the table's keys only) where conservation fails
    beyond relevance.CONSERVATION_TOLERANCE at some cut: the log and the conservation table say so."""
    from headcount.analysis.relevance import conservation_failures, head_relevance

    start = time.perf_counter()
    relevance = head_relevance(inputs.model, inputs.translation_batches, rule=inputs.lrp_rule, log=inputs.log)
    inputs.notes.update(lrp_conservation=relevance.conservation, lrp_seconds=time.perf_counter() - start)
    failed = conservation_failures(relevance.conservation)
    if failed:
        tolerance = float(relevance.conservation["tolerance"].iloc[0])
        reason = (f"LRP ({inputs.lrp_rule}) conservation fails beyond the tolerance (mean |total - 1| <= "
                  f"{tolerance:.3g}) at {', '.join(failed)}: the lrp column is left out")
        inputs.notes["lrp_dropped"] = reason
        if inputs.log is not None:
            inputs.log(reason)
        return relevance.table[list(KEYS)]
    return relevance.table.drop(columns="n_steps")


def _ablation(inputs: ScoringInputs):
    from headcount.analysis.importance import head_ablation

    return head_ablation(inputs.model, inputs.batches, inputs.bleu_fn, log=inputs.log)


register_measure(Measure("confidence", ("confidence",), _confidence))
register_measure(Measure("michel", ("michel", "michel_raw"), _michel, undefined_for=MICHEL_UNDEFINED))
register_measure(Measure(LRP_MEASURE, ("lrp",), _lrp))
register_measure(Measure("ablation", ("delta_loss", "delta_bleu"), _ablation, ranked=False, reference=True,
                         optional=True))


def refuse_uneven_layers(model) -> None:
    """HeadcountError for a model whose layers of one attention type differ in head count: one
    whose heads were removed physically (pruning.removal), which renumbers each layer's heads, so
    a score could not name the head it belongs to. The gated model it came from keeps every head
    in its place (a closed one has a 0/1 mask of 0) and is scored as any other."""
    from headcount.models.seq2seq import heads_per_layer

    uneven = {kind: per_layer for kind, per_layer in heads_per_layer(model).items() if len(set(per_layer)) > 1}
    if uneven:
        from headcount.io import HeadcountError

        described = "; ".join(f"{kind}: {', '.join(map(str, c))} heads" for kind, c in uneven.items())
        raise HeadcountError(f"this model's layers differ in head count ({described}): its heads were removed "
                             f"physically, which numbers each layer's remaining heads afresh, so no score could "
                             f"name its head. Score the gated model instead (the pruning run's model.pt, not "
                             f"physical/model.pt), with the pruned heads masked.")


def score_table(inputs: ScoringInputs, measures: Sequence[str] | None = None):
    """Every head's scores: the given measures (default all), in the registry's order, joined on
    (type, layer, head). Measures' reports beside their columns land in `inputs.notes`."""
    unknown = set(measures or ()) - set(MEASURES)
    if unknown:
        raise ValueError(f"unknown importance measures {sorted(unknown)}; known: {list(MEASURES)}")
    names = list(MEASURES) if measures is None else [n for n in MEASURES if n in measures]
    refuse_uneven_layers(inputs.model)
    table = None
    for name in names:
        start = time.perf_counter()
        part = MEASURES[name].compute(inputs)
        if inputs.log is not None:
            inputs.log(f"{name} took {time.perf_counter() - start:.1f} s")
        table = part if table is None else table.merge(part, on=KEYS)
    return table
