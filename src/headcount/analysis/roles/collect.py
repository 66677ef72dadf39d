"""A model's encoder attention over sentences, fed into the role statistics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from headcount.analysis.roles.alignment import align_pieces, aligned_words, sentence_tokens, word_attention
from headcount.analysis.roles.statistics import (
    PIECE_KINDS,
    PositionalStats,
    RareStats,
    SyntacticStats,
    frequency_words,
    piece_kind_masks,
    relation_pairs,
    source_lengths,
    syntactic_table,
    with_piece_kinds,
)
from headcount.data.batching import source_tensor

# --------------------------------------------------------------------------------------------
# Driver: a model, a segmenter, a parse table -> the three statistics tables


def _encoder_attention(model, segmenter, texts: Sequence[str], keep: Sequence[int], batch_size: int, device):
    """Encode the sentences `keep` of the (already lowercased if need be) `texts` in batches: yields
    (sentence indices, (L, B, H, S, S) encoder self-attention, lengths incl. EOS)."""
    ids = segmenter.encode([texts[i] for i in keep])
    for start in range(0, len(keep), batch_size):
        chunk = list(keep[start:start + batch_size])
        src = source_tensor(ids[start:start + batch_size], model.special).to(device)  # (B, S): pieces, EOS, padding
        lengths = source_lengths(src, model.special.pad).tolist()
        _, _, probs = model.encode(src, need_weights=True)
        yield chunk, torch.stack(probs), lengths


def _fitting(segmenter, texts: Sequence[str], model, max_pieces: int | None) -> tuple[list[int], int, int]:
    """Indices of the sentences the analysis keeps: at most `max_pieces` subwords (if given) and
    within the model's positions; and how many were too long for each reason."""
    lengths = [len(x) for x in segmenter.encode(list(texts))]
    too_long = {i for i, n in enumerate(lengths) if max_pieces is not None and n > max_pieces}
    no_room = {i for i, n in enumerate(lengths) if n + 1 > model.max_positions} - too_long
    return [i for i in range(len(texts)) if i not in too_long | no_room], len(too_long), len(no_room)


@torch.no_grad()
def text_statistics(model, segmenter, texts: Sequence[str], frequencies: Counter, lowercase: bool,
                    batch_size: int = 32, device: str | torch.device = "cpu", top_k: int = 500,
                    log=print) -> dict[str, pd.DataFrame]:
    """Positional and rare-token encoder-head statistics of running text (the experiment's own
    analysis set; they need no parse): {"positional", "rare"} DataFrames.

    Each line (lowercased when the model's data are) is segmented, EOS appended, and encoded in
    batches; lines longer than the model's max_len are skipped. The rare-token words of a line are
    its `frequency_words`, the words `frequencies` (count_words) were counted as.
    """
    model.eval().to(device)
    texts = [t.lower() if lowercase else t for t in texts]
    keep, _, no_room = _fitting(segmenter, texts, model, None)
    positional, rare = PositionalStats(), RareStats(frequencies, top_k, lowercase)
    by_kind = {kind: PositionalStats() for kind in PIECE_KINDS}
    unplaced = total_words = 0
    for chunk, probs, lengths in _encoder_attention(model, segmenter, texts, keep, batch_size, device):
        pieces = [segmenter.pieces(texts[i]) for i in chunk]
        positional.update(probs, lengths)
        for kind, mask in piece_kind_masks(pieces, probs.shape[-1]).items():
            by_kind[kind].update(probs, lengths, mask)
        for row, i in enumerate(chunk):
            words = frequency_words(texts[i], lowercase)
            piece_to_word = align_pieces(words, pieces[row])
            wa = word_attention(probs[:, row, :, :lengths[row], :lengths[row]], piece_to_word, len(words))
            total_words += len(words)
            unplaced += int((~aligned_words(wa)).sum())
            rare.update(wa, words, np.bincount(piece_to_word[piece_to_word >= 0], minlength=len(words)))
    log(f"positional and rare-token statistics: {len(keep)} of {len(texts)} sentences ({no_room} longer than "
        f"the model's positions), {unplaced} of {total_words} words without pieces, {rare.n_sentences} "
        f"eligible for rare tokens")
    if rare.n_uniform:
        log(f"rare tokens: a head attending uniformly over subwords would point to one of the two rarest "
            f"words in {rare.uniform_two_rarest / rare.n_uniform:.0%} of the eligible sentences")
    return {"positional": with_piece_kinds(positional.table(), by_kind), "rare": rare.table()}


@torch.no_grad()
def syntactic_statistics(model, segmenter, table: pd.DataFrame, lowercase: bool, batch_size: int = 32,
                         device: str | torch.device = "cpu", max_pieces: int | None = None,
                         log=print) -> dict[str, pd.DataFrame]:
    """Syntactic encoder-head statistics of parsed sentences (a headcount.parses table):
    {"syntactic", "table1"} DataFrames.

    Each sentence's `text` (lowercased when the model's data are) is segmented and encoded; the
    words are the table's surface tokens. Sentences of more than `max_pieces` subwords (e.g. the
    longest training sentence, for treebank text) or longer than the model's max_len are left out
    and counted in the log.
    """
    model.eval().to(device)
    sentences = [s for _, s in table.groupby("sentence", sort=True)]
    texts = [s["text"].iloc[0] for s in sentences]
    texts = [t.lower() if lowercase else t for t in texts]
    keep, too_long, no_room = _fitting(segmenter, texts, model, max_pieces)
    syntactic = SyntacticStats()
    unplaced = total_words = 0
    for chunk, probs, lengths in _encoder_attention(model, segmenter, texts, keep, batch_size, device):
        for row, i in enumerate(chunk):
            words = sentence_tokens(sentences[i])
            piece_to_word = align_pieces(words, segmenter.pieces(texts[i]))
            wa = word_attention(probs[:, row, :, :lengths[row], :lengths[row]], piece_to_word, len(words))
            total_words += len(words)
            unplaced += int((~aligned_words(wa)).sum())
            syntactic.update(wa, relation_pairs(sentences[i]))
    limit = f"{too_long} longer than {max_pieces} subwords, " if max_pieces is not None else ""
    log(f"syntactic statistics: {len(keep)} of {len(sentences)} parsed sentences ({limit}{no_room} longer than "
        f"the model's positions left out), {unplaced} of {total_words} words without pieces")
    syn = syntactic.table()
    return {"syntactic": syn, "table1": syntactic_table(syn)}


def encoder_head_statistics(model, segmenter, table: pd.DataFrame, frequencies: Counter, lowercase: bool,
                            batch_size: int = 32, device: str | torch.device = "cpu", top_k: int = 500,
                            texts: Sequence[str] | None = None, max_pieces: int | None = None,
                            log=print) -> dict[str, pd.DataFrame]:
    """All encoder self-attention head statistics: {"positional", "rare"} from `text_statistics`
    on `texts` (default: the parse table's sentences), {"syntactic", "table1"} from
    `syntactic_statistics` on `table` (sentences over `max_pieces` subwords left out)."""
    if texts is None:
        texts = table.groupby("sentence", sort=True)["text"].first().tolist()
    stats = text_statistics(model, segmenter, texts, frequencies, lowercase, batch_size, device, top_k, log)
    return {**stats, **syntactic_statistics(model, segmenter, table, lowercase, batch_size, device, max_pieces,
                                            log)}


def longest_sentence(segmenter, lines: Iterable[str], lowercase: bool) -> int:
    """The number of subwords of the longest line (the training maximum for treebank text)."""
    lines = [line.lower() if lowercase else line for line in lines]
    return max((len(x) for x in segmenter.encode(lines)), default=0)
