"""Batches: token-count budgets with length bucketing, and padded tensors.

The tensors take a model's special ids (`model.special`, a data.special.SpecialIds); there is no
default, so no tensor silently gets one model's ids.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from headcount.io import HeadcountError

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


class TextTooLong(HeadcountError):
    """A text that does not fit the model's positions (its context)."""


# The positions each objective's batch gives a text of n tokens beyond them (objective_tensors):
# translation EOS on the source (and BOS or EOS on the target side), a causal LM none (BOS + x[:-1]),
# a masked LM and a sentence encoder [CLS] and [SEP].
EXTRA_POSITIONS = {"translation": 1, "causal_lm": 0, "masked_lm": 2, "sentence_embedding": 2}


def check_lengths(src_ids: list[list[int]], tgt_ids: list[list[int]], max_positions: int,
                  objective: str = "translation") -> None:
    """Refuse, by its index and length, the first text whose batch would not fit the model's
    `max_positions` (a causal LM reads the target side, a masked LM and a sentence encoder the
    source side, a translation model both): truncated, its scores would be of another text, and
    the model would fail on it somewhere inside, not naming it. A text longer than a batch's token
    budget is no problem (make_batches gives it a batch of its own)."""
    extra = EXTRA_POSITIONS[objective]
    sides = {"translation": (("source", src_ids), ("target", tgt_ids)), "causal_lm": (("text", tgt_ids),),
             "masked_lm": (("text", src_ids),), "sentence_embedding": (("text", src_ids),)}[objective]
    for side, ids in sides:
        for i, x in enumerate(ids):
            if len(x) + extra > max_positions:
                raise TextTooLong(
                    f"{side} {i} has {len(x)} tokens, {len(x) + extra} positions with the model's special tokens, "
                    f"but the model takes at most {max_positions}: split it into parts of at most "
                    f"{max_positions - extra} tokens (e.g. at paragraph or sentence ends), or leave it out")


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


# --------------------------------------------------------------------------------------------
# The batch of each objective (models.seq2seq: MODEL_KINDS and the batch layout they share)

MASK_RATE = 0.15  # of a text's tokens, at least one (Devlin et al. 2019)


def causal_lm_tensors(ids: list[list[int]], special: SpecialIds) -> tuple[Tensor, Tensor, Tensor]:
    """A language model's batch: src empty (B, 0); tgt_in = BOS + x[:-1], tgt_out = x (B, T).
    No EOS target: a model without a padding id pads with its EOS id, and a target equal to the
    padding id would not count."""
    if any(not x for x in ids):
        raise ValueError("an empty text has no token to predict; drop empty lines before batching")
    tgt_in = pad([[special.bos] + x[:-1] for x in ids], special.pad)
    return torch.zeros(len(ids), 0, dtype=torch.long), tgt_in, pad([list(x) for x in ids], special.pad)


def masked_positions(ids: list[int], seed: int, rate: float = MASK_RATE) -> list[int]:
    """The positions of a text that a masked-LM batch masks: a fixed draw from the text and the
    seed alone, so a sentence is masked the same way in every batch and run (evaluation) and a new
    seed draws anew (training epochs)."""
    rng = random.Random(f"{seed}:{','.join(map(str, ids))}")  # str seeds hash with sha512: stable across runs
    return sorted(rng.sample(range(len(ids)), max(1, round(rate * len(ids)))))


def masked_lm_tensors(ids: list[list[int]], special: SpecialIds, seed: int = 0,
                      rate: float = MASK_RATE) -> tuple[Tensor, Tensor, Tensor]:
    """A masked LM's batch: src = BOS + x' + EOS (B, S), x' holding `special.mask` at
    `masked_positions`; tgt_in empty (B, 0); tgt_out (B, S) the original ids there, padding elsewhere."""
    if special.mask is None:
        raise ValueError("a masked-LM batch needs the model's mask id (SpecialIds.mask)")
    if any(not x for x in ids):
        raise ValueError("an empty text has no token to mask; drop empty lines before batching")
    inputs, outputs = [], []
    for x in ids:
        chosen = set(masked_positions(x, seed, rate))
        inputs.append([special.bos] + [special.mask if i in chosen else t for i, t in enumerate(x)] + [special.eos])
        outputs.append([special.pad] + [t if i in chosen else special.pad for i, t in enumerate(x)] + [special.pad])
    return pad(inputs, special.pad), torch.zeros(len(ids), 0, dtype=torch.long), pad(outputs, special.pad)


def sentence_tensors(ids: list[list[int]], special: SpecialIds) -> tuple[Tensor, Tensor, Tensor]:
    """A sentence encoder's batch: src = BOS + x + EOS (B, S) ([CLS] x [SEP], as its tokenizer
    frames a sentence), nothing masked; tgt_in empty (B, 0); tgt_out (B, 1) one non-padding id (BOS)
    per sentence, so that whatever counts scored targets counts sentences: the loss is one per
    sentence (its pooled embedding's distance, models.sentence_embedding)."""
    if any(not x for x in ids):
        raise ValueError("an empty text has no token to pool; drop empty lines before batching")
    src = pad([[special.bos, *x, special.eos] for x in ids], special.pad)
    return src, torch.zeros(len(ids), 0, dtype=torch.long), torch.full((len(ids), 1), special.bos, dtype=torch.long)


def objective_tensors(objective: str, src_ids: list[list[int]], tgt_ids: list[list[int]], special: SpecialIds,
                      seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """(src, tgt_in, tgt_out) of an objective (ModelKind.objective). A language model's corpus holds
    its text on both sides; causal_lm reads the target side, masked_lm and sentence_embedding the
    source side. `seed`: the masking draw (masked_lm only)."""
    if objective == "translation":
        return (source_tensor(src_ids, special), *target_tensors(tgt_ids, special))
    if objective == "causal_lm":
        return causal_lm_tensors(tgt_ids, special)
    if objective == "masked_lm":
        return masked_lm_tensors(src_ids, special, seed)
    if objective == "sentence_embedding":
        return sentence_tensors(src_ids, special)
    raise ValueError(f"unknown objective {objective!r}: one of translation, causal_lm, masked_lm, sentence_embedding")
