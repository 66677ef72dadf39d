"""Figures: matplotlib, Agg backend (no display), PNG."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from headcount.analysis.measures import order_score  # noqa: E402
from headcount.io import atomic_path  # noqa: E402
from headcount.pruning.methods import METHODS, SETTINGS, ranked_methods  # noqa: E402
from headcount.report.claims import NO_LOSS_MARGIN, RUN_DIFFERENCES  # noqa: E402

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


def head_heatmap(table: pd.DataFrame, column: str, kind: str, path, order_by: str | None = None,
                 title: str | None = None, fmt: str = "{:.2f}") -> None:
    """Heatmap of one score over one attention type's heads: rows layers (1 at the top),
    columns heads sorted within each layer by `order_by` (default: measures.order_score(), LRP);
    each cell shows the value and the head's index."""
    order_by = order_by or order_score()
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


def head_function_map(roles: pd.DataFrame, scores: pd.DataFrame | None, path, title: str,
                      kind: str = "encoder_decoder") -> None:
    """The paper's Figures 1c/2: the heads that get roles (encoder heads; a decoder-only model's
    self-attention heads: roles.registry.ROLE_ATTENTION of the model's `kind`) coloured by function
    (roles.ROLES' colours: positional purple, syntactic green, rare-token orange, other grey; the
    legend lists the roles of that kind); within each layer ordered by LRP relevance (when head
    scores exist), each cell labelled with the head and its LRP share."""
    from headcount.analysis.roles.registry import ROLE_ATTENTION, role_colour, role_label, role_names
    order = order_score()
    table = roles.copy()
    if scores is not None and order not in scores:  # a model without LRP (hf_lm's until it exists)
        scores = None
    if scores is not None:
        table = table.merge(scores[scores["type"] == ROLE_ATTENTION[kind]][["layer", "head", order]],
                            on=["layer", "head"], how="left")
    else:
        table[order] = np.nan
    layers = sorted(table["layer"].unique())
    n_heads = int(table["head"].max()) + 1
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * n_heads, 0.9 + 0.6 * len(layers)))
    for i, layer in enumerate(layers):
        rows = table[table["layer"] == layer].sort_values(order, ascending=False, kind="stable", na_position="last")
        for j, (row, value) in enumerate(zip(rows.itertuples(), rows[order])):
            ax.add_patch(plt.Rectangle((j - 0.45, i - 0.4), 0.9, 0.8, color=role_colour(row.role)))
            label = f"h{row.head + 1}" + ("" if np.isnan(value) else f"\n{value:.2f}")
            ax.text(j, i, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.6, n_heads - 0.4)
    ax.set_ylim(len(layers) - 0.5, -0.5)
    ax.set_yticks(range(len(layers)), [f"layer {layer + 1}" for layer in layers])
    ax.set_xticks([])
    ax.set_xlabel("heads, most LRP-relevant first" if scores is not None else "heads")
    names = role_names(kind)
    handles = [plt.Rectangle((0, 0), 1, 1, color=role_colour(r)) for r in names]
    ax.legend(handles, [role_label(r) for r in names], loc="upper center",
              bbox_to_anchor=(0.5, -0.08), ncol=len(names), fontsize=8, frameon=False)
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


# --------------------------------------------------------------------------------------------
# Pruning (Voita et al. 2019, section 6)

TYPE_COLOURS = {"enc_self": "#1f77b4", "dec_self": "#d62728", "dec_enc": "#2ca02c"}
# Figure 7's ranked curves, by the method's place in the registry (pruning.methods).
CURVE_STYLES = (("s--", "#888888"), ("v-.", "#9467bd"), ("x:", "#8c564b"), ("P--", "#e377c2"))


