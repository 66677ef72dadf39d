"""The shape every head score takes: a table with one row per (type, layer, head), KEYS, so that
scores merge on them. Torch- and pandas-free at load (the workflow's rule files read the measures'
registry, which imports this)."""

from __future__ import annotations

KEYS = ["type", "layer", "head"]  # every score table's row key


def head_rows(scores: dict, column: str):
    """type -> (L, H) scores (a tensor or array) -> a DataFrame with one row per (type, layer, head)."""
    import pandas as pd

    return pd.DataFrame(
        [{"type": kind, "layer": layer, "head": head, column: float(s[layer, head])}
         for kind, s in scores.items() for layer in range(s.shape[0]) for head in range(s.shape[1])],
        columns=[*KEYS, column],
    )
