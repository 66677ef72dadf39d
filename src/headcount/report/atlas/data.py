"""The head atlas's records from a finished experiment's tables (no model needed).

Everything here reads the tables the other stages wrote and turns them into the JSON-able dict the
page embeds (`page.write_page`); the attention on real sentences comes from `examples.py`, which
needs the model. The parts:

    layout      {attention type: [layers, heads]}, the types the score table holds (a model that
                lacks a type simply has none)
    measures    the score columns of the registered importance measures (headcount.measures) that
                the score table holds, each head's value and its rank in its layer (1 = largest)
    roles       the registered roles (headcount.roles) with label and colour, and per encoder head
                its role, the paper's role, the flags, the positional / syntactic / rare-token
                statistics and the thresholds and baselines they were judged against
    pruning     per setting, the runs of its lambda grid: BLEU, its paired-bootstrap intervals
                against the baseline and the control, retained heads, the heads whose gate closed
                (gates.json), and every gated head's P(closed) over the training steps
                (trajectory.csv)
    control     for the positive control, the planted functions and the heads found for them
                (control/planted_vs_found.csv)

Heads are keyed "type/layer/head", 0-based as in the tables; the page shows them 1-based.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ...analysis.measures import MEASURES
from ...analysis.roles.registry import NO_ROLE, NO_ROLE_COLOUR, NO_ROLE_LABEL, ROLE_ATTENTION, roles_for
from ...analysis.tables import KEYS
from ...models.seq2seq import ATTENTION_TYPES, kind_with_types

# The type the role analysis covers: encoder self-attention (roles.py, SPEC section 2).
ROLE_TYPE = ROLE_ATTENTION["encoder_decoder"]  # an encoder-decoder's; gather_tables reads the model kind's
# Trajectories are drawn from at most this many steps per run (evenly spaced, the last kept).
MAX_TRAJECTORY_STEPS = 200
BASELINE = "baseline"  # the pruning table's row of the unpruned model (pruning_report)


def head_key(kind: str, layer: int, head: int) -> str:
    return f"{kind}/{int(layer)}/{int(head)}"


def read_table(path: str | Path) -> pd.DataFrame:
    """A table by its suffix: Parquet, TSV or CSV."""
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",")


def clean(value):
    """A JSON-able copy: numpy scalars to Python, NaN/inf to None, floats to 6 significant digits."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            return None
        return float(f"{value:.6g}")
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    return value


def layout(scores: pd.DataFrame) -> dict[str, list[int]]:
    """{type: [layers, heads]} of the attention types in the score table, ATTENTION_TYPES first
    (in their order), then any other type a model kind brings, in table order."""
    present = list(dict.fromkeys(scores["type"]))
    ordered = [t for t in ATTENTION_TYPES if t in present] + [t for t in present if t not in ATTENTION_TYPES]
    return {t: [int(scores.loc[scores["type"] == t, "layer"].max()) + 1,
                int(scores.loc[scores["type"] == t, "head"].max()) + 1] for t in ordered}


def measure_columns(scores: pd.DataFrame) -> list[dict]:
    """The registered measures' columns that the score table holds, each measure's score first:
    [{"column", "measure", "score": is it the measure's score}]."""
    out = []
    for measure in MEASURES.values():
        out += [{"column": c, "measure": measure.name, "score": c == measure.score}
                for c in measure.columns if c in scores.columns]
    return out


def score_records(scores: pd.DataFrame) -> dict[str, dict]:
    """{head key: {"scores": {column: value}, "ranks": {column: rank in its layer, 1 = largest}}}."""
    columns = [m["column"] for m in measure_columns(scores)]
    ranks = scores.groupby(["type", "layer"])[columns].rank(ascending=False, method="min")
    out = {}
    for i, row in scores.iterrows():
        out[head_key(row["type"], row["layer"], row["head"])] = {
            "scores": {c: row[c] for c in columns},
            "ranks": {c: ranks.at[i, c] for c in columns}}
    return out


def role_legend(kind: str = "encoder_decoder") -> list[dict]:
    """The roles a head of this kind of model can get, then "none": name, label, colour."""
    return [{"name": r.name, "label": r.label, "colour": r.colour} for r in roles_for(kind)] + [
        {"name": NO_ROLE, "label": NO_ROLE_LABEL, "colour": NO_ROLE_COLOUR}]


POSITIONAL_COLUMNS = ("offset", "fraction", "fraction_paper", "second_offset", "second_fraction", "n_valid",
                      "n_queries", "initial_offset", "initial_fraction", "continuation_offset",
                      "continuation_fraction")
RARE_COLUMNS = ("rate_rarest", "rate_two_rarest", "n_sentences", "uniform_rate_rarest", "uniform_rate_two_rarest")
SYNTACTIC_COLUMNS = ("relation", "direction", "name", "accuracy", "n", "baseline_offset", "baseline_accuracy")