def bleu_vs_heads(pruning: pd.DataFrame, curves: pd.DataFrame, baseline_bleu: float, path, title: str) -> None:
    """The paper's Figure 7 and its extension: BLEU against retained heads for the L0 runs (and
    their from-scratch twins) and for each ranked method's curve (`curves`: the curves' rows with
    a `method` column; Michel et al.'s ranking); one panel per setting, the encoder-only setting
    against retained encoder heads, the all-types setting against all heads.

    Error bars (where the table has them): the 95% paired bootstrap interval of the point's
    difference from the baseline, drawn around the point. The lambda = 0 control (the same
    fine-tuning, gates that cannot close) is a dashed line and a marker of its own."""
    settings = [s for s in SETTINGS if s in set(pruning["setting"]) | set(curves.get("setting", []))]
    fig, axes = plt.subplots(1, max(1, len(settings)), figsize=(5.2 * max(1, len(settings)), 3.8), squeeze=False)
    control_flags = pruning["control"] if "control" in pruning else pd.Series(False, index=pruning.index)
    for ax, setting in zip(axes[0], settings):
        x = "retained_enc_self" if setting == "enc" else "retained_total"
        in_setting = pruning["setting"] == setting
        runs = pruning[in_setting & ~control_flags.astype(bool)].sort_values(x)
        controls = pruning[in_setting & control_flags.astype(bool)]
        for i, method in enumerate(ranked_methods()):
            curve = curves[(curves["setting"] == setting) & (curves["method"] == method)] if len(curves) else ()
            if len(curve):
                curve = curve.sort_values(x)
                fmt, colour = CURVE_STYLES[i % len(CURVE_STYLES)]
                ax.plot(curve[x], curve["bleu"], fmt, color=colour, label=f"{METHODS[method].legend}, no retraining")
        ax.errorbar(runs[x], runs["bleu"], yerr=_difference_bars(runs, "d_baseline"), fmt="o-",
                    color="#1f77b4", capsize=2, label="Hard Concrete (L0), pruned")
        for n, row in enumerate(runs.itertuples()):  # above and below in turn: neighbours can sit close
            ax.annotate(f"λ={row.lam:g}", (getattr(row, x), row.bleu), textcoords="offset points",
                        xytext=(3, 4) if n % 2 == 0 else (3, -10), fontsize=7)
        if "bleu_scratch" in runs and runs["bleu_scratch"].notna().any():
            done = runs[runs["bleu_scratch"].notna()]
            ax.errorbar(done[x], done["bleu_scratch"], yerr=_difference_bars(done, "d_scratch_baseline"), fmt="^:",
                        color="#ff7f0e", capsize=2, label="same heads, trained from scratch")
        for row in controls.itertuples():
            ax.axhline(row.bleu, color="#2ca02c", lw=0.9, ls="--", label=f"λ=0 control ({row.bleu:.2f})")
            ax.errorbar([getattr(row, x)], [row.bleu], yerr=_difference_bars(controls.loc[[row.Index]], "d_baseline"),
                        fmt="D", color="#2ca02c", capsize=2)
        ax.axhline(baseline_bleu, color="black", lw=0.8, label=f"baseline ({baseline_bleu:.2f})")
        ax.set_xlabel("retained encoder heads" if setting == "enc" else "retained heads, all types")
        ax.set_ylabel("BLEU")
        ax.set_title("encoder self-attention pruned" if setting == "enc" else "all attention types pruned", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(title + ("\nbars: 95% paired bootstrap interval of the difference from the baseline"
                          if "d_baseline_low" in pruning else ""), fontsize=10)
    fig.tight_layout()
    save(fig, path)


def _difference_bars(rows: pd.DataFrame, difference: str):
    """Error bars (2, n) placing a difference's interval around the plotted value, or None."""
    if f"{difference}_low" not in rows or rows[f"{difference}_low"].isna().all():
        return None
    below = (rows[difference] - rows[f"{difference}_low"]).clip(lower=0).fillna(0)
    above = (rows[f"{difference}_high"] - rows[difference]).clip(lower=0).fillna(0)
    return np.vstack([below.to_numpy(dtype=float), above.to_numpy(dtype=float)])


SEED_MARKERS = "osD^vP*X"


def runs_over_seeds_figure(runs: pd.DataFrame, path, title: str) -> None:
    """The runs behind the verdicts over seeds (claims.runs_over_seeds), drawn: for each setting each
    seed's pruned - control against the heads it kept, then, where twins were trained, pruned - from
    scratch; bars are the seed's 95% paired-bootstrap interval. The dashed line of a pruned - control
    panel is minus the paper's largest cost (claims.NO_LOSS_MARGIN), the loss a "no loss" verdict
    has to exclude. With no shared lambda besides the controls the figure says so."""
    panels = [(setting, diff) for setting in dict.fromkeys(runs["setting"]) for diff in RUN_DIFFERENCES
              if runs.loc[runs["setting"] == setting, f"{diff}_low"].notna().any()]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.6 * max(1, len(panels)), 3.6), squeeze=False)
    if not panels:
        axes[0][0].axis("off")
        axes[0][0].text(0.5, 0.5, "No lambda besides the lambda = 0 controls\nran on every seed (seed_lambdas)",
                        ha="center", va="center")
    seeds = sorted(runs["seed"].unique())
    colours = plt.get_cmap("tab10")
    for ax, (setting, diff) in zip(axes[0], panels):
        for i, seed in enumerate(seeds):
            rows = runs[(runs["setting"] == setting) & (runs["seed"] == seed) & runs[f"{diff}_low"].notna()]
            if rows.empty:  # no twin of this seed's: no legend entry either
                continue
            rows = rows.sort_values("kept")
            ax.errorbar(rows["kept"], rows[diff], yerr=_difference_bars(rows, diff), fmt=SEED_MARKERS[i % 8] + "-",
                        color=colours(i % 10), lw=0.8, capsize=2, label=f"seed {seed}")
        ax.axhline(0, color="black", lw=0.8)
        if diff == "d_control":
            margin = NO_LOSS_MARGIN[setting]
            ax.axhline(-margin, color="#888888", lw=0.8, ls="--", label=f"-{margin:.2f}: the paper's largest cost")
        what = "pruned - control" if diff == "d_control" else "pruned - from scratch"
        heads = "encoder heads" if setting == "enc" else "heads, all types"
        ax.set_xlabel(f"retained {heads}")
        ax.set_ylabel(f"{what} (BLEU)")
        ax.set_title(f"{'encoder self-attention' if setting == 'enc' else 'all attention types'} pruned: {what}",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title + "\nbars: each seed's 95% paired bootstrap interval; lambdas every seed ran", fontsize=10)
    fig.tight_layout()
    save(fig, path)


