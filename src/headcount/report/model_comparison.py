"""The same question on several models: one table comparing experiments' head analyses,
a column per model. What compare_models.py calls.

Per model, from the experiment's own outputs: test BLEU (baseline/scores.tsv), the heads of each
role (syntax/roles.csv; roles.registry's names), the largest positional share of any head that gets
roles with that head and its offset, LRP concentration per attention type (specialisation's
definition, averaged over layers) and single-head ablation per type (heads/scores.csv).

The largest positional share is the number on which models were seen to differ (0.51
for fairseq's model against 0.36 for headcount's at 2,000 updates), so it alone gets intervals: a
paired bootstrap over the analysis sentences. Each model's per-sentence counts (roles.collect's
`sentence_positional_counts`: at each head's most frequent offset, the queries that point there
and those for which it is a valid key) are summed over the same resampled sentence indices for
every model; the statistic of a resample is the largest share of any head in it, so an interval
covers which head is the largest as well as how large it is. Models may segment a sentence
differently: they are paired by sentence, never by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from headcount.analysis.roles.registry import ROLE_ATTENTION, role_names
from headcount.analysis.specialisation import lrp_concentration, lrp_top_share
from headcount.io import HeadcountError, atomic_path, read_lines
from headcount.models.seq2seq import ATTENTION_TYPES
from headcount.report import head_label
from headcount.report.claims import FAILS, HOLDS
from headcount.report.preregistered import LRP_LAYER_SHARE, LRP_TOP_HEADS, LRP_TOP_SHARE
from headcount.training.evaluate import (
    BOOTSTRAP_SAMPLES,
    BOOTSTRAP_SEED,
    bootstrap_indices,
    bootstrap_interval,
    interval_excludes_zero,
)

# Single-head ablation: a head whose removal costs more than this is one the model leans on. BLEU
# (ablation's delta_bleu, greedy BLEU of the first heads.ablation_bleu_sentences analysis sentences)
# is measured for encoder self-attention only; the loss change (delta_loss, nats per target token on
# the analysis set) for every type.
ABLATION_BLEU_COST = 0.5
ABLATION_LOSS_COST = 0.01

MODEL_KIND = "encoder_decoder"  # the kind of model compared: translation models
ROLE_TYPE = ROLE_ATTENTION[MODEL_KIND]  # the attention type whose heads get roles (enc_self)


@dataclass(frozen=True)
class ModelOutputs:
    """One experiment's files the comparison reads."""

    name: str
    baseline_scores: str  # baseline/scores.tsv
    head_scores: str  # heads/scores.csv
    roles: str  # syntax/roles.csv


def _read(path: str, what: str, columns: Sequence[str], sep: str = ",") -> pd.DataFrame:
    try:
        table = pd.read_csv(path, sep=sep)
    except FileNotFoundError:
        raise HeadcountError(f"{path}: missing; the comparison reads the experiment's {what}: run its "
                             f"workflow first") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise HeadcountError(f"{path}: no column(s) {', '.join(missing)} in the {what}; it was written by an "
                             f"older version of the workflow: delete it and rerun the rule that writes it")
    return table


