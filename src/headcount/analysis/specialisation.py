"""Head specialisation over training: statistics of the baseline's snapshots.

With `training.snapshot_interval` > 0, training keeps the baseline's weights every that many steps
(and at the last step) in `<work_dir>/snapshots/step_<N>.pt`. For each snapshot this module
computes four numbers that say how specialised its heads are, so a plot of them against the
training step shows whether heads were still specialising when training stopped:

- largest positional share: per encoder layer, the largest fraction of query tokens any encoder
  self-attention head points at one relative offset (roles.statistics.PositionalStats: subword level, EOS
  and padding excluded); overall, the largest over the layers.
- mean confidence: per attention type and layer, the mean over its heads of
  importance.head_confidence (a head's mean maximum attention weight).
- LRP concentration: per attention type and layer, the top head's share of the layer's LRP
  relevance, i.e. the largest over its heads of relevance.head_relevance's `lrp` (relevance normalised
  over the heads of a layer and averaged over generation steps, the score score_heads reports).
  1/H when every head gets the same share, 1 when one head gets it all.
- dev BLEU: greedy, as training evaluates it; read from training's metrics.jsonl at the
  snapshot's step, or computed the same way (greedy, the first `training.dev_bleu_sentences` dev
  sentences) for a step training did not evaluate.

What it reads, and why. The analysis set (`analysis.set`, its first `analysis.max_sentences`
sentences), as score_heads does, so the statistics of the last snapshot are those of the
heads analysed elsewhere. Positional share and confidence read the source and the reference
translations (teacher-forced, as score_heads does for confidence). LRP explains each snapshot's
own greedy translations of the same sentences: the paper's relevance is that of a model's own
generation, and the final model's beam translations (which score_heads reads) hold tokens an
early snapshot would not produce; greedy decoding costs a fraction of beam search, and LRP on
these few hundred sentences is the bulk of the cost per snapshot.

CSV columns (one row per snapshot): step, dev_bleu, dev_bleu_from (`metrics` or `greedy`),
positional_share (overall), n_heads, lrp_steps, and per layer `<statistic>_<type>_layer<l>` with
layers counted from 1, as in the figures (positional share for enc_self only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headcount.analysis.importance import dev_batches, head_confidence
from headcount.analysis.relevance import head_relevance
from headcount.analysis.roles.statistics import PositionalStats, source_lengths
from headcount.io import HeadcountError
from headcount.models.checkpoint import load_checkpoint
from headcount.models.loading import model_from_checkpoint
from headcount.models.seq2seq import ATTENTION_TYPES, Seq2SeqWithHeads

STATISTICS = ("positional_share", "confidence", "lrp_concentration")


def layer_column(statistic: str, kind: str, layer: int) -> str:
    """The CSV column of one statistic of one layer (layer 0-based here, 1-based in the name)."""
    return f"{statistic}_{kind}_layer{layer + 1}"


def layer_columns(table: pd.DataFrame, statistic: str, kind: str) -> dict[int, str]:
    """layer (1-based) -> column, for the layers of `kind` the table has."""
    pattern = re.compile(rf"^{re.escape(statistic)}_{re.escape(kind)}_layer(\d+)$")
    found = {int(m.group(1)): c for c in table.columns if (m := pattern.match(c))}
    return dict(sorted(found.items()))


def lrp_top_share(scores: pd.DataFrame, top: int) -> pd.Series:
    """Per (type, layer), the share of the layer's LRP relevance its `top` heads hold together (the
    `lrp` column is each head's share of its layer): top/H when every head gets the same share."""
    return scores.groupby(["type", "layer"])["lrp"].apply(lambda s: float(s.nlargest(top).sum()))


def lrp_concentration(scores: pd.DataFrame) -> pd.Series:
    """LRP concentration per (type, layer): the top head's share of the layer's LRP relevance, the
    largest `lrp` of a layer's heads (a head-score table with type, layer, head, lrp: relevance's
    table or heads/scores.csv). 1/H when every head gets the same share, 1 when one gets it all."""
    return scores.groupby(["type", "layer"])["lrp"].max()


@torch.no_grad()
def encoder_positional_shares(model: Seq2SeqWithHeads, batches: Sequence[Sequence[torch.Tensor]]) -> np.ndarray:
    """Per encoder layer, the largest positional share of any of its self-attention heads: (L,)."""
    model.eval()
    device = next(model.parameters()).device
    stats = PositionalStats()
    for batch in batches:
        src = batch[0].to(device)
        _, _, probs = model.encode(src, need_weights=True)
        stats.update(probs, source_lengths(src, model.special.pad))
    table = stats.table()
    return table.groupby("layer")["fraction"].max().sort_index().to_numpy(float)


