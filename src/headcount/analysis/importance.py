"""Head importance scores: confidence, Michel et al. importance, single-head ablation.

SPEC.md section 1.3 (confidence, Voita et al. 2019 section 4.1), section 2 (EOS and padding) and
section 3 (Michel et al. 2019 importance; single-head ablation as the causal reference against
which the other scores are ranked). LRP relevance lives in relevance.py; measures.py registers them
all and joins them into the score table; correlations.py ranks them against the reference.

Every score is a pandas DataFrame with one row per (type, layer, head), so they merge on those
keys. Batches are (src, tgt_in, tgt_out) tensors as `batching.source_tensor/target_tensors` make
them: source = subwords + EOS, decoder input = BOS + subwords, decoder output = subwords + EOS.

Shapes: B batch, S source length, T target length, H heads, L layers, Dh head size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from headcount.analysis.tables import KEYS, MICHEL_UNDEFINED, head_rows
from headcount.data.batching import TextTooLong, check_lengths, make_batches, objective_tensors
from headcount.data.special import SpecialIds
from headcount.io import HeadcountError
from headcount.models.attention_stream import stream_attention
from headcount.models.recompute import recomputed_layers, wants_recompute
from headcount.models.sentence_embedding import SENTENCE_EMBEDDING, cosine_distance, embedding_distance
from headcount.models.seq2seq import MODEL_KINDS, Seq2SeqWithHeads, kind_of
from headcount.models.shared_prefix import copies_from, head_position
from headcount.progress import Progress

Batch = tuple[Tensor, Tensor, Tensor]  # src (B, S), tgt_in (B, T), tgt_out (B, T)


def dev_batches(src_ids: list[list[int]], tgt_ids: list[list[int]], max_tokens: int = 2000, *,
                special: SpecialIds, objective: str = "translation", max_positions: int | None = None) -> list[Batch]:
    """Deterministic padded batches of a set (the order does not change any score here), with the
    model's special ids (`model.special`) and its objective (`kind_of(model).objective`; a language
    model's text on both sides, a masked LM's masks the fixed draw of seed 0). A text longer than
    `max_tokens` gets a batch of its own; with `max_positions` (`model.max_positions`) a text that
    does not fit the model is refused by its index (batching.check_lengths), else every analysis
    refuses the batch row that does not fit (`_on_device`)."""
    if max_positions is not None:
        check_lengths(src_ids, tgt_ids, max_positions, objective)
    return [objective_tensors(objective, [src_ids[i] for i in batch], [tgt_ids[i] for i in batch], special)
            for batch in make_batches([len(s) + 1 for s in src_ids], [len(t) + 1 for t in tgt_ids], max_tokens,
                                      seed=0)]


def _on_device(batch, model: Seq2SeqWithHeads):
    """The batch on the model's device, once checked to fit the model's positions: a row longer
    than them is refused here, naming it and the fix, not deep inside the model (an index error in
    a position table, or a mask of the wrong size)."""
    limit = getattr(model, "max_positions", None)
    for name, x in zip(("source", "decoder input"), batch[:2]):
        if limit is not None and x.dim() == 2 and x.shape[1] > limit:
            real = x.ne(model.special.pad).sum(dim=1)
            row = int(real.argmax())
            raise TextTooLong(
                f"a batch's {name} is {x.shape[1]} positions long (row {row}: {int(real[row])} tokens) but the model "
                f"takes at most {limit}: split long texts into parts that fit, or leave them out; "
                f"dev_batches(..., max_positions=model.max_positions) names the text")
    device = next(model.parameters()).device
    return [x.to(device) for x in batch]


# --------------------------------------------------------------------------------------------
# Confidence (Voita et al. 2019, section 4.1)


def confidence_sums(probs: Tensor, query_keep: Tensor, key_keep: Tensor) -> tuple[Tensor, int]:
    """Sum over kept query tokens of each head's max weight over kept keys, and the query count.

    probs (B, H, Tq, Tk); query_keep (B, Tq) and key_keep (B, Tk) bool. Left-out keys (EOS,
    padding) are dropped from the max without renormalising the remaining weights (SPEC section 2).
    -> (H,) sums, number of query tokens.
    """
    kept = probs.masked_fill(~key_keep[:, None, None, :], 0.0)  # weights are >= 0, so 0 never wins
    row_max = kept.amax(dim=-1)  # (B, H, Tq)
    mask = query_keep[:, None, :].to(row_max.dtype)
    return (row_max * mask).sum(dim=(0, 2)), int(query_keep.sum())


def confidence_masks(src: Tensor, tgt_in: Tensor, special: SpecialIds, exclude_bos_in_dec_self: bool = False,
                     model_kind: str = "encoder_decoder"):
    """(query_keep, key_keep) per attention type of a model kind; `special`: the model's ids.

    Encoder self-attention: the EOS query row and the EOS key column are left out (the paper).
    Decoder-encoder attention: every decoder input position is a query (the decoder input holds
    BOS + subwords, no EOS); the source EOS column is left out, as for the encoder.
    Decoder self-attention: the decoder input holds no EOS, so by default nothing but padding is
    left out; the first query (BOS) can only see itself and so always has weight 1. With
    `exclude_bos_in_dec_self` the BOS key column (the decoder's counterpart of the EOS "no-op"
    sink) is left out instead, and with it the first query row, which would see no key.
    A masked LM's input also starts with BOS ([CLS]), a no-op sink as its EOS ([SEP]) is (Clark
    et al. 2019): both are left out. A language model's decoder self-attention is the decoder's.
    """
    src_real = src.ne(special.pad)
    src_keep = src_real & src.ne(special.eos)
    if model_kind == "encoder_only":
        src_keep &= src.ne(special.bos)
    tgt_real = special.decoder_positions(tgt_in)
    dec_query, dec_key = tgt_real, tgt_real
    if exclude_bos_in_dec_self:
        dec_key = tgt_real & tgt_in.ne(special.bos)
        dec_query = tgt_real.clone()
        dec_query[:, 0] = False
    masks = {"enc_self": (src_keep, src_keep), "dec_self": (dec_query, dec_key), "dec_enc": (tgt_real, src_keep)}
    return {kind: masks[kind] for kind in MODEL_KINDS[model_kind].attention_types}


@torch.no_grad()
def head_confidence(model: Seq2SeqWithHeads, batches: Iterable[Sequence[Tensor]],
                    exclude_bos_in_dec_self: bool = False) -> pd.DataFrame:
    """Mean over query tokens of a head's maximum attention weight, pooled over the whole set.

    Streamed (models.attention_stream): each layer's map is reduced to its (H,) sums as the layer
    computes it, so memory holds one layer's map at a time, not every layer's."""
    model.eval()
    sums: dict[str, list[Tensor | None]] = {}
    counts: dict[str, int] = {}
    for batch in batches:
        src, tgt_in = _on_device(batch[:2], model)
        masks = confidence_masks(src, tgt_in, model.special, exclude_bos_in_dec_self, kind_of(model).layout)

        def reduce(kind: str, layer: int, probs: Tensor, masks=masks) -> None:
            if kind not in masks:
                return
            summed, _ = confidence_sums(probs.double(), *masks[kind])
            layers = sums.setdefault(kind, [None] * len(model.attention_modules()[kind]))
            layers[layer] = summed.cpu() if layers[layer] is None else layers[layer] + summed.cpu()

        stream_attention(model, src, tgt_in, reduce)
        for kind, (query_keep, _) in masks.items():
            counts[kind] = counts.get(kind, 0) + int(query_keep.sum())
    return head_rows({kind: torch.stack(s) / max(counts[kind], 1) for kind, s in sums.items()}, "confidence")


# --------------------------------------------------------------------------------------------
# Michel et al. (2019) importance


def summed_nll(model: Seq2SeqWithHeads, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, int]:
    """Teacher-forced NLL summed over the real target tokens (a sentence's loss, not a mean). A
    sentence encoder's: its sentences' embedding distances to the unpruned model, one unit each."""
    if kind_of(model).objective == SENTENCE_EMBEDDING:
        distance = embedding_distance(model, src)  # (B,)
        return distance.sum(), len(distance)
    logits, _ = model(src, tgt_in)
    real = tgt_out.ne(model.special.pad)
    logits = logits[real].to(torch.promote_types(logits.dtype, torch.float32))  # (N, V)
    return F.cross_entropy(logits, tgt_out[real], reduction="sum"), int(real.sum())


class HeadContexts:
    """Forward hooks that keep every head's context vector (B, H, Tq, Dh), by type and layer."""

    def __init__(self, model: Seq2SeqWithHeads):
        self.modules = model.attention_modules()
        self.tensors: dict[str, list[Tensor | None]] = {k: [None] * len(m) for k, m in self.modules.items()}
        self.handles = []

    def __enter__(self):
        for kind, mods in self.modules.items():
            for layer, m in enumerate(mods):
                self.handles.append(m.head_context.register_forward_hook(self._keeper(kind, layer)))
        return self

    def _keeper(self, kind: str, layer: int):
        def hook(module, inputs, output):
            self.tensors[kind][layer] = output

        return hook

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


class MeasureUndefined(HeadcountError):
    """An importance measure asked of a model whose objective makes it meaningless."""



@torch.enable_grad()
def michel_importance(model: Seq2SeqWithHeads, batches: Iterable[Sequence[Tensor]],
                      recompute: bool | None = None) -> pd.DataFrame:
    """Michel et al. (2019): |<ctx_h, dL/dctx_h>| per token, averaged over tokens, l2-normalised per layer.

    L is the teacher-forced NLL summed over each sentence's tokens, so a token's gradient is that
    of its sentence's loss (as Michel et al.'s per-example loss), whatever the batch. Tokens are the
    real (non-padding) query positions of each attention: source tokens for encoder
    self-attention, decoder input tokens for the decoder's. Columns: michel (normalised) and
    michel_raw (the token average before normalisation).

    Not for a sentence encoder: its loss, the distance to the unpruned model's embedding, is at
    its minimum at the unpruned model, so every gradient, and the score, is 0 there.

    Long inputs: a batch is run with per-layer recomputation (models.recompute: the backward pass
    holds one layer's activations, attention maps included, not every layer's; about one more
    forward pass of time) when `recompute` is True, or by default (None) when its rows are longer
    than recompute.RECOMPUTE_ABOVE positions; the same scores either way.
    """
    if kind_of(model).objective in MICHEL_UNDEFINED:
        raise MeasureUndefined(MICHEL_UNDEFINED[kind_of(model).objective])
    model.eval()
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    for batch in batches:
        src, tgt_in, tgt_out = _on_device(batch[:3], model)
        long_rows = wants_recompute(recompute, src.shape[1], tgt_in.shape[1])
        # The hooks are gone before the backward pass, so a recomputed layer does not fire them again.
        with recomputed_layers(model, long_rows), HeadContexts(model) as hooked:
            loss, _ = summed_nll(model, src, tgt_in, tgt_out)
        kinds = list(hooked.tensors)
        contexts = [c for kind in kinds for c in hooked.tensors[kind]]
        grads = torch.autograd.grad(loss, contexts)
        decoder = model.special.decoder_positions(tgt_in)
        queries = {"enc_self": src.ne(model.special.pad), "dec_self": decoder, "dec_enc": decoder}
        i = 0
        for kind in kinds:
            per_layer = []
            for ctx in hooked.tensors[kind]:
                per_token = (ctx.detach() * grads[i]).sum(dim=-1).abs()  # (B, H, Tq)
                per_layer.append((per_token * queries[kind][:, None, :]).sum(dim=(0, 2)).double().cpu())  # (H,)
                i += 1
            sums[kind] = sums.get(kind, 0) + torch.stack(per_layer)  # (L, H)
            counts[kind] = counts.get(kind, 0) + int(queries[kind].sum())
    raw = {kind: s / max(counts[kind], 1) for kind, s in sums.items()}
    normed = {kind: r / r.norm(dim=1, keepdim=True).clamp_min(1e-30) for kind, r in raw.items()}
    return head_rows(normed, "michel").merge(head_rows(raw, "michel_raw"), on=KEYS)


# --------------------------------------------------------------------------------------------
# Single-head ablation


@torch.no_grad()
def mean_nll(model: Seq2SeqWithHeads, batches: Iterable[Sequence[Tensor]]) -> float:
    """Dev loss: mean per-token NLL (nats) over the real target tokens of the set."""
    model.eval()
    total, tokens = 0.0, 0
    for batch in batches:
        nll, n = summed_nll(model, *_on_device(batch[:3], model))
        total, tokens = total + float(nll), tokens + n
    return total / max(tokens, 1)


# Masked copies of a dev batch per forward pass in head_ablation: the activations of the pass grow
# linearly with it (the logits do not: see LOSS_ROWS).
HEADS_PER_PASS = 16
# Target positions whose logits are formed at once in masked_mean_nlls: (LOSS_ROWS, V) floats, 200 MB
# for a 49k-word vocabulary, whatever the batch and the number of copies.
LOSS_ROWS = 1024


def _replicated(x: Tensor, copies: int) -> Tensor:
    """`copies` copies of a batch tensor stacked along the batch dimension (copy i: rows i*B:(i+1)*B)."""
    return x.repeat(copies, *([1] * (x.dim() - 1)))


def _output_states(model: Seq2SeqWithHeads, src: Tensor, tgt_in: Tensor) -> Tensor:
    """The states (B, T, D) whose `model.logits` are `model(src, tgt_in)`'s logits (the contract:
    the decoder's output; an encoder-only model's, the encoder's). Where the encoder's layers made
    copies of the batch (shared_prefix.copies_from), the decoder runs on as many copies."""
    memory, src_pad, _ = model.encode(src)
    if kind_of(model).name == "encoder_only":
        return memory
    copies = memory.shape[0] // max(src.shape[0], 1)
    if copies > 1:  # memory (k * B, S, D) of encoder copies; the decoder's inputs are (B, ...)
        src_pad, tgt_in = _replicated(src_pad, copies), _replicated(tgt_in, copies)
    return model.decode(tgt_in, memory, src_pad)[0]


def _copies_output_states(model: Seq2SeqWithHeads, src: Tensor, tgt_in: Tensor,
                          heads: Sequence[tuple[str, int, int] | None]) -> Tensor:
    """_output_states of len(heads) copies of the batch (k * B, T, D), copy i's rows i*B:(i+1)*B;
    the caller's row edits change copy i's heads. The copies share the layers below the lowest of
    `heads` (they compute the same there): the batch runs through them once and is copied at that
    layer's input (shared_prefix.copies_from), which saves those layers' work k - 1 times over.
    Where the model's layers cannot be shared so, the inputs are copied, every layer run k times."""
    k, B = len(heads), tgt_in.shape[0]
    positions = [head_position(head) for head in heads if head is not None]
    start = min(positions) if positions else (0, 0)
    with copies_from(model, start, B, k) as shared:
        if not shared:
            src, tgt_in = _replicated(src, k), _replicated(tgt_in, k)
        states = _output_states(model, src, tgt_in)
    if states.shape[0] != k * B:
        raise RuntimeError(f"{k} copies of a batch of {B} gave {states.shape[0]} rows")
    return states


def masked_mean_nlls(model: Seq2SeqWithHeads, batches: Sequence[Sequence[Tensor]],
                     heads: Sequence[tuple[str, int, int]]) -> list[float]:
    """Dev loss (mean_nll) with each of `heads` ((type, layer, head)) masked alone, on top of the
    model's masks (masked_sentence_losses, summed over the sentences)."""
    sums, units = masked_sentence_losses(model, batches, heads)
    return (sums.sum(axis=1) / max(units.sum(), 1)).tolist()


HeadKey = tuple[str, int, int]  # (attention type, layer, head), counted from 0 as in the model's tensors


@dataclass
class HeadEdit:
    """What one copy of a batch does to its heads: each listed head's context (before W^O) becomes
    ctx * factor + value. `factors`: {head: factor}, 0 removes the head (what its 0/1 gate does:
    the workflow's single-head ablation), another number scales it. `values`: {head: what replaces
    its context}, a (Dh,) tensor, the same at every row and position (a mean ablation), or a
    function of the batch's number in the batches -> (B, T, Dh) (another input's contexts: patching);
    a head with a value has factor 0 (`factors` need not say so)."""

    factors: dict[HeadKey, float] = field(default_factory=dict)
    values: dict[HeadKey, Tensor | Callable[[int], Tensor]] = field(default_factory=dict)

    @staticmethod
    def masking(heads: Iterable[HeadKey]) -> HeadEdit:
        """Every one of `heads` removed (factor 0)."""
        return HeadEdit({tuple(head): 0.0 for head in heads})

    def heads(self) -> set[HeadKey]:
        return set(self.factors) | set(self.values)


@dataclass
class EditedScores:
    """What edited_scores finds: per copy and sentence, the metric's sum (k, S) and the units it
    is over (S,) (a sentence's real target tokens for the loss, 1 for a per-sentence metric), and,
    where asked, each copy's per-token values [copy][sentence] (the values at the sentence's real
    target positions, in order)."""

    sums: np.ndarray
    units: np.ndarray
    tokens: list[list[np.ndarray]] | None = None


def masked_sentence_losses(model: Seq2SeqWithHeads, batches: Sequence[Sequence[Tensor]],
                           heads: Sequence[tuple[str, int, int] | None]) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's summed loss with each of `heads` ((type, layer, head); None: no head)
    masked alone, on top of the model's masks -> (k, S) float64 sums and the (S,) units they are
    over (a sentence's real target tokens), sentences in the batches' order: edited_scores with
    one removed head per copy."""
    found = edited_scores(model, batches, [None if head is None else HeadEdit.masking([head]) for head in heads])
    return found.sums, found.units


# A metric the per-head API takes: (logits (B, T, V), targets (B, T), real (B, T) bool: the
# positions scored) -> (B,) one value per sentence, or (B, T) one per position (summed over `real`).
Metric = Callable[[Tensor, Tensor, Tensor], Tensor]


@torch.no_grad()
def edited_scores(model: Seq2SeqWithHeads, batches: Sequence[Sequence[Tensor]], edits: Sequence[HeadEdit | None],
                  metric: Metric | None = None, keep_tokens: bool = False) -> EditedScores:
    """Each sentence's summed loss (or `metric`) with each of `edits` applied (None: the model as
    it is), on top of the model's masks -> EditedScores, sentences in the batches' order. The one
    path under single-head ablation (head_ablation, masked_sentence_losses) and the per-head API
    (analysis.head_access).

    Each batch is copied once per edit and run in one forward pass, copy i with edit i
    (gates.row_head_edits); the copies share the layers below the lowest edited head
    (`_copies_output_states`). The loss forms logits only at the target positions, LOSS_ROWS at a
    time (a masked LM scores ~15% of its positions, and padding none), NLLs summed in float64; a
    `metric` gets each copy's logits (B, T, V) in turn. A sentence encoder's loss is its embedding
    distance to the unpruned model's pass over the batch, every head open in every row, one unit
    per sentence (`_edited_sentence_distances`: its copies share no layers, since its pooling,
    after the layers, reads the batch's own padding mask)."""
    from headcount.models.gates import row_head_edits  # gates imports the model contract, as this does

    if kind_of(model).objective == SENTENCE_EMBEDDING:
        if metric is not None:
            raise ValueError("a sentence encoder is scored by its embedding's distance to the unpruned model's; "
                             "it takes no other metric")
        return _edited_sentence_distances(model, batches, edits)

    model.eval()
    k = len(edits)
    # each copy's lowest edited head: the copies share the layers below the lowest of them
    lowest = [min(e.heads(), key=head_position) if e is not None and e.heads() else None for e in edits]
    sums, units, tokens = [], [], [[] for _ in range(k)]
    for number, batch in enumerate(batches):
        src, tgt_in, tgt_out = _on_device(batch[:3], model)
        B = tgt_out.shape[0]
        masks, values = row_edits(model, edits, number, B, tgt_out.device)
        with row_head_edits(model, masks, values):
            states = _copies_output_states(model, src, tgt_in, lowest)  # (k * B, T, D)
        real = tgt_out.ne(model.special.pad)
        if metric is None:
            totals, per_position, kept = _summed_losses(model, states, tgt_out, k, keep_tokens)
        else:
            totals, per_position, kept = _metric_sums(model, states, tgt_out, real, k, metric, keep_tokens)
        sums.append(totals.view(k, B).numpy())
        units.append(real.sum(dim=1).cpu().numpy() if per_position else np.ones(B))
        if keep_tokens and kept is not None:
            for i in range(k):
                tokens[i].extend(kept[i])
    keep = tokens if keep_tokens and (not sums or len(tokens[0]) == sum(s.shape[1] for s in sums)) else None
    if not sums:
        return EditedScores(np.zeros((k, 0)), np.zeros(0), keep)
    return EditedScores(np.concatenate(sums, axis=1), np.concatenate(units).astype(np.float64), keep)


def _summed_losses(model, states: Tensor, tgt_out: Tensor, k: int, keep_tokens: bool):
    """Each copy's and sentence's summed NLL (k * B,) float64 on the CPU, True (a per-token
    metric), and, with `keep_tokens`, [copy][sentence] per-token NLLs (else None)."""
    B = tgt_out.shape[0]
    targets = _replicated(tgt_out, k)
    real = targets.ne(model.special.pad)
    row = torch.arange(k * B, device=real.device)[:, None].expand_as(real)[real]  # copy i, sentence j: i * B + j
    states, targets = states[real], targets[real]  # (N, D), (N,)
    totals = torch.zeros(k * B, dtype=torch.float64)
    kept = []
    for start in range(0, len(targets), LOSS_ROWS):
        logits = model.logits(states[start:start + LOSS_ROWS])
        nll = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)),
                              targets[start:start + LOSS_ROWS], reduction="none")
        totals += torch.zeros(k * B, dtype=torch.float64, device=nll.device).index_add_(
            0, row[start:start + LOSS_ROWS], nll.double()).cpu()
        if keep_tokens:
            kept.append(nll.double().cpu())
    if not keep_tokens:
        return totals, True, None
    flat = torch.cat(kept).numpy() if kept else np.zeros(0)
    counts = real.sum(dim=1).cpu().numpy()  # rows in order: real positions were taken row by row
    split = np.split(flat, np.cumsum(counts)[:-1])
    return totals, True, [split[i * B:(i + 1) * B] for i in range(k)]