def model_row(outputs: ModelOutputs) -> dict:
    """One model's row of the comparison (module docstring), from its files; the positional share's
    interval comes from `positional_bootstrap`."""
    scores = _read(outputs.baseline_scores, "test scores", ["split", "bleu"], sep="\t")
    # No lrp column where LRP was not computed or failed conservation (measures._lrp): no concentration then.
    heads = _read(outputs.head_scores, "head scores", ["type", "layer", "head", "delta_loss", "delta_bleu"])
    roles = _read(outputs.roles, "head roles", ["layer", "head", "role", "positional_offset", "positional_fraction"])
    row: dict = {"experiment": outputs.name}
    row.update({f"bleu_{r.split}": float(r.bleu) for r in scores.itertuples()})
    known = role_names(MODEL_KIND)
    unknown = sorted(set(roles["role"]) - set(known))
    if unknown:
        raise HeadcountError(f"{outputs.roles}: roles {unknown} are not those of a translation model's heads "
                             f"({', '.join(known)}); the comparison is for encoder-decoder experiments")
    counts = roles["role"].value_counts()
    row.update({f"role_{name}": int(counts.get(name, 0)) for name in known})
    row["heads"] = len(roles)
    top = roles.loc[roles["positional_fraction"].idxmax()]
    row.update(positional_share=float(top["positional_fraction"]),
               positional_head=head_label(top["layer"], top["head"]), positional_offset=int(top["positional_offset"]))
    concentration = lrp_concentration(heads) if "lrp" in heads else None
    top_share = lrp_top_share(heads, LRP_TOP_HEADS) if "lrp" in heads else None
    for kind in ATTENTION_TYPES:
        part = heads[heads["type"] == kind]
        if part.empty:
            continue
        if concentration is not None:
            row[f"lrp_concentration_{kind}"] = float(concentration[kind].mean())
            # each layer's top heads' share, in layer order: the LRP rule averages them over models
            row[f"lrp_top_shares_{kind}"] = ",".join(f"{v:.6f}" for v in top_share[kind].sort_index())
        row[f"heads_{kind}"] = len(part)
        for column, cost, threshold in (("delta_bleu", "bleu", ABLATION_BLEU_COST),
                                        ("delta_loss", "loss", ABLATION_LOSS_COST)):
            # BLEU falls and loss rises when a head the model needs is removed: cost in both as a positive number
            costs = 0.0 - part[column] if column == "delta_bleu" else part[column]  # 0.0 - : no -0.00
            if costs.isna().all():
                continue
            worst = part.loc[costs.idxmax()]
            row[f"ablation_{cost}_max_{kind}"] = float(costs.max())
            row[f"ablation_{cost}_head_{kind}"] = head_label(worst["layer"], worst["head"])
            row[f"ablation_{cost}_over_{kind}"] = int((costs > threshold).sum())
    return row


# --------------------------------------------------------------------------------------------
# The largest positional share with paired bootstrap intervals


def largest_share(hits: np.ndarray, valid: np.ndarray) -> float:
    """The largest share of any head: hits and valid (N, L, H) summed over the sentences."""
    total = valid.sum(axis=0)
    return float(np.max(np.where(total > 0, hits.sum(axis=0) / np.maximum(total, 1), 0.0)))


