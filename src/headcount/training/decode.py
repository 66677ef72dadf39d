"""Decoding: batched greedy search and batched beam search with the GNMT length penalty.

Both decode incrementally: the decoder's self-attention keys/values are cached per layer and
the encoder memory is projected once, so each step costs one query position. Sentences leave
the batch as soon as they are finished.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headcount.data.batching import source_tensor
from headcount.data.special import SpecialIds
from headcount.models.seq2seq import Seq2SeqWithHeads


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty ((5 + |Y|) / 6) ^ alpha (Wu et al. 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def _max_lengths(src: Tensor, special: SpecialIds, a: float, b: int, cap: int) -> Tensor:
    """(B,) target tokens allowed, EOS and the forced prefix included (the prefix does not count
    against a * |x| + b)."""
    src_len = src.ne(special.pad).sum(dim=1)
    return (src_len.float() * a + b + len(special.forced)).long().clamp(max=cap - 1)


def _never_generated(scores: Tensor, special: SpecialIds) -> None:
    """Padding and the start token are never output (in place)."""
    scores[:, list(special.never_generated())] = float("-inf")


def _force(scores: Tensor, t: int, special: SpecialIds) -> None:
    """While the target's forced prefix lasts, only its token may come, at no cost (in place): as
    transformers' forced-BOS processor does, so a language tag changes no hypothesis's score."""
    if t < len(special.forced):
        scores.fill_(float("-inf"))
        scores[:, special.forced[t]] = 0.0


def _only_eos(scores: Tensor, rows: Tensor, eos: int) -> None:
    """At the length limit only EOS may follow; it keeps its own score (no free ending)."""
    not_eos = torch.ones(scores.shape[-1], dtype=torch.bool, device=scores.device)
    not_eos[eos] = False
    scores[rows] = scores[rows].masked_fill(not_eos, float("-inf"))


@torch.no_grad()
def greedy_search(model: Seq2SeqWithHeads, src: Tensor, max_len_a: float = 1.5,
                  max_len_b: int = 10) -> list[list[int]]:
    """src (B, S) -> best-first token ids per sentence, without BOS/EOS (a forced prefix included,
    as the target side's Tokenizer encodes targets)."""
    model.eval()
    special = model.special
    B = src.shape[0]
    memory, src_pad, _ = model.encode(src)
    max_len = _max_lengths(src, special, max_len_a, max_len_b, model.max_positions)
    cache = model.new_cache()
    alive = torch.arange(B, device=src.device)  # original indices of the sentences still decoding
    last = torch.full((B, 1), special.bos, dtype=torch.long, device=src.device)
    outputs: list[list[int]] = [[] for _ in range(B)]
    for t in range(int(max_len.max())):
        hidden, _, _ = model.decode(last, memory, src_pad, cache=cache, start=t)
        logits = model.logits(hidden[:, -1]).float()  # (B_alive, V)
        _never_generated(logits, special)
        _only_eos(logits, t + 1 >= max_len[alive], special.eos)
        _force(logits, t, special)
        next_tok = logits.argmax(dim=-1)  # (B_alive,)
        done = next_tok.eq(special.eos)
        for row, (i, tok) in enumerate(zip(alive.tolist(), next_tok.tolist())):
            if not done[row]:
                outputs[i].append(tok)
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            alive, memory, src_pad = alive[keep], memory[keep], src_pad[keep]
            next_tok = next_tok[keep]
            model.reorder_cache(cache, keep)
        last = next_tok[:, None]
    return outputs


@torch.no_grad()
def beam_search(
    model: Seq2SeqWithHeads,
    src: Tensor,  # (B, S)
    beam: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
) -> list[list[int]]:
    """Best hypothesis per sentence by log P(y|x) / lp(|y|), |y| counting EOS, without BOS/EOS
    (a forced prefix included, as in greedy_search).

    A sentence is finished once it holds `beam` finished hypotheses (or reaches its maximum
    length); finished sentences leave the batch.
    """
    model.eval()
    special = model.special
    B, K = src.shape[0], beam
    device = src.device
    memory, src_pad, _ = model.encode(src)
    memory, src_pad = memory.repeat_interleave(K, 0), src_pad.repeat_interleave(K, 0)  # (B*K, ...)
    max_len = _max_lengths(src, special, max_len_a, max_len_b, model.max_positions)
    cache = model.new_cache()
    alive = torch.arange(B, device=device)  # original sentence index of each row group
    tokens = torch.full((B * K, 1), special.bos, dtype=torch.long, device=device)  # (rows, t+1)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: only one may expand at the first step
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]

    for t in range(int(max_len.max())):
        n = alive.numel()
        hidden, _, _ = model.decode(tokens[:, -1:], memory, src_pad, cache=cache, start=t)
        logp = model.logits(hidden[:, -1]).float().log_softmax(dim=-1)  # (n*K, V)
        V = logp.shape[-1]
        _never_generated(logp, special)
        force_eos = (t + 1 >= max_len[alive]).repeat_interleave(K)
        _only_eos(logp, force_eos, special.eos)
        _force(logp, t, special)
        candidates = (scores.view(n * K, 1) + logp).view(n, K * V)
        top_scores, top_idx = candidates.topk(2 * K, dim=1)  # (n, 2K)
        top_beam, top_tok = top_idx // V, top_idx % V
        is_eos = top_tok.eq(special.eos) & torch.isfinite(top_scores)

        # Hypotheses ending here: EOS among the first K candidates (the others would not be kept).
        eos_rows, eos_cols = (is_eos[:, :K]).nonzero(as_tuple=True)
        if eos_rows.numel():
            normalised = (top_scores[eos_rows, eos_cols] / length_penalty(t + 1, alpha)).tolist()
            prefix_rows = (eos_rows * K + top_beam[eos_rows, eos_cols]).tolist()
            prefixes = tokens[:, 1:].tolist()
            for r, row, s in zip(eos_rows.tolist(), prefix_rows, normalised):
                finished[int(alive[r])].append((s, prefixes[row]))

        # The K best continuations that do not end: sort EOS candidates to the back, keep order.
        order_key = is_eos.float() * (2 * K) + torch.arange(2 * K, device=device)
        keep_cols = order_key.argsort(dim=1)[:, :K]  # (n, K)
        new_scores = top_scores.gather(1, keep_cols).masked_fill(is_eos.gather(1, keep_cols), float("-inf"))
        new_beam, new_tok = top_beam.gather(1, keep_cols), top_tok.gather(1, keep_cols)
        rows = (torch.arange(n, device=device)[:, None] * K + new_beam).view(-1)  # (n*K,)
        tokens = torch.cat([tokens[rows], new_tok.view(-1, 1)], dim=1)
        scores = new_scores
        model.reorder_cache(cache, rows)

        done = torch.tensor([len(finished[int(i)]) >= K for i in alive], device=device)
        done |= torch.isinf(scores).all(dim=1)
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            keep_rows = (keep[:, None] * K + torch.arange(K, device=device)).view(-1)
            alive, scores, tokens = alive[keep], scores[keep], tokens[keep_rows]
            memory, src_pad = memory[keep_rows], src_pad[keep_rows]
            model.reorder_cache(cache, keep_rows)

    return [max(hyps, key=lambda h: h[0])[1] if hyps else [] for hyps in finished]


def translate(
    model: Seq2SeqWithHeads,
    src_ids: list[list[int]],
    beam: int = 4,
    alpha: float = 0.6,
    max_tokens: int = 4000,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    device: torch.device | str = "cpu",
    progress=None,
) -> list[list[int]]:
    """Translate many sentences in length-sorted batches; output in input order."""
    model.to(device).eval()
    lengths = [len(s) + 1 for s in src_ids]
    # Beam search holds beam * sentences rows: budget the batch accordingly.
    budget = max(max_tokens // max(beam, 1), max(lengths))
    batches, batch = [], []
    for i in sorted(range(len(src_ids)), key=lambda i: lengths[i]):  # shortest first, little padding
        if batch and lengths[i] * (len(batch) + 1) > budget:
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    out: list[list[int]] = [[] for _ in src_ids]
    for number, batch in enumerate(batches, start=1):
        src = source_tensor([src_ids[i] for i in batch], model.special).to(device)
        if beam > 1:
            hyps = beam_search(model, src, beam, alpha, max_len_a, max_len_b)
        else:
            hyps = greedy_search(model, src, max_len_a, max_len_b)
        for i, hyp in zip(batch, hyps):
            out[i] = hyp
        if progress is not None:
            progress(number, len(batches))
    return out