def _metric_sums(model, states: Tensor, tgt_out: Tensor, real: Tensor, k: int, metric: Metric, keep_tokens: bool):
    """A metric's sums per copy and sentence (k * B,) float64 (a per-position metric summed over
    the real positions), whether it is per position, and, for a per-position metric with
    `keep_tokens`, its values [copy][sentence] (else None)."""
    B = tgt_out.shape[0]
    totals, kept, per_position = [], [], None
    for i in range(k):
        value = metric(model.logits(states[i * B:(i + 1) * B]), tgt_out, real)
        value = torch.as_tensor(value)
        if value.shape == (B,):
            per_position = False if per_position is None else per_position
            totals.append(value.double().cpu())
        elif value.shape == tuple(tgt_out.shape):
            per_position = True if per_position is None else per_position
            totals.append((value.double() * real).sum(dim=1).cpu())
            if keep_tokens:
                kept.append([value[j][real[j]].double().cpu().numpy() for j in range(B)])
        else:
            raise ValueError(f"metric: returned shape {tuple(value.shape)}; give ({B},), one value per sentence, "
                             f"or {tuple(tgt_out.shape)}, one per position")
    return torch.cat(totals), bool(per_position), (kept if per_position and keep_tokens else None)


def row_edits(model: Seq2SeqWithHeads, edits: Sequence[HeadEdit | None], number: int, B: int,
                device) -> tuple[dict[str, Tensor], dict[tuple[str, int], Tensor]]:
    """Row factors and values (gates.row_head_edits) for k copies of a batch of B rows, copy i
    with edits[i]; `number`: the batch's number (a patch's values are looked up by it)."""
    modules = model.attention_modules()
    widths = {kind: mask.shape for kind, mask in model.head_mask().items()}
    kinds = {head[0] for e in edits if e is not None for head in e.heads()} or set(widths)
    masks = {kind: torch.ones(len(edits) * B, *widths[kind], device=device) for kind in kinds}
    values: dict[tuple[str, int], Tensor] = {}
    for i, edit in enumerate(edits):
        if edit is None:
            continue
        rows = slice(i * B, (i + 1) * B)
        for (kind, layer, h), factor in edit.factors.items():
            masks[kind][rows, layer, h] = float(factor)
        for (kind, layer, h), value in edit.values.items():
            masks[kind][rows, layer, h] = 0.0
            value = value(number) if callable(value) else value.view(1, 1, -1)  # (B, T, Dh) or (1, 1, Dh)
            slot = values.get((kind, layer))
            if slot is None or (slot.shape[2] == 1 and value.shape[1] > 1):
                module = modules[kind][layer]
                grown = torch.zeros(len(edits) * B, widths[kind][1], value.shape[1], module.head_dim, device=device)
                slot = grown if slot is None else grown + slot
                values[(kind, layer)] = slot
            slot[rows, h] = value.to(device=device, dtype=slot.dtype)
    return masks, values


