"""The shape every head score takes: a table with one row per (type, layer, head), KEYS, so that
scores merge on them. Torch- and pandas-free at load (the workflow's rule files read the measures'
registry, which imports this)."""

from __future__ import annotations

from headcount.models.seq2seq import SENTENCE_EMBEDDING  # torch-free, as this module is

KEYS = ["type", "layer", "head"]  # every score table's row key

# Why Michel et al.'s first-order score says nothing for an objective: importance.michel_importance
# refuses it, and the score table leaves its columns out (measures registers it with this).
MICHEL_UNDEFINED = {SENTENCE_EMBEDDING: (
    "Michel importance |<ctx, dL/dctx>| is identically 0 for a sentence encoder: its loss, the distance of the "
    "pooled embedding to the unpruned model's, is at its minimum (0) at the unpruned model, so every gradient "
    "vanishes there; the michel column is left out (single-head ablation measures each head)")}


def head_rows(scores: dict, column: str):
    """type -> (L, H) scores (a tensor or array) -> a DataFrame with one row per (type, layer, head)."""
    import pandas as pd

    return pd.DataFrame(
        [{"type": kind, "layer": layer, "head": head, column: float(s[layer, head])}
         for kind, s in scores.items() for layer in range(s.shape[0]) for head in range(s.shape[1])],
        columns=[*KEYS, column],
    )
