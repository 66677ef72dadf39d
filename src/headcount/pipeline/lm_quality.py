"""A language model's quality over files: perplexity of a text set (the language-model counterpart
of translating and scoring with BLEU), the ranked curve's points as perplexities, and the pruning
table of a language-model experiment with each pruned model's NLL difference from the baseline and
its paired bootstrap interval. What lm_quality.py and lm_pruning_report.py call (ranked_curve.py
through pruning_runs.ranked_curve).

Lower is better throughout: NLL is in nats per token, perplexity exp(NLL). A sentence encoder
(objective sentence_embedding) has neither: its quality is the mean cosine distance of its pooled
embedding to the unpruned model's (models.sentence_embedding; 0 for the baseline), each sentence one
unit, so the same per-sentence files and paired intervals carry it under the name `distance`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.io import HeadcountError, atomic_path, read_lines, write_json

# The per-sentence file beside a scores JSON: what paired bootstrap intervals read.
NLL_COLUMNS = ("sentence", "nll", "tokens")
# A sentence encoder's quality, as its records, tables and pages name it.
DISTANCE = "distance"
DISTANCE_LABEL = "cosine distance to the unpruned model's pooled embedding (lower is better)"


def is_distance_kind(model_kind: str) -> bool:
    """Whether a model kind's quality is the embedding distance rather than perplexity."""
    from headcount.models.seq2seq import MODEL_KINDS, SENTENCE_EMBEDDING

    return model_kind in MODEL_KINDS and MODEL_KINDS[model_kind].objective == SENTENCE_EMBEDDING


def text_nll(model, tokenizer, lines: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Each line's summed NLL (nats) and scored tokens under a language model (its text on both
    sides, training.perplexity.sentence_nll); a sentence encoder's embedding distance and 1."""
    from headcount.training.perplexity import sentence_nll

    ids = tokenizer.encode(lines)
    return sentence_nll(model, ids, ids, max_tokens=max_tokens)


def quality_record(split: str, nll: np.ndarray, tokens: np.ndarray, model_kind: str) -> dict:
    """The scores JSON of a language model on one set (a sentence encoder's: the mean distance)."""
    from headcount.training.perplexity import perplexity

    total = int(np.sum(tokens))
    if is_distance_kind(model_kind):
        return {"split": split, "sentences": int(len(nll)), "tokens": total, DISTANCE: float(np.mean(nll)) if
                len(nll) else 0.0, "measure": DISTANCE_LABEL, "model_kind": model_kind, "lower_is_better": True}
    return {"split": split, "sentences": int(len(nll)), "tokens": total,
            "nll": float(np.sum(nll)) / max(total, 1), "perplexity": perplexity(nll, tokens),
            "model_kind": model_kind, "lower_is_better": True}


def score_text(model_path: str, tokenizer_path: str, text: str, split: str, max_tokens: int, out_json: str,
               out_nll: str, device: str = "auto", log=print) -> dict:
    """Perplexity of a model on one set (the lines of `text`): mean NLL per token, perplexity,
    tokens and sentences to `out_json`; each sentence's NLL and tokens to `out_nll` (TSV)."""
    from headcount.models.device import pick_device
    from headcount.models.loading import load_model, open_tokenizer
    from headcount.models.seq2seq import kind_of

    dev = pick_device(device)
    model = load_model(model_path).to(dev).eval()
    kind = kind_of(model)
    if kind.objective == "translation":
        # The import refuses this (training_runs.import_pretrained_baseline); a model put here by hand is not.
        raise HeadcountError(f"{model_path}: a translation model, and perplexity is a language model's quality: "
                             f"this experiment's config key 'text' asks for a causal or masked language model. Set "
                             f"pretrained to one, or analyse this model with train/dev/test and src_lang/tgt_lang")
    lines = read_lines(text)
    nll, tokens = text_nll(model, open_tokenizer(tokenizer_path, "source"), lines, max_tokens)
    record = quality_record(split, nll, tokens, kind.name)
    with atomic_path(out_nll) as tmp:
        pd.DataFrame({"sentence": range(len(nll)), "nll": nll, "tokens": tokens}).to_csv(
            tmp, sep="\t", index=False, float_format="%.6f")
    write_json(out_json, record)
    if DISTANCE in record:
        log(f"{split}: {record['sentences']} sentences ({kind.objective}), mean {DISTANCE_LABEL} "
            f"{record[DISTANCE]:.6f}")
        return record
    log(f"{split}: {record['sentences']} sentences, {record['tokens']} tokens ({kind.objective}), NLL "
        f"{record['nll']:.4f} nats/token, perplexity {record['perplexity']:.2f}")
    return record