def role_records(roles: pd.DataFrame, positional: pd.DataFrame | None = None, syntactic: pd.DataFrame | None = None,
                 rare: pd.DataFrame | None = None, role_type: str = ROLE_TYPE) -> dict[str, dict]:
    """{head key (of `role_type`, the attention roles are found for): its role record}: role,
    role_paper, statistic, the is_* flags, and the rows of the three statistics tables
    (syntactic: one entry per relation and direction)."""
    out = {}
    flags = [c for c in roles.columns if c.startswith("is_")]
    for row in roles.itertuples(index=False):
        record = {"role": row.role, "role_paper": getattr(row, "role_paper", row.role),
                  "statistic": row.statistic, "flags": {c: bool(getattr(row, c)) for c in flags},
                  "syntactic_best": {k: getattr(row, f"syntactic_{k}", None)
                                     for k in ("relation", "direction", "name", "accuracy", "baseline", "margin")},
                  "text": getattr(row, "text", None), "syntactic_text": getattr(row, "syntactic_text", None),
                  "parser": getattr(row, "parser", None)}
        out[head_key(role_type, row.layer, row.head)] = record
    for name, table, columns in (("positional", positional, POSITIONAL_COLUMNS), ("rare", rare, RARE_COLUMNS)):
        if table is None:
            continue
        for row in table.to_dict(orient="records"):
            key = head_key(role_type, row["layer"], row["head"])
            out.setdefault(key, {})[name] = {c: row[c] for c in columns if c in row}
    if syntactic is not None:
        for (layer, head), group in syntactic.groupby(["layer", "head"], sort=True):
            out.setdefault(head_key(role_type, layer, head), {})["syntactic"] = [
                {c: r[c] for c in SYNTACTIC_COLUMNS if c in r} for r in group.to_dict(orient="records")]
    return out


def role_thresholds(settings: dict) -> dict:
    """The roles' rules (the `roles` settings head_roles used) that the card draws as lines."""
    keys = ("positional_threshold", "positional_share", "syntactic_margin", "rare_threshold", "rare_margin",
            "min_instances", "top_k")
    return {k: settings[k] for k in keys if k in settings}


# --------------------------------------------------------------------------------------------
# Pruning


RUN_COLUMNS = ("bleu", "chrf", "d_baseline", "d_baseline_low", "d_baseline_high", "d_control", "d_control_low",
               "d_control_high", "retained_total", "steps", "bleu_scratch", "d_pruned_scratch",
               "d_pruned_scratch_low", "d_pruned_scratch_high",
               # a language model's (pipeline.lm_quality.lm_pruning_report): perplexity, no BLEU
               "perplexity", "nll", "delta_nll", "delta_nll_low", "delta_nll_high", "perplexity_ratio",
               # a sentence encoder's: the embedding distance to the unpruned model, no perplexity
               "distance", "delta_distance", "delta_distance_low", "delta_distance_high")
# What the page shows a run's quality as: BLEU for a translation model, perplexity for a language
# model (its pruning table has a perplexity column and no BLEU), the embedding distance for a
# sentence encoder (a distance column); "column" is the runs' field, "format" d3's.
METRICS = {"bleu": {"metric": "BLEU", "column": "bleu", "delta": "BLEU", "format": ".2f"},
           "perplexity": {"metric": "perplexity (lower is better)", "column": "perplexity",
                          "delta": "NLL nats/token", "format": ".2f"},
           "distance": {"metric": "embedding distance to the unpruned model (lower is better)", "column": "distance",
                        "delta": "distance", "format": ".4g"}}


def _trajectory(path: str | Path) -> dict:
    """{"steps": [...], "p_closed": {head key: [P(closed) per step]}} of one run's trajectory.csv,
    at most MAX_TRAJECTORY_STEPS steps."""
    table = read_table(path)
    if table.empty:
        return {"steps": [], "p_closed": {}}
    steps = np.sort(table["step"].unique())
    if len(steps) > MAX_TRAJECTORY_STEPS:
        keep = np.unique(np.linspace(0, len(steps) - 1, MAX_TRAJECTORY_STEPS).round().astype(int))
        steps = steps[keep]
        table = table[table["step"].isin(steps)]
    wide = table.pivot_table(index=["type", "layer", "head"], columns="step", values="p_closed")
    wide = wide.reindex(columns=steps)
    return {"steps": steps.tolist(),
            "p_closed": {head_key(*index): values for index, values in zip(wide.index, wide.to_numpy())}}