def model_statistics(model: Seq2SeqWithHeads, batches: Sequence[Sequence[torch.Tensor]],
                     lrp_batches: Sequence[Sequence[torch.Tensor]], lrp_rule: str = "ding") -> dict[str, float]:
    """One model's specialisation statistics as one flat row (see the module docstring).

    batches: (src, tgt_in, tgt_out) of the analysis set with its reference translations;
    lrp_batches: the same sources with the model's own translations (tgt_in = BOS + translation).
    """
    shares = encoder_positional_shares(model, batches)
    n_heads = int(model.head_mask()["enc_self"].shape[1])
    row: dict[str, float] = {"positional_share": float(shares.max()), "n_heads": n_heads}
    row.update({layer_column("positional_share", "enc_self", layer): float(s) for layer, s in enumerate(shares)})
    confidence = head_confidence(model, batches).groupby(["type", "layer"])["confidence"].mean()
    relevance = head_relevance(model, lrp_batches, rule=lrp_rule)
    concentration = lrp_concentration(relevance.table)
    for statistic, values in (("confidence", confidence), ("lrp_concentration", concentration)):
        for kind in ATTENTION_TYPES:  # the model's order of types, layers in order within each
            row.update({layer_column(statistic, kind, layer): float(v) for layer, v in values[kind].items()})
    row["lrp_steps"] = int(relevance.table["n_steps"].iloc[0]) if len(relevance.table) else 0
    return row


def dev_bleu_by_step(metrics_path: str | Path) -> dict[int, float]:
    """step -> dev BLEU of training's evaluations (metrics.jsonl records with "dev_bleu").

    A step evaluated twice (a run extended after it finished) keeps its last record."""
    out: dict[int, float] = {}
    path = Path(metrics_path)
    if not path.exists():
        return out
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise HeadcountError(f"{path}, line {number}: not a JSON record; the training run that wrote it "
                                 f"was cut off mid-line: delete the line (or rerun train_baseline)") from None
        if "dev_bleu" in record:
            out[int(record["step"])] = float(record["dev_bleu"])
    return out


def snapshot_statistics(
    snapshots: Sequence[dict],  # [{"step": N, "path": str}, ...] as training's summary lists them
    analysis_src: list[list[int]],
    analysis_ref: list[list[int]],
    greedy: Callable[[object, list[list[int]]], list[list[int]]],  # (model, source ids) -> translation ids
    dev_bleu: Callable[[object], float],  # model -> greedy dev BLEU, for steps training did not evaluate
    metrics_path: str | Path,
    lrp_rule: str = "ding",
    max_tokens: int = 2000,
    device: str | torch.device = "cpu",
    log=print,
) -> pd.DataFrame:
    """model_statistics of every snapshot, with its dev BLEU: one row per snapshot, by step."""
    evaluated = dev_bleu_by_step(metrics_path)
    batches = None  # built with the first snapshot's special ids
    rows = []
    for snapshot in sorted(snapshots, key=lambda s: int(s["step"])):
        path, step = Path(snapshot["path"]), int(snapshot["step"])
        if not path.exists():
            raise HeadcountError(f"{path}: snapshot of step {step} listed in the training summary is missing; "
                                 f"rerun train_baseline (delete its training.json) to write the snapshots again")
        state = load_checkpoint(path)
        if int(state.get("step", step)) != step:
            raise HeadcountError(f"{path}: holds step {state['step']}, not step {step} as the training summary "
                                 f"says; delete the snapshots folder and training.json and rerun train_baseline")
        model = model_from_checkpoint(state)
        model.to(device).eval()
        if batches is None:
            batches = [[x.to(device) for x in b]
                       for b in dev_batches(analysis_src, analysis_ref, max_tokens, special=model.special)]
        hyps = greedy(model, analysis_src)
        lrp_batches = [[x.to(device) for x in b]
                       for b in dev_batches(analysis_src, hyps, max_tokens, special=model.special)]
        row = {"step": step, **model_statistics(model, batches, lrp_batches, lrp_rule)}
        if step in evaluated:
            row["dev_bleu"], row["dev_bleu_from"] = evaluated[step], "metrics"
        else:
            row["dev_bleu"], row["dev_bleu_from"] = dev_bleu(model), "greedy"
        log(f"step {step}: largest positional share {row['positional_share']:.3f}, dev BLEU {row['dev_bleu']:.2f} "
            f"({row['dev_bleu_from']}), {row['lrp_steps']} LRP steps")
        rows.append(row)
    table = pd.DataFrame(rows)
    first = ["step", "dev_bleu", "dev_bleu_from", "positional_share", "n_heads", "lrp_steps"]
    return table[[c for c in first if c in table] + [c for c in table.columns if c not in first]]