def perplexity_curve(model, curve, tokenizer, lines: list[str], setting: str, max_tokens: int,
                     log=print) -> tuple[list[dict], list[dict]]:
    """A ranked method's curve on a language model (pruning_runs.ranked_curve): for each
    (fraction removed, head masks) of `curve`, the text's perplexity with those heads masked.
    -> (the table's rows, each point's per-sentence NLL and tokens)."""
    from headcount.pruning.ranked import retained_counts

    rows, points = [], []
    kind = getattr(model, "model_kind", "")
    for fraction, masks in curve:
        model.set_head_mask(masks)
        nll, tokens = text_nll(model, tokenizer, lines, max_tokens)
        record, counts = quality_record(setting, nll, tokens, kind), retained_counts(masks)
        points.append({"removed_fraction": fraction, "retained": counts, "nll": nll.tolist(),
                       "tokens": tokens.tolist()})
        quality = ({DISTANCE: record[DISTANCE]} if DISTANCE in record
                   else {"perplexity": record["perplexity"], "nll": record["nll"]})
        rows.append({"setting": setting, "removed_fraction": fraction,
                     **{f"retained_{k}": v for k, v in counts.items()}, "retained_total": sum(counts.values()),
                     **quality})
        log(f"removed {fraction:.0%} of {setting} heads: {counts} "
            + ", ".join(f"{k} {v:.6g}" for k, v in quality.items()))
    return rows, points


