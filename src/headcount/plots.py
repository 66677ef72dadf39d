"""Figures: matplotlib, Agg backend (no display), PNG."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .io import atomic_path  # noqa: E402

TYPE_NAMES = {"enc_self": "encoder self-attention", "dec_self": "decoder self-attention",
              "dec_enc": "decoder-encoder attention"}


def sorted_head_matrix(table: pd.DataFrame, column: str, order_by: str) -> tuple[np.ndarray, np.ndarray]:
    """(layers, heads) values of `column`, each layer's heads ordered by `order_by`, descending.

    Returns the values and the head indices in display order (the paper's Figure 1 layout).
    """
    layers = sorted(table["layer"].unique())
    values, order = [], []
    for layer in layers:
        rows = table[table["layer"] == layer].sort_values(order_by, ascending=False, kind="stable")
        values.append(rows[column].to_numpy(dtype=float))
        order.append(rows["head"].to_numpy())
    return np.array(values), np.array(order)


def head_heatmap(table: pd.DataFrame, column: str, kind: str, path, order_by: str = "lrp",
                 title: str | None = None, fmt: str = "{:.2f}") -> None:
    """Heatmap of one score over one attention type's heads: rows layers (1 at the top),
    columns heads sorted within each layer by `order_by`; each cell shows the value and the
    head's index."""
    part = table[table["type"] == kind]
    values, order = sorted_head_matrix(part, column, order_by if order_by in part else column)
    L, H = values.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * H, 0.9 + 0.55 * L))
    finite = values[np.isfinite(values)]
    vmax = float(np.abs(finite).max()) if finite.size else 1.0
    negative = finite.size and finite.min() < 0
    image = ax.imshow(values, cmap="RdBu_r" if negative else "Reds", vmin=-vmax if negative else 0, vmax=vmax or 1,
                      aspect="auto")
    for i in range(L):
        for j in range(H):
            if np.isfinite(values[i, j]):
                dark = abs(values[i, j]) > 0.6 * vmax
                ax.text(j, i, f"{fmt.format(values[i, j])}\nh{order[i, j] + 1}", ha="center", va="center",
                        fontsize=7, color="white" if dark else "black")
    ax.set_yticks(range(L), [f"layer {i + 1}" for i in range(L)])
    ax.set_xticks(range(H), [f"{j + 1}" for j in range(H)])
    ax.set_xlabel(f"heads, sorted by {order_by} within each layer" if order_by != column else "heads, sorted")
    ax.set_title(title or f"{column}: {TYPE_NAMES.get(kind, kind)}", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    save(fig, path)


def save(fig, path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