def retained_functions(pruning: pd.DataFrame, path, title: str) -> None:
    """The paper's Figure 8: how many retained encoder heads have each function, per pruned model."""
    from headcount.analysis.roles.registry import role_colour, role_label, role_names
    runs = pruning.sort_values("retained_enc_self", ascending=False)
    fig, ax = plt.subplots(figsize=(1.5 + 0.9 * max(1, len(runs)), 3.6))
    labels = [f"{r.setting}\nλ={r.lam:g}" if r.setting != "baseline" else "baseline" for r in runs.itertuples()]
    bottom = np.zeros(len(runs))
    for role in role_names():
        counts = runs[f"role_{role}"].to_numpy(dtype=float)
        ax.bar(range(len(runs)), counts, bottom=bottom, color=role_colour(role), label=role_label(role))
        bottom += counts
    ax.set_xticks(range(len(runs)), labels, fontsize=7)
    ax.set_ylabel("retained encoder heads")
    ax.legend(fontsize=7, ncol=len(role_names()), loc="upper right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def retained_by_type(pruning: pd.DataFrame, path, title: str) -> None:
    """The paper's Figure 9: retained heads of each attention type against all retained heads."""
    runs = pruning[pruning["setting"].isin(["all", "baseline"])].sort_values("retained_total")
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for kind, colour in TYPE_COLOURS.items():
        ax.plot(runs["retained_total"], runs[f"retained_{kind}"], "o-", color=colour, label=TYPE_NAMES[kind])
    ax.set_xlabel("retained heads, all types")
    ax.set_ylabel("retained heads of the type")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def decoder_heads_per_layer(heads: pd.DataFrame, path, title: str) -> None:
    """The paper's Figure 10: retained decoder heads per layer, decoder self-attention and
    decoder-encoder attention, one line per pruned model of the all-types setting."""
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.4), sharey=True)
    for ax, kind in zip(axes, ("dec_self", "dec_enc")):
        part = heads[heads["type"] == kind]
        for lam, rows in part.groupby("lam"):
            kept = rows.groupby("layer")["retained"].sum()
            ax.plot(kept.index + 1, kept.to_numpy(), "o-", label=f"λ={lam:g} ({int(kept.sum())} heads)")
        ax.set_xlabel("decoder layer")
        ax.set_title(TYPE_NAMES[kind], fontsize=10)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("retained heads")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def gate_trajectory_figures(trajectory_csv, png_path, gif_path, title: str) -> None:
    """P(gate closed) of every gated head over training: a heatmap (heads by steps) and an
    animated GIF of the (layer, head) grids, one frame per logged step."""
    from PIL import Image  # matplotlib's own dependency

    data = pd.read_csv(trajectory_csv)
    kinds = [k for k in TYPE_NAMES if k in set(data["type"])]
    wide = data.pivot_table(index=["type", "layer", "head"], columns="step", values="p_closed")
    wide = wide.reindex(sorted(wide.index, key=lambda key: (kinds.index(key[0]), key[1], key[2])))
    steps = list(wide.columns)
    fig, ax = plt.subplots(figsize=(7.0, 1.5 + 0.04 * len(wide)))
    image = ax.imshow(wide.to_numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                      extent=(steps[0], steps[-1], len(wide), 0) if len(steps) > 1 else None)
    starts = [i for i, key in enumerate(wide.index) if key[1] == 0 and key[2] == 0]
    ax.set_yticks([s + 0.5 for s in starts], [TYPE_NAMES[wide.index[s][0]] for s in starts], fontsize=7)
    for s in starts[1:]:
        ax.axhline(s, color="white", lw=0.8)
    ax.set_xlabel("training step")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, label="P(closed)")
    fig.tight_layout()
    save(fig, png_path)

    n_layers = int(data["layer"].max()) + 1
    n_heads = int(data["head"].max()) + 1
    fig, axes = plt.subplots(1, len(kinds), figsize=(2.6 * len(kinds) + 0.6, 2.8), squeeze=False)
    grids = []
    for ax, kind in zip(axes[0], kinds):
        grid = ax.imshow(np.zeros((n_layers, n_heads)), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(TYPE_NAMES[kind], fontsize=8)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("layer", fontsize=7)
        grids.append((kind, grid))
    caption = fig.suptitle("", fontsize=9)
    fig.set_dpi(70)
    frames = []
    for step in steps:
        for kind, grid in grids:
            values = np.zeros((n_layers, n_heads))
            for (k, layer, head), value in wide[step].items():
                if k == kind:
                    values[layer, head] = value
            grid.set_data(values)
        caption.set_text(f"P(gate closed) at step {step}")
        fig.canvas.draw()
        frames.append(Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).convert("RGB"))
    plt.close(fig)
    with atomic_path(gif_path) as tmp:
        frames[0].save(tmp, format="GIF", save_all=True, append_images=frames[1:], duration=250, loop=0)