def read_nll(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    table = pd.read_csv(path, sep="\t")
    return table["nll"].to_numpy(dtype=float), table["tokens"].to_numpy(dtype=float)


def _against_baseline(baseline_nll: str, gates: list[str], pruned_scores: list[str], pruned_nll: list[str],
                      unit: str):
    """Per pruned model (its gates.json, scores and per-unit losses, in order): the run's columns
    (setting, lambda, control, heads kept, steps), its score record, and the 95% paired bootstrap
    interval of its per-unit loss minus the baseline's (`unit`: what the losses are per, named in
    the error when the two sets differ)."""
    from headcount.training.perplexity import paired_bootstrap_nll

    base_loss, base_units = read_nll(baseline_nll)
    for gates_path, score_path, nll_path in zip(gates, pruned_scores, pruned_nll, strict=True):
        with open(gates_path, encoding="utf-8") as f:
            record = json.load(f)
        with open(score_path, encoding="utf-8") as f:
            score = json.load(f)
        loss, units = read_nll(nll_path)
        if not np.array_equal(units, base_units):
            raise ValueError(f"{nll_path} scores other {unit} than {baseline_nll}: not the same set")
        retained = record["retained"]
        run = {"setting": record["setting"], "lam": record["lambda"], "control": record["control"],
               **{f"retained_{k}": v for k, v in retained.items()}, "retained_total": sum(retained.values()),
               "steps": record["steps"]["total"]}
        yield run, score, paired_bootstrap_nll(loss, base_loss, units)


def lm_pruning_report(baseline_scores: str, baseline_nll: str, gates: list[str], pruned_scores: list[str],
                      pruned_nll: list[str], ranked: list[str], out_table: str, out_markdown: str,
                      experiment: str, log=print) -> pd.DataFrame:
    """The pruning table of a language-model experiment: per pruned model (gates.json in the
    order of `pruned_scores`), the heads kept, its perplexity on the evaluation set and its NLL
    minus the baseline's with a 95% paired bootstrap interval over sentences
    (training.perplexity.paired_bootstrap_nll); and the ranked methods' curves (perplexity per
    fraction of heads removed). Translation's claims and verdict pages are not made: they read
    BLEU, Table 2's paper values and the encoder/decoder split, none of which a language model has."""
    with open(baseline_scores, encoding="utf-8") as f:
        base = json.load(f)
    if DISTANCE in base:
        return _distance_pruning_report(base, baseline_nll, gates, pruned_scores, pruned_nll, ranked, out_table,
                                        out_markdown, experiment, log)
    rows = [{**run, "perplexity": score["perplexity"], "nll": score["nll"], "delta_nll": interval["difference"],
             "delta_nll_low": interval["low"], "delta_nll_high": interval["high"], "p_value": interval["p_value"],
             "perplexity_ratio": float(np.exp(interval["difference"]))}
            for run, score, interval in _against_baseline(baseline_nll, gates, pruned_scores, pruned_nll, "tokens")]
    table = pd.DataFrame(rows)
    with atomic_path(out_table) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
    curves = [pd.read_csv(path, sep="\t").assign(method=Path(path).stem) for path in ranked]
    lines = [f"# Pruning {experiment}: perplexity (lower is better)", "",
             f"Baseline on {base['split']}: perplexity {base['perplexity']:.3f} (NLL {base['nll']:.4f} nats/token, "
             f"{base['tokens']} tokens, {base['sentences']} sentences).", "",
             "## Hard Concrete gates", "",
             "| setting | lambda | heads kept | perplexity (lower is better) | delta NLL vs baseline, nats/token "
             "[95% paired bootstrap] | perplexity ratio |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['setting']} | {row['lam']:g}{' (control)' if row['control'] else ''} | "
                     f"{row['retained_total']} | {row['perplexity']:.3f} | {row['delta_nll']:+.4f} "
                     f"[{row['delta_nll_low']:+.4f}, {row['delta_nll_high']:+.4f}] | {row['perplexity_ratio']:.3f} |")
    for curve in curves:
        lines += ["", f"## Ranked: {curve['method'].iloc[0] if len(curve) else ''} (no retraining)", "",
                  "| setting | heads removed | heads kept | perplexity (lower is better) |", "|---|---|---|---|"]
        lines += [f"| {r.setting} | {r.removed_fraction:.0%} | {r.retained_total} | {r.perplexity:.3f} |"
                  for r in curve.itertuples()]
    lines += ["", "A language model has no BLEU, no Table 2 of the paper and one kind of attention: the claims "
              "and verdict pages of a translation experiment (claims.md, encoder.md, Figures 7-10) are not made.", ""]
    with atomic_path(out_markdown) as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    log(f"{len(rows)} pruned models, {len(curves)} ranked curves; baseline perplexity {base['perplexity']:.3f}")
    return table


def _distance_pruning_report(base: dict, baseline_nll: str, gates: list[str], pruned_scores: list[str],
                             pruned_nll: list[str], ranked: list[str], out_table: str, out_markdown: str,
                             experiment: str, log) -> pd.DataFrame:
    """lm_pruning_report of a sentence encoder: per pruned model its mean embedding distance to
    the unpruned model and that minus the baseline's (0, up to rounding), with the 95% paired
    bootstrap interval over sentences (paired_bootstrap_nll with one unit per sentence)."""
    rows = [{**run, DISTANCE: score[DISTANCE], f"delta_{DISTANCE}": interval["difference"],
             f"delta_{DISTANCE}_low": interval["low"], f"delta_{DISTANCE}_high": interval["high"],
             "p_value": interval["p_value"]}
            for run, score, interval in _against_baseline(baseline_nll, gates, pruned_scores, pruned_nll, "sentences")]
    table = pd.DataFrame(rows)
    with atomic_path(out_table) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
    curves = [pd.read_csv(path, sep="\t").assign(method=Path(path).stem) for path in ranked]
    lines = [f"# Pruning {experiment}: {DISTANCE_LABEL}", "",
             f"Baseline on {base['split']}: mean distance {base[DISTANCE]:.6f} ({base['sentences']} sentences; "
             f"the unpruned model is its own reference). Only the gates were trained: the weights are the "
             f"baseline's.", "",
             "## Hard Concrete gates", "",
             "| setting | lambda | heads kept | mean distance (lower is better) | difference from the baseline "
             "[95% paired bootstrap] |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['setting']} | {row['lam']:g}{' (control)' if row['control'] else ''} | "
                     f"{row['retained_total']} | {row[DISTANCE]:.6f} | {row[f'delta_{DISTANCE}']:+.6f} "
                     f"[{row[f'delta_{DISTANCE}_low']:+.6f}, {row[f'delta_{DISTANCE}_high']:+.6f}] |")
    for curve in curves:
        lines += ["", f"## Ranked: {curve['method'].iloc[0] if len(curve) else ''} (no retraining)", "",
                  "| setting | heads removed | heads kept | mean distance (lower is better) |", "|---|---|---|---|"]
        lines += [f"| {r.setting} | {r.removed_fraction:.0%} | {r.retained_total} | {getattr(r, DISTANCE):.6f} |"
                  for r in curve.itertuples()]
    lines += ["", "A sentence encoder has no vocabulary output: no perplexity, no BLEU, no LRP and no Michel "
              "importance (identically 0 at the unpruned model), so no Michel curve; the claims and verdict pages of "
              "a translation experiment are not made.", ""]
    with atomic_path(out_markdown) as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    log(f"{len(rows)} pruned models, {len(curves)} ranked curves; baseline mean distance {base[DISTANCE]:.6f}")
    return table