def pruning_records(pruning: pd.DataFrame | None, runs: Sequence[tuple[str | Path, str | Path | None]] = ()) -> dict:
    """The pruning runs by setting, each setting's runs in lambda order, and the baseline's BLEU.

    `pruning`: the pruning table (prune/pruning.tsv, its `baseline` row the unpruned model; a
    language model's, lm_pruning_report's, has perplexity and no baseline row: `metric` says
    perplexity, each run's `perplexity` and its NLL difference to the baseline `delta_nll`);
    `runs`: (gates.json, trajectory.csv or None) of each run, matched to the table's rows by
    setting and lambda. A run's `closed`: the heads whose evaluation gate is 0 (gates.json
    `pruned`, the rule of the pruned model)."""
    settings: dict[str, list[dict]] = {}
    rows = {} if pruning is None else {(r["setting"], float(r["lam"])): r for r in pruning.to_dict(orient="records")
                                       if r["setting"] != BASELINE}
    for gates_path, trajectory_path in runs:
        record = json.loads(Path(gates_path).read_text(encoding="utf-8"))
        setting, lam = record["setting"], float(record["lambda"])
        heads = pd.DataFrame(record["heads"])
        row = next((r for (s, lam_), r in rows.items() if s == setting and math.isclose(lam_, lam, rel_tol=1e-9,
                                                                                       abs_tol=1e-12)), {})
        run = {"lam": lam, "control": bool(record.get("control", lam == 0)),
               "retained": record.get("retained", {}),
               "gated": sorted({t for t, g in zip(heads["type"], heads["gated"]) if g}),
               "closed": [head_key(r.type, r.layer, r.head) for r in heads.itertuples() if r.pruned],
               **{c: row.get(c) for c in RUN_COLUMNS if c in row}}
        if trajectory_path is not None and Path(trajectory_path).is_file():
            run["trajectory"] = _trajectory(trajectory_path)
        settings.setdefault(setting, []).append(run)
    for runs_of in settings.values():
        runs_of.sort(key=lambda r: r["lam"])
    metric = next((m for m in ("perplexity", "distance") if pruning is not None and m in pruning.columns
                   and "bleu" not in pruning.columns), "bleu")
    baseline = None if pruning is None or metric != "bleu" else pruning[pruning["setting"] == BASELINE]
    return {"baseline_bleu": float(baseline["bleu"].iloc[0]) if baseline is not None and len(baseline) else None,
            **METRICS[metric], "settings": settings}


def planted_records(planted: pd.DataFrame | None) -> list[dict]:
    """The positive control's planted functions and the heads found for them (planted_vs_found)."""
    if planted is None:
        return []
    out = []
    for row in planted.to_dict(orient="records"):
        found = pd.notna(row.get("layer")) and pd.notna(row.get("head"))
        out.append({**{k: row.get(k) for k in ("function", "kind", "via", "rate", "baseline")},
                    "head": head_key(ROLE_TYPE, row["layer"], row["head"]) if found else None,
                    "closes_at": {c[len("closes_at_"):]: row[c] for c in row if c.startswith("closes_at_")}})
    return out


# --------------------------------------------------------------------------------------------
# Everything from the tables


def gather_tables(scores: pd.DataFrame, roles: pd.DataFrame | None = None, positional: pd.DataFrame | None = None,
                  syntactic: pd.DataFrame | None = None, rare: pd.DataFrame | None = None,
                  role_settings: dict | None = None, pruning: pd.DataFrame | None = None,
                  runs: Sequence[tuple[str | Path, str | Path | None]] = (), planted: pd.DataFrame | None = None,
                  experiment: str = "", description: str = "") -> dict:
    """The atlas's data from the experiment's tables (DataFrames as the stages wrote them)."""
    missing = set(KEYS) - set(scores.columns)
    if missing:
        raise ValueError(f"the head score table lacks the columns {sorted(missing)}")
    scores = scores.sort_values(["type", "layer", "head"], kind="stable", ignore_index=True)
    per_head = score_records(scores)
    model_kind = kind_with_types(scores["type"].unique()).name
    role_type = ROLE_ATTENTION[model_kind]
    role_of = role_records(roles, positional, syntactic, rare, role_type) if roles is not None else {}
    heads = []
    for kind, (n_layers, n_heads) in layout(scores).items():
        for layer in range(n_layers):
            for head in range(n_heads):
                key = head_key(kind, layer, head)
                if key in per_head:
                    heads.append({"key": key, "type": kind, "layer": layer, "head": head, **per_head[key],
                                  **role_of.get(key, {})})
    return {"experiment": experiment, "description": description, "layout": layout(scores),
            "measures": measure_columns(scores), "roles": role_legend(model_kind), "role_type": role_type,
            "thresholds": role_thresholds(role_settings or {}), "heads": heads,
            "pruning": pruning_records(pruning, runs), "planted": planted_records(planted)}
