"""Rank correlations of head scores with the causal reference (SPEC section 3): Spearman's rho per
layer and per attention type, with a bootstrap interval over heads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from headcount.analysis.measures import ranked_scores, reference_score


def spearman(x, y) -> float:
    """Spearman's rho: Pearson correlation of average ranks (ties share their mean rank).

    NaN pairs are dropped; NaN if fewer than two pairs remain or either side is constant.
    """
    frame = pd.DataFrame({"x": np.asarray(x, dtype=float), "y": np.asarray(y, dtype=float)}).dropna()
    if len(frame) < 2:
        return float("nan")
    rx, ry = frame["x"].rank(method="average"), frame["y"].rank(method="average")
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = float(np.sqrt((rx**2).sum() * (ry**2).sum()))
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def spearman_interval(x, y, n_samples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of Spearman's rho, resampling the (x, y) pairs (heads)
    with replacement; resamples where a side is constant (rho undefined) are left out."""
    frame = pd.DataFrame({"x": np.asarray(x, dtype=float), "y": np.asarray(y, dtype=float)}).dropna()
    if len(frame) < 3:
        return float("nan"), float("nan")
    index = np.random.default_rng(seed).integers(0, len(frame), size=(n_samples, len(frame)))
    ranks = [pd.DataFrame(frame[c].to_numpy()[index]).rank(axis=1, method="average").to_numpy() for c in "xy"]
    rx, ry = (r - r.mean(axis=1, keepdims=True) for r in ranks)
    denom = np.sqrt((rx**2).sum(axis=1) * (ry**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(denom > 0, (rx * ry).sum(axis=1) / denom, np.nan)
    if np.isnan(rho).all():
        return float("nan"), float("nan")
    low, high = np.nanpercentile(rho, [2.5, 97.5])
    return float(low), float(high)


def rank_correlations(table: pd.DataFrame, reference: str | None = None, scores: Sequence[str] | None = None,
                      n_samples: int = 1000, seed: int = 0, min_resolved: int | None = None) -> pd.DataFrame:
    """Spearman between each score and the reference, per (type, layer) and per type overall.

    By default the reference is the reference measure's score (ablation's delta_loss) and the
    scores are every ranked measure's, in name order (`ranked_scores`).

    Rows: type, layer ("all" for the pooled heads of a type), score, spearman, spearman_low and
    spearman_high (95% bootstrap interval over heads, spearman_interval), n (heads used), and where
    the reference has per-head intervals (`<reference>_low`, `<reference>_high`: ablation's paired
    bootstrap), `resolved`: the heads whose interval excludes 0. With `min_resolved`,
    `reference_meaningful` says whether the group has that many: a reference whose heads sit within
    their noise ranks noise, and its correlations are published without a reading.
    """
    reference = reference_score() if reference is None else reference
    scores = ranked_scores() if scores is None else scores
    rows = []
    for score in (s for s in scores if s in table.columns):
        for kind, by_type in table.groupby("type", sort=False):
            groups = [(layer, g) for layer, g in by_type.groupby("layer")] + [("all", by_type)]
            for layer, g in groups:
                pair = g[[score, reference]].dropna()
                low, high = spearman_interval(pair[score], pair[reference], n_samples, seed)
                row = {"type": kind, "layer": layer, "score": score,
                       "spearman": spearman(pair[score], pair[reference]), "spearman_low": low,
                       "spearman_high": high, "n": len(pair)}
                bounds = [f"{reference}_low", f"{reference}_high"]
                if all(b in g.columns for b in bounds):
                    interval = g.loc[pair.index, bounds]
                    row["resolved"] = int(((interval[bounds[0]] > 0) | (interval[bounds[1]] < 0)).sum())
                    if min_resolved is not None:
                        row["reference_meaningful"] = row["resolved"] >= min_resolved
                rows.append(row)
    columns = ["type", "layer", "score", "spearman", "spearman_low", "spearman_high", "n"]
    return pd.DataFrame(rows, columns=columns + [c for c in ("resolved", "reference_meaningful")
                                                 if any(c in r for r in rows)])
