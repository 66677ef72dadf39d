"""Batches: token-count budgets with length bucketing, and padded tensors.

The tensors take a model's special ids (`model.special`, a data.special.SpecialIds); there is no
default, so no tensor silently gets one model's ids.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from headcount.data.special import SpecialIds


def make_batches(
    src_lens: list[int], tgt_lens: list[int], max_tokens: int, seed: int, pool_batches: int = 100
) -> list[list[int]]:
    """Sentence indices grouped into batches of at most `max_tokens` padded tokens per side.

    Sentences are shuffled, then sorted by length inside pools of about `pool_batches` batches
    (little padding, yet random), and the batches are shuffled. Deterministic given `seed`.
    The sort key is the length the budget counts, the longer side, first: sorted by the source
    alone, pairs with long targets broke up runs of short ones, and Multi30k's batches held 2,684
    real tokens instead of 2,937 (benchmarks/RESULTS.md).
    """
    rng = random.Random(seed)
    order = list(range(len(src_lens)))
    rng.shuffle(order)
    mean_len = max(1, sum(max(s, t) for s, t in zip(src_lens, tgt_lens)) // max(1, len(order)))
    pool_size = max(1, pool_batches * max_tokens // mean_len)
    batches = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: (max(src_lens[i], tgt_lens[i]), src_lens[i]))
        batch, longest = [], 0
        for i in pool:
            length = max(src_lens[i], tgt_lens[i])
            if batch and max(longest, length) * (len(batch) + 1) > max_tokens:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, length)
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def positions(n_subwords: int) -> int:
    """The model positions a sentence of `n_subwords` takes, on either side: the source gets EOS,
    the decoder's input BOS and its output EOS (source_tensor, target_tensors)."""
    return n_subwords + 1


def pad(sequences: list[list[int]], pad_id: int) -> Tensor:
    out = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def source_tensor(src_ids: list[list[int]], special: SpecialIds) -> Tensor:
    """(B, S): subwords then EOS."""
    return pad([s + [special.eos] for s in src_ids], special.pad)


def target_tensors(tgt_ids: list[list[int]], special: SpecialIds) -> tuple[Tensor, Tensor]:
    """Decoder input (BOS + y) and output (y + EOS), both (B, T). Where y begins with the forced
    prefix (special.forced: a language tag), the output holds padding there: search never lets
    the model choose that token, so no loss counts it (training, dev loss, ablation, Michel)."""
    forced, n = list(special.forced), len(special.forced)
    outputs = [[special.pad] * n + t[n:] + [special.eos] if n and t[:n] == forced else t + [special.eos]
               for t in tgt_ids]
    return pad([[special.bos] + t for t in tgt_ids], special.pad), pad(outputs, special.pad)
