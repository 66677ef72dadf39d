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


ROLE_COLOURS = {"positional": "#7b3fa0", "syntactic": "#2e8b57", "rare": "#f28e1c", "none": "#bdbdbd"}


def head_function_map(roles: pd.DataFrame, scores: pd.DataFrame | None, path, title: str) -> None:
    """The paper's Figures 1c/2: encoder heads coloured by function, positional purple,
    syntactic green, rare-token orange, other grey; within each layer ordered by LRP relevance
    (when head scores exist), each cell labelled with the head and its LRP share."""
    table = roles.copy()
    if scores is not None:
        lrp = scores[scores["type"] == "enc_self"][["layer", "head", "lrp"]]
        table = table.merge(lrp, on=["layer", "head"], how="left")
    else:
        table["lrp"] = np.nan
    layers = sorted(table["layer"].unique())
    n_heads = int(table["head"].max()) + 1
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * n_heads, 0.9 + 0.6 * len(layers)))
    for i, layer in enumerate(layers):
        rows = table[table["layer"] == layer].sort_values("lrp", ascending=False, kind="stable", na_position="last")
        for j, row in enumerate(rows.itertuples()):
            ax.add_patch(plt.Rectangle((j - 0.45, i - 0.4), 0.9, 0.8, color=ROLE_COLOURS.get(row.role, "#bdbdbd")))
            label = f"h{row.head + 1}" + ("" if np.isnan(row.lrp) else f"\n{row.lrp:.2f}")
            ax.text(j, i, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.6, n_heads - 0.4)
    ax.set_ylim(len(layers) - 0.5, -0.5)
    ax.set_yticks(range(len(layers)), [f"layer {layer + 1}" for layer in layers])
    ax.set_xticks([])
    ax.set_xlabel("heads, most LRP-relevant first" if scores is not None else "heads")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ROLE_COLOURS.values()]
    ax.legend(handles, ["positional", "syntactic", "rare tokens", "other"], loc="upper center",
              bbox_to_anchor=(0.5, -0.08), ncol=4, fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def relative_positions(parses: pd.DataFrame, relations, path, title: str, radius: int = 8) -> None:
    """The paper's Figure 3: for each relation, how far the dependent stands from its head
    (dependent word index - head word index), as a share of the relation's arcs."""
    fig, axes = plt.subplots(1, len(relations), figsize=(3.2 * len(relations), 2.6), sharey=True)
    offsets = np.arange(-radius, radius + 1)
    for ax, relation in zip(np.atleast_1d(axes), relations):
        arcs = parses[(parses["relation"] == relation) & (parses["head"] > 0)]
        delta = (arcs["word"] - arcs["head"]).clip(-radius, radius).to_numpy()
        shares = np.array([(delta == d).mean() if len(delta) else 0.0 for d in offsets])
        ax.bar(offsets, shares, color="#2e8b57")
        ax.set_title(f"{relation} ({len(delta)} arcs)", fontsize=9)
        ax.set_xlabel("dependent - head (words)")
    np.atleast_1d(axes)[0].set_ylabel("share of arcs")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)