def resample_weights(n_sentences: int, n_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(n_samples, n_sentences): how often each sentence is drawn in each resample, the draw of
    every paired bootstrap of the project (evaluate.bootstrap_indices)."""
    index = bootstrap_indices(n_sentences, n_samples, seed)
    weights = np.zeros((n_samples, n_sentences), np.int64)
    np.add.at(weights, (np.arange(n_samples)[:, None], index), 1)
    return weights


def resampled_largest_share(hits: np.ndarray, valid: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(n_samples,): the largest share of any head in each resample (weights from resample_weights)."""
    n = hits.shape[0]
    hit_sums = weights @ hits.reshape(n, -1)  # (n_samples, heads)
    valid_sums = weights @ valid.reshape(n, -1)
    shares = np.where(valid_sums > 0, hit_sums / np.maximum(valid_sums, 1), 0.0)
    return shares.max(axis=1)


def positional_bootstrap(counts: dict[str, tuple[np.ndarray, np.ndarray]], n_samples: int = BOOTSTRAP_SAMPLES,
                         seed: int = BOOTSTRAP_SEED) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The largest positional share of each model with its 95% interval, and of every pair's
    difference (the later-listed model minus the earlier), from one paired bootstrap over sentences.

    counts: model -> (hits, valid), each (N, L, H) with row i the same sentence for every model
    (sentence_positional_counts). Returns (shares: experiment, positional_share, _low, _high,
    sentences; differences: experiment, minus, difference, low, high)."""
    sizes = {name: hits.shape[0] for name, (hits, _) in counts.items()}
    if len(set(sizes.values())) != 1:
        raise HeadcountError(f"positional counts over different numbers of sentences {sizes}: the models must be "
                             f"compared on the same analysis sentences")
    n = next(iter(sizes.values()))
    weights = resample_weights(n, n_samples, seed)
    resampled = {name: resampled_largest_share(hits, valid, weights) for name, (hits, valid) in counts.items()}
    shares = pd.DataFrame([{"experiment": name, "positional_share": largest_share(*counts[name]),
                            **dict(zip(("positional_share_low", "positional_share_high"),
                                       bootstrap_interval(resampled[name]))), "sentences": n}
                           for name in counts])
    differences = []
    for first, second in combinations(counts, 2):
        low, high = bootstrap_interval(resampled[second] - resampled[first])
        differences.append({"experiment": second, "minus": first,
                            "difference": largest_share(*counts[second]) - largest_share(*counts[first]),
                            "low": low, "high": high})
    return shares, pd.DataFrame(differences, columns=["experiment", "minus", "difference", "low", "high"])


# --------------------------------------------------------------------------------------------
# The table


def comparison_table(rows: list[dict], shares: pd.DataFrame | None = None,
                     differences: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per model (model_row), with the bootstrap's share, interval and sentences where
    given (positional_bootstrap) and, per pair, the later model's difference from the earlier:
    positional_share_minus_<earlier>, with _low and _high."""
    table = pd.DataFrame(rows)
    if shares is not None:
        bootstrap = shares.rename(columns={"positional_share": "positional_share_bootstrap",
                                           "sentences": "positional_sentences"})
        table = table.merge(bootstrap, on="experiment", how="left")
    for r in (differences.itertuples() if differences is not None else ()):
        column = f"positional_share_minus_{r.minus}"
        for new in (column, f"{column}_low", f"{column}_high"):
            if new not in table:
                table[new] = np.nan
        table.loc[table["experiment"] == r.experiment, [column, f"{column}_low", f"{column}_high"]] = (
            r.difference, r.low, r.high)
    return table


def lrp_concentration_verdict(table: pd.DataFrame, kind: str) -> tuple[str, str] | None:
    """"A few heads carry most relevance" (docs/method.md, rules fixed before the rerun) over the
    models of the table (e.g. the seeds of one experiment): each layer's top-LRP_TOP_HEADS share
    averaged over the models; it holds where more than LRP_LAYER_SHARE of the layers exceed
    LRP_TOP_SHARE, and does not hold otherwise. None without LRP for this type."""
    column = f"lrp_top_shares_{kind}"
    if column not in table or table[column].isna().all():
        return None
    per_model = np.array([[float(v) for v in str(cell).split(",")] for cell in table[column].dropna()])
    mean = per_model.mean(axis=0)  # (layers,)
    over = int((mean > LRP_TOP_SHARE).sum())
    verdict = HOLDS if over > LRP_LAYER_SHARE * len(mean) else FAILS
    return verdict, (f"{over} of {len(mean)} layers have their top {LRP_TOP_HEADS} heads above "
                     f"{LRP_TOP_SHARE:g} of the relevance (mean over {len(per_model)} models; per layer "
                     + ", ".join(f"{v:.2f}" for v in mean) + ")")


def _value(row: pd.Series, column: str, fmt: str) -> str:
    value = row.get(column)
    return "" if value is None or pd.isna(value) else format(value, fmt)


def _cost(row: pd.Series, cost: str, kind: str) -> str:
    value = _value(row, f"ablation_{cost}_max_{kind}", ".2f" if cost == "bleu" else ".3f")
    return f"{value} ({row[f'ablation_{cost}_head_{kind}']})" if value else ""


def _share(row: pd.Series) -> str:
    cell = f"{row['positional_share']:.2f}"
    if not pd.isna(row.get("positional_share_low", np.nan)):
        cell += f" [{row['positional_share_low']:.2f}, {row['positional_share_high']:.2f}]"
    return f"{cell} ({row['positional_head']}, offset {int(row['positional_offset']):+d})"


def describe_share_difference(difference: float, low: float, high: float) -> str:
    """A difference of shares with its interval; called a difference only when the interval excludes 0."""
    verdict = "difference" if interval_excludes_zero(low, high) else "no difference shown"
    return f"{difference:+.2f} [{low:+.2f}, {high:+.2f}], {verdict}"


def comparison_markdown(name: str, table: pd.DataFrame, differences: pd.DataFrame | None = None,
                        descriptions: dict[str, str] | None = None, n_samples: int = BOOTSTRAP_SAMPLES) -> str:
    """The comparison as markdown: a column per model, a row per statistic, then the paired
    differences of the largest positional share and what each row means."""
    models = list(table["experiment"])
    rows = [r for _, r in table.iterrows()]
    lines = [f"### {name}: the same analyses on {len(models)} models", "",
             "| | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]

    def add(label: str, cells: list[str]) -> None:
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for column in [c for c in table.columns if c.startswith("bleu_")]:
        add(f"test BLEU, {column.removeprefix('bleu_')}", [_value(r, column, ".2f") for r in rows])
    for role in role_names(MODEL_KIND):
        add(f"{ROLE_TYPE} heads: {role}", [f"{int(r[f'role_{role}'])} of {int(r['heads'])}" for r in rows])
    add(f"largest {ROLE_TYPE} positional share [95% interval] (head, offset)", [_share(r) for r in rows])
    for kind in ATTENTION_TYPES:
        add(f"LRP concentration, {kind}", [_value(r, f"lrp_concentration_{kind}", ".2f") for r in rows])
    for kind in ATTENTION_TYPES:
        reading = lrp_concentration_verdict(table, kind)
        if reading is not None:
            add(f"a few heads carry most relevance, {kind} (over these models)",
                [f"**{reading[0]}**: {reading[1]}"] + [""] * (len(rows) - 1))
    for kind in ATTENTION_TYPES:
        add(f"largest ablation BLEU cost, {kind} (head)", [_cost(r, "bleu", kind) for r in rows])
        add(f"heads costing > {ABLATION_BLEU_COST:g} BLEU, {kind}",
            [f"{int(r[f'ablation_bleu_over_{kind}'])} of {int(r[f'heads_{kind}'])}"
             if not pd.isna(r.get(f"ablation_bleu_over_{kind}", np.nan)) else "" for r in rows])
    for kind in ATTENTION_TYPES:
        add(f"largest ablation loss increase, {kind} (head)", [_cost(r, "loss", kind) for r in rows])
        add(f"heads costing > {ABLATION_LOSS_COST:g} nats, {kind}",
            [f"{int(r[f'ablation_loss_over_{kind}'])} of {int(r[f'heads_{kind}'])}"
             if not pd.isna(r.get(f"ablation_loss_over_{kind}", np.nan)) else "" for r in rows])
    if differences is not None and len(differences):
        lines += ["", f"Largest {ROLE_TYPE} positional share, paired differences:", "",
                  "| models | difference [95% interval] |", "|---|---|"]
        for r in differences.itertuples():
            lines.append(f"| {r.experiment} - {r.minus} | {describe_share_difference(r.difference, r.low, r.high)} |")
    sentences = table["positional_sentences"].iloc[0] if "positional_sentences" in table else None
    notes = [
        "Heads are layer.head, both counted from 1. Roles: syntax/roles.csv of each experiment "
        "(headcount.analysis.roles; a head that qualifies for several gets one).",
        f"Largest positional share: over the {ROLE_TYPE} heads, the share of query tokens whose argmax key "
        f"lies at the head's most frequent offset, among the queries for which that key exists (subword "
        f"level, EOS and padding excluded; roles.csv's positional_fraction).",
    ]
    if sentences is not None and not pd.isna(sentences):
        notes.append(f"Its 95% intervals: paired bootstrap over the {int(sentences)} analysis sentences "
                     f"({n_samples} resamples, the same sentences drawn for every model; each resample's "
                     f"largest share of any head); a \"difference\" is one whose interval excludes 0.")
    notes += [
        "LRP concentration: per layer, the top head's share of the layer's LRP relevance "
        "(headcount.analysis.specialisation), averaged over the layers; 1/H when every head gets the same share.",
        f"Ablation: each head masked alone (heads/scores.csv): BLEU cost = BLEU before - BLEU masked (greedy, "
        f"the first heads.ablation_bleu_sentences analysis sentences; {ROLE_TYPE} only), loss increase = "
        f"teacher-forced loss on the analysis set masked - before (nats per token).",
    ]
    for model, description in (descriptions or {}).items():
        notes.append(f"{model}: {description}.")
    lines += ["", " ".join(notes)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# The stage


@dataclass(frozen=True)
class ModelRun:
    """What running one experiment's model over the analysis sentences needs."""

    model: str  # baseline/model.pt
    src_tokenizer: str  # the src_spm input of the role stage
    analysis_src: str  # the analysis set's source side
    lowercase: bool


def positional_counts(run: ModelRun, texts: list[str], device: str = "auto",
                      log=print) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """One model's positional table and per-sentence counts on `texts` (the model-running part)."""
    from headcount.analysis.roles.collect import sentence_positional_counts
    from headcount.models.device import pick_device
    from headcount.models.loading import load_model, open_tokenizer

    model = load_model(run.model).eval()
    return sentence_positional_counts(model, open_tokenizer(run.src_tokenizer, "source"), texts, run.lowercase,
                                      device=pick_device(device), log=log)


def analysis_texts(runs: dict[str, ModelRun], max_sentences: int) -> list[str]:
    """The analysis sentences every model reads: the first `max_sentences` lines, which must be the
    same lines in every experiment (the bootstrap pairs models by sentence)."""
    texts = {name: read_lines(run.analysis_src)[:max_sentences] for name, run in runs.items()}
    first = next(iter(texts))
    for name, lines in texts.items():
        if lines != texts[first]:
            raise HeadcountError(f"{runs[name].analysis_src} and {runs[first].analysis_src}: the analysis sentences "
                                 f"of {name} and {first} differ, so their heads cannot be compared sentence by "
                                 f"sentence; give the experiments the same analysis.set data and max_sentences")
    return texts[first]


def compare_models(name: str, outputs: list[ModelOutputs], runs: dict[str, ModelRun], max_sentences: int,
                   out: dict, descriptions: dict[str, str] | None = None, device: str = "auto",
                   n_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED, log=print) -> pd.DataFrame:
    """The comparison `name` of the experiments in `outputs` (their order is the table's), written
    to out["table"] (TSV, one row per model) and out["markdown"]. `runs` gives each model and its
    analysis set, for the bootstrap of the largest positional share."""
    rows = [model_row(o) for o in outputs]
    texts = analysis_texts(runs, max_sentences)
    counts = {}
    for o in outputs:
        log(f"{o.name}: positional counts on {len(texts)} analysis sentences")
        table, hits, valid = positional_counts(runs[o.name], texts, device, log)
        counts[o.name] = (hits, valid)
        found = next(r["positional_share"] for r in rows if r["experiment"] == o.name)
        if abs(largest_share(hits, valid) - found) > 1e-6:
            log(f"WARNING: {o.name}: the largest positional share recomputed here ({largest_share(hits, valid):.4f}) "
                f"is not roles.csv's ({found:.4f}); was syntax/roles.csv made on another device or model?")
    shares, differences = positional_bootstrap(counts, n_samples, seed)
    table = comparison_table(rows, shares, differences)
    with atomic_path(out["table"]) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4g")
    with atomic_path(out["markdown"]) as tmp:
        tmp.write_text(comparison_markdown(name, table, differences, descriptions, n_samples), encoding="utf-8")
    log("\n" + shares.to_string(index=False) + "\n" + differences.to_string(index=False))
    return table