def specialisation_figure(table: pd.DataFrame, path, title: str, kind: str = "enc_self") -> None:
    """Head specialisation against training steps (one row of `table` per snapshot, as
    specialisation.snapshot_statistics makes it): largest positional share, mean confidence and
    LRP concentration of `kind`'s heads, one line per layer, and dev BLEU."""
    from headcount.analysis.specialisation import layer_columns

    table = table.sort_values("step")
    steps = table["step"].to_numpy()
    fig, axes = plt.subplots(2, 2, figsize=(9.5, 6.5), sharex=True)
    panels = [("positional_share", "largest positional share"), ("confidence", "mean confidence"),
              ("lrp_concentration", "LRP concentration (top head's share)")]
    for ax, (statistic, label) in zip(axes.flat, panels):
        columns = layer_columns(table, statistic, kind)
        colours = plt.cm.viridis(np.linspace(0, 0.9, max(len(columns), 1)))
        for colour, (layer, column) in zip(colours, columns.items()):
            ax.plot(steps, table[column], "o-", ms=3, lw=1.2, color=colour, label=f"layer {layer}")
        if statistic == "positional_share":
            ax.plot(steps, table["positional_share"], "k--", lw=1, label="largest of all")
        if statistic == "lrp_concentration" and "n_heads" in table:
            even = 1 / table["n_heads"].iloc[0]
            ax.axhline(even, color="grey", lw=0.8, ls=":")
            ax.annotate("every head equal", (steps[0], even), textcoords="offset points", xytext=(2, 3),
                        fontsize=7, color="grey")
        ax.set_ylabel(label)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{label}, {TYPE_NAMES.get(kind, kind)}", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=2)
    bleu = axes[1, 1]
    bleu.plot(steps, table["dev_bleu"], "o-", color="black", ms=3)
    if "dev_bleu_from" in table and table["dev_bleu_from"].eq("greedy").any():
        computed = table[table["dev_bleu_from"] == "greedy"]
        bleu.plot(computed["step"], computed["dev_bleu"], "o", mfc="white", color="black", ms=5,
                  label="not evaluated in training: computed here")
        bleu.legend(fontsize=7)
    bleu.set_ylabel("dev BLEU (greedy)")
    bleu.set_title("dev BLEU", fontsize=9)
    for ax in axes[1]:
        ax.set_xlabel("training step")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)