@torch.no_grad()
def _edited_sentence_distances(model: Seq2SeqWithHeads, batches: Sequence[Sequence[Tensor]],
                               edits: Sequence[HeadEdit | None]) -> EditedScores:
    """edited_scores of a sentence encoder: each sentence's embedding distance with each of
    `edits` applied, copy i of each batch with edit i (gates.row_head_edits), against the
    reference pass over the batch itself (every head open: it runs outside the row edits, and only
    once for all copies); one unit per sentence."""
    from headcount.models.gates import row_head_edits

    model.eval()
    k = len(edits)
    sums = []
    for number, batch in enumerate(batches):
        src = _on_device(batch[:1], model)[0]
        B = src.shape[0]
        reference = model.reference_embedding(src)  # (B, D)
        masks, values = row_edits(model, edits, number, B, src.device)
        with row_head_edits(model, masks, values):
            embedding = model.sentence_embedding(_replicated(src, k))  # (k * B, D)
        distance = cosine_distance(embedding, _replicated(reference, k))  # (k * B,)
        sums.append(distance.view(k, B).double().cpu().numpy())
    if not sums:
        return EditedScores(np.zeros((k, 0)), np.zeros(0))
    sums = np.concatenate(sums, axis=1)
    return EditedScores(sums, np.ones(sums.shape[1]))


