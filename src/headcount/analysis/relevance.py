"""Head relevance by LRP over a data set (Voita et al. 2019, section 4.2): the paper's score,
each head's share of the top-1 logit's relevance averaged over every generation step.

The rules, traces and backward passes are models.lrp's (every model family re-runs its forward
pass with them); this module batches a set, drives them and averages. For a language model a
step is a next-token prediction (decoder_only: each real position of tgt_in) or a masked position
(encoder_only: src holding `special.mask`); the table holds the model's own attention type only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from headcount.data.batching import make_batches
from headcount.models.lrp import StepRelevance, step_relevance
from headcount.models.seq2seq import Seq2SeqWithHeads
from headcount.progress import Progress


@dataclass
class HeadRelevance:
    """Averages over all generation steps of a set."""

    table: pd.DataFrame  # one row per (type, layer, head): lrp (normalised, averaged), n_steps
    conservation: pd.DataFrame  # one row per cut: mean total, mean |total - 1|, max |total - 1|, within tolerance


# LRP conservation tolerance: the largest mean |total - 1| over steps at any cut (relevance starts at
# 1, so a relative error) at which the `lrp` score is kept. 1 / float32's machine epsilon (2^23, 8.4e6):
# beyond it the relevance crossing a cut is 2^23 times the start, so float32 rounding of its terms
# alone is as large as the whole relevance being explained, and the head shares above that cut
# cannot be told from rounding. The "ding" rule's documented drift stays below it (the published
# default model's lowest cut: 3.7e5; method.md, "LRP rules"); MiniLM's 1e15 does not.
CONSERVATION_TOLERANCE = 2.0 ** 23


def mark_conservation(conservation: pd.DataFrame, tolerance: float | None = None) -> pd.DataFrame:
    """The conservation table with the tolerance (default CONSERVATION_TOLERANCE) and, per cut,
    whether its mean |total - 1| is within it (a non-finite error is not)."""
    tolerance = CONSERVATION_TOLERANCE if tolerance is None else tolerance
    if conservation.empty:  # no steps: no cut to judge
        return conservation.assign(tolerance=[], within_tolerance=[])
    error = conservation["mean_abs_error"].astype(float)
    return conservation.assign(tolerance=tolerance, within_tolerance=error <= tolerance)  # NaN, inf: False


def conservation_failures(conservation: pd.DataFrame) -> list[str]:
    """The cuts of a marked conservation table (mark_conservation) beyond its tolerance, with their errors."""
    if conservation.empty:
        return []
    bad = conservation[~conservation["within_tolerance"].astype(bool)]
    return [f"{row.cut} (mean |error| {row.mean_abs_error:.3g})" for row in bad.itertuples()]


# LRP's own batches. Every step's backward pass runs over the whole batch, padding included, so
# LRP gains from batches of like lengths more than from large ones (benchmarks/RESULTS.md, "LRP's
# own batches"): on the trained default model's 500 analysis sentences the hand-written "ding"
# backward takes 2.94x one forward+backward in sub-batches of 250 padded tokens, 3.42x in 500;
# autograd's (step_relevance) is best at 500 (3.65x; 3.92x at 250), 4.51x in the scorers' 2,000.
LRP_MAX_TOKENS = 250


def sub_batches(model: Seq2SeqWithHeads, src: Tensor, tgt_in: Tensor, max_tokens: int) -> list[tuple[Tensor, Tensor]]:
    """The batch's sentences regrouped by length into batches of at most max_tokens padded tokens
    on their longer side (batching.make_batches, deterministic), each cut to its own longest
    source and target. Every sentence lands in exactly one; a sentence longer than the budget
    alone."""
    src_lens = src.ne(model.special.pad).sum(dim=1).tolist()
    tgt_lens = model.special.decoder_positions(tgt_in).sum(dim=1).tolist()
    out = []
    for rows in sorted(make_batches(src_lens, tgt_lens, max_tokens, seed=0)):
        index = torch.tensor(rows, device=src.device)
        out.append((src[index, : max(src_lens[i] for i in rows)], tgt_in[index, : max(tgt_lens[i] for i in rows)]))
    return out


def head_relevance(
    model: Seq2SeqWithHeads,
    batches: Iterable[tuple[Tensor, ...]],  # (src, tgt_in, ...) with tgt_in = BOS + model's translation
    rule: str = "ding",
    eps: float = 1e-6,
    max_seeds: int = 8,
    log=None,
    max_tokens: int = LRP_MAX_TOKENS,
    recompute: bool | None = None,
) -> HeadRelevance:
    """The paper's LRP head relevance, averaged over every generation step of the batches.

    Each batch is regrouped into sub-batches of at most `max_tokens` padded tokens (sub_batches):
    the result is the same up to float rounding, and sooner. With the "ding" rule, an architecture
    whose LRP forward offers `ding_relevance` (headcount's own) uses that hand-written backward
    pass instead of step_relevance's autograd one: the same numbers, fewer matrix products.
    `recompute`: step_relevance's (default: per-layer recomputation for rows longer than
    recompute.RECOMPUTE_ABOVE positions, i.e. documents)."""
    batches = list(batches)
    hand_written = getattr(model.lrp_forward(), "ding_relevance", None) if rule == "ding" else None
    sums: dict[str, Tensor] = {}
    cut_sum: dict[str, list[float]] = {}
    n_steps = 0
    bar = Progress(len(batches), "LRP", log, unit="batch")
    for batch in batches:
        for src, tgt_in in sub_batches(model, batch[0], batch[1], max_tokens):
            if hand_written:
                result = hand_written(src, tgt_in)
            else:
                result = step_relevance(model, src, tgt_in, rule, eps, max_seeds, recompute=recompute)
            n_steps = _accumulate(result, sums, cut_sum, n_steps, skip=len(model.special.forced))
        bar.update(1)
    rows = [
        {"type": kind, "layer": layer, "head": head, "lrp": float(s[layer, head] / max(n_steps, 1)),
         "n_steps": n_steps}
        for kind, s in sums.items() for layer in range(s.shape[0]) for head in range(s.shape[1])
    ]
    conservation = pd.DataFrame(
        [{"cut": name, "rule": rule, "mean_total": a[0] / max(n_steps, 1), "mean_abs_error": a[1] / max(n_steps, 1),
          "max_abs_error": a[2]} for name, a in cut_sum.items()]
    )
    if log is not None:
        for row in conservation.itertuples():
            log(f"LRP ({rule}) conservation at {row.cut}: mean total {row.mean_total:.4f}, "
                f"mean |error| {row.mean_abs_error:.4f}, max |error| {row.max_abs_error:.4f}")
    return HeadRelevance(pd.DataFrame(rows), mark_conservation(conservation))


def _accumulate(result: StepRelevance, sums: dict, cut_sum: dict, n_steps: int, skip: int = 0) -> int:
    """Adds a batch's normalised head relevance and cut totals to the running sums; -> steps so far.
    The first `skip` steps predict the forced prefix (a language tag search forces): not counted."""
    valid = result.valid.clone()
    valid[:skip] = False
    mask = valid.to(torch.float64)[..., None, None]  # (T, B, 1, 1)
    for kind, r in result.normalised().items():
        sums[kind] = sums.get(kind, 0) + (r.double() * mask).sum(dim=(0, 1))  # (L, H)
    for name, total in result.cuts.items():
        err = (total.double() - 1.0).abs()[valid]
        acc = cut_sum.setdefault(name, [0.0, 0.0, 0.0])
        acc[0] += float(total.double()[valid].sum())
        acc[1] += float(err.sum())
        acc[2] = max(acc[2], float(err.max()) if err.numel() else 0.0)
    return n_steps + int(valid.sum())
