"""Ranked pruning (Michel et al. 2019): no training, heads removed in order of a score, and the
0/1 head masks the pruned models are evaluated with.

Which score ranks the heads is the method's (pruning.methods: a ranked method names its score
column).
"""

from __future__ import annotations

import pandas as pd
import torch

from headcount.models.seq2seq import Seq2SeqWithHeads


def heads_layout(model: Seq2SeqWithHeads) -> tuple[dict[str, int], int]:
    """Layers per attention type, and heads per layer (of the full model, before any removal)."""
    masks = model.head_mask()
    return {kind: int(mask.shape[0]) for kind, mask in masks.items()}, int(next(iter(masks.values())).shape[1])


def masks_from_table(table: pd.DataFrame, n_layers: dict[str, int], n_heads: int,
                     column: str = "pruned") -> dict[str, torch.Tensor]:
    """0/1 masks {type: (layers, H)} keeping the heads whose `column` is False."""
    masks = {kind: torch.ones(n_layers[kind], n_heads) for kind in n_layers}
    for row in table[table[column]].itertuples():
        masks[row.type][row.layer, row.head] = 0.0
    return masks


def retained_counts(masks: dict[str, torch.Tensor]) -> dict[str, int]:
    return {kind: int(mask.sum()) for kind, mask in masks.items()}


def ranked_masks(scores: pd.DataFrame, score: str, types: tuple[str, ...], n_layers: dict[str, int], n_heads: int,
                 step: float = 0.1) -> list[tuple[float, dict[str, torch.Tensor]]]:
    """Global pruning by a score (Michel et al. 2019 with their layer-normalised importance): remove
    the heads of `types` with the lowest `score` (a score-table column), ranked together, in steps
    of `step` of their number.

    Returns [(fraction removed, masks)] from 0 up to the last step that leaves a head.
    """
    pool = scores[scores["type"].isin(types)].sort_values([score, "type", "layer", "head"], kind="stable")
    total = len(pool)
    out, k = [], 0
    while True:
        fraction = round(k * step, 6)
        removed = int(round(fraction * total))
        if removed >= total:
            break
        masks = {kind: torch.ones(n_layers[kind], n_heads) for kind in n_layers}
        for row in pool.head(removed).itertuples():
            masks[row.type][row.layer, row.head] = 0.0
        out.append((fraction, masks))
        k += 1
    return out