def head_ablation(
    model: Seq2SeqWithHeads,
    batches: Sequence[Sequence[Tensor]],
    bleu_fn: Callable[[Seq2SeqWithHeads], float] | None = None,
    bleu_types: Sequence[str] = ("enc_self",),
    types: Sequence[str] | None = None,  # default: every attention type of the model
    log: Callable[[str], None] | None = None,
    heads_per_pass: int = HEADS_PER_PASS,
    heads: Iterable[HeadKey] | None = None,  # default: every head of `types`
) -> pd.DataFrame:
    """Mask each head alone (its 0/1 gate) and record the change of dev loss, and of BLEU if asked.

    delta_loss = loss with the head masked - loss of the model as given (positive: the head
    helps). delta_bleu (only for `bleu_types`, NaN elsewhere) = BLEU masked - BLEU as given. Heads
    already masked are skipped (NaN), and so, where `heads` is given, is every head not in it
    (the table still has a row for every head of `types`). The model's masks are restored afterwards.

    delta_loss_low, delta_loss_high: its 95% paired-bootstrap interval over the dev sentences
    (training.perplexity.paired_bootstrap_nll: each resample draws sentences, masked and unmasked
    losses of the same sentences together), so a head whose removal costs nothing measurable shows
    an interval across 0.

    The losses of `heads_per_pass` heads come from one forward pass per dev batch over as many
    copies of it, each with its own head masked (masked_sentence_losses): the same numbers as
    masking one head at a time (to rounding), at a fraction of the passes' overhead; memory grows
    with it. The heads go into passes in layer order, and a pass's copies share the layers below
    its lowest head (run once, not once per copy). BLEU decodes with one head masked at a time.
    """
    from headcount.training.perplexity import paired_bootstrap_nll

    if heads_per_pass < 1:
        raise ValueError(f"heads_per_pass must be >= 1, not {heads_per_pass}")
    batches = list(batches)
    types = kind_of(model).attention_types if types is None else types
    original = {kind: m.clone() for kind, m in model.head_mask().items()}
    base_loss = mean_nll(model, batches)
    base_sums, units = masked_sentence_losses(model, batches, [None])  # per sentence, for the intervals
    base_bleu = bleu_fn(model) if bleu_fn is not None and any(t in bleu_types for t in types) else None
    rows = {(kind, layer, head): {"type": kind, "layer": layer, "head": head, "delta_loss": np.nan,
                                  "delta_bleu": np.nan, "delta_loss_low": np.nan, "delta_loss_high": np.nan}
            for kind in types for layer, head in np.ndindex(*original[kind].shape)}
    wanted = None if heads is None else {tuple(head) for head in heads}
    live = [key for key in rows if original[key[0]][key[1], key[2]] != 0 and (wanted is None or key in wanted)]
    # The passes take the heads in the order their layers run (a decoder layer's self- and
    # cross-attention heads together), so that each pass's lowest layer, below which its copies
    # share the work, is as high as it can be; the table keeps the rows' order.
    live.sort(key=lambda key: (head_position(key), key))
    bar = Progress(len(rows), "ablation", log, unit="head")
    bar.update(len(rows) - len(live))  # already masked, or not asked for: nothing to ablate
    try:
        for start in range(0, len(live), heads_per_pass):
            chunk = live[start:start + heads_per_pass]
            sums, _ = masked_sentence_losses(model, batches, chunk)
            for key, masked in zip(chunk, sums):
                rows[key]["delta_loss"] = masked.sum() / max(units.sum(), 1) - base_loss
                paired = paired_bootstrap_nll(masked, base_sums[0], units)
                rows[key]["delta_loss_low"], rows[key]["delta_loss_high"] = paired["low"], paired["high"]
                kind, layer, head = key
                if base_bleu is not None and kind in bleu_types:
                    mask = original[kind].clone()
                    mask[layer, head] = 0.0
                    model.set_head_mask({kind: mask})
                    rows[key]["delta_bleu"] = bleu_fn(model) - base_bleu
                    model.set_head_mask({kind: original[kind]})
                bar.update(1)
    finally:
        model.set_head_mask(original)
    table = pd.DataFrame(list(rows.values()), columns=[*KEYS, "delta_loss", "delta_bleu", "delta_loss_low",
                                                       "delta_loss_high"])
    table.attrs.update(base_loss=base_loss, base_bleu=base_bleu)
    return table
