"""The head-scores stage: every head's importance by every registered measure
(importance.MEASURES), their rank correlations with ablation and LRP's conservation, from files.
What score_heads.py calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from headcount.analysis.correlations import rank_correlations
from headcount.analysis.importance import dev_batches
from headcount.analysis.measures import (
    LRP_MEASURE,
    MEASURES,
    ScoringInputs,
    reference_score,
    score_table,
    undefined_measures,
)
from headcount.io import atomic_path, read_lines
from headcount.models.device import pick_device
from headcount.models.loading import load_model, open_tokenizer
from headcount.models.seq2seq import kind_of
from headcount.report.preregistered import ABLATION_MIN_RESOLVED_HEADS
from headcount.training.decode import translate
from headcount.training.evaluate import corpus_bleu


def score_heads(
    model_path: str, src_spm: str, tgt_spm: str, analysis_src: str, analysis_tgt: str, translations: str,
    max_sentences: int, lrp_rule: str, ablation: bool, ablation_bleu_sentences: int, max_tokens: int,
    lowercase: bool, out_table: str, out_csv: str, out_correlations: str, out_conservation: str,
    device: str = "auto", log=print,
):
    """Every head's score by every registered measure (importance.MEASURES: confidence, Michel
    importance, LRP relevance, and single-head ablation when `ablation`).

    Confidence, Michel importance and ablation read the reference translations of the analysis
    set; LRP teacher-forces the model's own beam translations of it ("generation steps").

    A language model (seq2seq.kind_of: decoder_only or encoder_only) reads its analysis text on
    both sides (its objective's batches, data.batching.objective_tensors; `translations` is that
    text, too); ablation has no delta_bleu (nothing is translated). A measure undefined for the
    model's objective (measures.Measure.undefined_for: a sentence encoder's Michel importance) is
    left out, the log saying why. A model whose `lrp_forward`
    is not implemented (NotImplementedError: hf_lm.LRPNotImplemented) gets no lrp column, and the
    log and `out_conservation` say why; once it is implemented, LRP runs with the others. Nor
    does a model whose LRP relevance is not conserved within relevance.CONSERVATION_TOLERANCE at
    some cut (measures._lrp): the log names the cut, `out_conservation` marks it (within_tolerance).
    """
    dev = pick_device(device)
    model = load_model(model_path).to(dev).eval()
    objective = kind_of(model).objective
    src_seg, tgt_seg = open_tokenizer(src_spm, "source"), open_tokenizer(tgt_spm, "target")
    src = src_seg.encode(read_lines(analysis_src)[:max_sentences])
    references = read_lines(analysis_tgt)[:max_sentences]
    hyps = read_lines(translations)[:max_sentences]

    def batches_of(tgt_lines: list[str]) -> list:
        return [[x.to(dev) for x in b] for b in dev_batches(src, tgt_seg.encode(tgt_lines), max_tokens,
                                                                 special=model.special, objective=objective,
                                                                 max_positions=getattr(model, "max_positions", None))]

    bleu_src, bleu_refs = src[:ablation_bleu_sentences], references[:ablation_bleu_sentences]

    def bleu_fn(m) -> float:  # greedy, for speed: the change from removing one head is what counts
        hyps = translate(m, bleu_src, beam=1, max_tokens=max_tokens, device=dev)
        return corpus_bleu(tgt_seg.decode(hyps), bleu_refs, lowercase=lowercase)

    if objective != "translation" and ablation_bleu_sentences:
        log(f"a {objective} model translates nothing: ablation's delta_bleu is not computed "
            f"(heads.ablation_bleu_sentences {ablation_bleu_sentences} ignored)")
        ablation_bleu_sentences = 0
    log(f"scoring heads on {len(src)} sentences on {dev} (LRP rule {lrp_rule}, ablation {ablation})")
    scores = score_model(model, batches_of(references), batches_of(hyps), lrp_rule=lrp_rule, ablation=ablation,
                         bleu_fn=bleu_fn if ablation_bleu_sentences else None, log=log)
    table, correlations, conservation = scores.table, scores.correlations, scores.conservation
    with atomic_path(out_table) as tmp:
        table.to_parquet(tmp, index=False)
    with atomic_path(out_csv) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(out_correlations) as tmp:
        correlations.to_csv(tmp, sep="\t", index=False, float_format="%.4f")
    with atomic_path(out_conservation) as tmp:
        conservation.to_csv(tmp, sep="\t", index=False, float_format="%.3g")
    if len(correlations):
        overall = correlations[correlations["layer"] == "all"]
        log("Spearman with ablation impact (delta dev loss), all layers:\n" + overall.to_string(index=False))
    return table


@dataclass
class HeadScores:
    """What the head-scores stage finds: every head's scores (one row per head), their rank
    correlations with the reference score (ablation), and LRP's conservation per cut (or a note
    saying why there is no LRP)."""

    table: pd.DataFrame
    correlations: pd.DataFrame
    conservation: pd.DataFrame


def score_model(model, reference_batches: list, own_batches: list, lrp_rule: str, ablation: bool,
                bleu_fn=None, log=print, only: Sequence[str] | None = None) -> HeadScores:
    """Every head's score by every registered measure, on batches already on the model's device
    (importance.dev_batches): `reference_batches` teacher-force the references (confidence,
    Michel, ablation), `own_batches` the model's own translations (LRP; a language model's: its
    text again). `bleu_fn` (model -> BLEU), if given, adds ablation's delta_bleu. `only`: these
    measures (importance.MEASURES' names) and no others, where defined. The workflow's
    score_heads and headcount.api.analyse both call this: they cannot drift apart."""
    objective = kind_of(model).objective
    lrp_missing = _lrp_unavailable(model)
    if lrp_missing:
        log(f"no LRP relevance (the lrp column is left out): {lrp_missing}")
    undefined = undefined_measures(objective)  # a sentence encoder's Michel importance, say
    for name, why in undefined.items():
        log(f"no {name} columns: {why}")
    # LRP's cost against a forward+backward pass is measured by `make bench`, not here: timing it
    # cost the job a pass over every batch that served only a log line.
    inputs = ScoringInputs(model, reference_batches, own_batches, lrp_rule, bleu_fn, log)
    measures = [m.name for m in MEASURES.values() if (ablation or not m.optional)
                and not (lrp_missing and m.name == LRP_MEASURE) and m.name not in undefined
                and (only is None or m.name in only)]
    table = score_table(inputs, measures)
    correlations = (rank_correlations(table, min_resolved=ABLATION_MIN_RESOLVED_HEADS) if reference_score() in table
                    else pd.DataFrame())
    if lrp_missing:
        conservation = pd.DataFrame({"note": [f"LRP not computed: {lrp_missing}"]})
    elif LRP_MEASURE in measures:
        conservation = inputs.notes["lrp_conservation"].assign(lrp_seconds=inputs.notes["lrp_seconds"])
    else:
        conservation = pd.DataFrame({"note": ["LRP not asked for"]})
    return HeadScores(table, correlations, conservation)



def _lrp_unavailable(model) -> str | None:
    """Why the model has no LRP (its lrp_forward raises NotImplementedError), or None if it has."""
    try:
        model.lrp_forward()
    except NotImplementedError as error:
        return str(error)
    return None
