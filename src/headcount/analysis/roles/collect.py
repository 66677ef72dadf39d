"""A model's attention over sentences, fed into the role statistics.

The heads that get roles are those of the attention type registry.ROLE_ATTENTION names for the
model's kind (models.seq2seq.kind_of). Every kind's maps are brought to the source layout the
statistics assume (the package docstring): pieces, then one no-op sink slot where the source's EOS
is, then padding, so that the sink is left out of every argmax in one way for all kinds (no
renormalisation):

- encoder_decoder: the encoder's self-attention over pieces + EOS, as it is.
- decoder_only: the causal self-attention over BOS + pieces (`model(src_empty, tgt_in)`), BOS moved
  behind the pieces: BOS is a causal model's no-op sink (every query sees it), the counterpart of
  EOS; its own row (it sees only itself) is the left-out sink row. Offsets between pieces keep
  their sign and size.
- encoder_only: the self-attention over [CLS] + pieces + [SEP]; [CLS]'s column is added to [SEP]'s
  (both are no-op sinks: the sink slot holds their sum) and [CLS]'s row and column dropped, so a
  query's attention still sums to 1 and neither sink can be a head's argmax.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from headcount.analysis.roles.alignment import align_pieces, aligned_words, sentence_tokens, word_attention
from headcount.analysis.roles.registry import PIECE_KINDS, ROLE_ATTENTION
from headcount.analysis.roles.statistics import (
    PositionalStats,
    RareStats,
    SinkStats,
    SyntacticStats,
    frequency_words,
    piece_kind_masks,
    relation_pairs,
    repeated_sequence_scores,
    repeated_sequences,
    source_lengths,
    syntactic_table,
    with_piece_kinds,
)
from headcount.data.batching import pad, source_tensor
from headcount.models.attention_stream import stream_attention
from headcount.models.seq2seq import kind_of

# --------------------------------------------------------------------------------------------
# Driver: a model, a segmenter, a parse table -> the three statistics tables


def is_causal(model) -> bool:
    """Whether the heads that get roles see only the past (a decoder-only model's)."""
    return ROLE_ATTENTION[kind_of(model).layout] == "dec_self"


def _sink_positions(model) -> int:
    """The model positions a sentence takes beyond its pieces: EOS (encoder-decoder), BOS
    (decoder-only), [CLS] and [SEP] (encoder-only)."""
    return 2 if kind_of(model).layout == "encoder_only" else 1


def _bos_last(probs: torch.Tensor, n_pieces: list[int]) -> torch.Tensor:
    """(L, B, H, T, T) maps over BOS + pieces + padding -> over pieces + BOS + padding (each row
    b's BOS put right after its n_pieces[b] pieces; rows and columns alike)."""
    L, B, H, T, _ = probs.shape
    order = torch.tensor([[*range(1, n + 1), 0, *range(n + 1, T)] for n in n_pieces], device=probs.device)
    rows = probs.gather(3, order.view(1, B, 1, T, 1).expand(L, B, H, T, T))
    return rows.gather(4, order.view(1, B, 1, 1, T).expand(L, B, H, T, T))


def _cls_into_sep(probs: torch.Tensor, n_pieces: list[int]) -> torch.Tensor:
    """(L, B, H, S, S) maps over [CLS] + pieces + [SEP] + padding -> over pieces + sink + padding,
    the sink's column the sum of [CLS]'s and [SEP]'s."""
    probs = probs.clone()
    for b, n in enumerate(n_pieces):
        probs[:, b, :, :, n + 1] += probs[:, b, :, :, 0]
    return probs[..., 1:, 1:]


# The padded tokens of one batch of the role statistics, beside its number of sentences: a layer's
# maps are B x H x S^2, so 32 documents of 2,048 tokens would be 32 times one document's.
ROLE_MAX_TOKENS = 4096


def _role_batches(lengths: list[int], batch_size: int, max_tokens: int = ROLE_MAX_TOKENS) -> list[tuple[int, int]]:
    """(start, stop) of consecutive sentences, at most `batch_size` of them and, past the first,
    at most `max_tokens` padded positions (a longer sentence goes alone). The statistics are sums
    over sentences, so the batches change no number."""
    out, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        width = n + 2  # the pieces and at most two sink positions
        if i > start and (i - start >= batch_size or max(longest, width) * (i - start + 1) > max_tokens):
            out.append((start, i))
            start, longest = i, 0
        longest = max(longest, width)
    if start < len(lengths):
        out.append((start, len(lengths)))
    return out


# on_layer(layer, probs (1, B, H, S, S) in the source layout) of _role_attention's `run`
LayerCallback = Callable[[int, torch.Tensor], None]


def _role_attention(model, segmenter, texts: Sequence[str], keep: Sequence[int], batch_size: int, device):
    """Run the model over the sentences `keep` of the (already lowercased if need be) `texts` in
    batches: yields (sentence indices, lengths incl. the sink, run) per batch, where `run(on_layer)`
    makes the batch's pass and hands `on_layer(layer, probs)` each layer's (1, B, H, S, S) attention
    of the heads that get roles, in the source layout (module docstring), as the layer computes it
    (models.attention_stream): no pass holds more than one layer's maps, so a document of 2,048
    tokens costs one layer's H x S^2, not L of them."""
    ids = segmenter.encode([texts[i] for i in keep])
    kind, special = kind_of(model).layout, model.special
    role_type = ROLE_ATTENTION[kind]
    for start, stop in _role_batches([len(x) for x in ids], batch_size):
        chunk, pieces = list(keep[start:stop]), ids[start:stop]
        n_pieces = [len(x) for x in pieces]
        if kind == "decoder_only":
            src = torch.zeros(len(chunk), 0, dtype=torch.long, device=device)
            tgt_in = pad([[special.bos, *x] for x in pieces], special.pad).to(device)
            lengths = [n + 1 for n in n_pieces]

            def layout(probs, n_pieces=n_pieces):
                return _bos_last(probs, n_pieces)
        elif kind == "encoder_only":
            src = pad([[special.bos, *x, special.eos] for x in pieces], special.pad).to(device)
            tgt_in = torch.zeros(len(chunk), 0, dtype=torch.long, device=device)
            lengths = [n + 1 for n in n_pieces]

            def layout(probs, n_pieces=n_pieces):
                return _cls_into_sep(probs, n_pieces)
        else:
            src = source_tensor(pieces, special).to(device)  # (B, S): pieces, EOS, padding
            tgt_in = torch.full((len(chunk), 1), special.bos, dtype=torch.long, device=device)
            lengths = source_lengths(src, special.pad).tolist()

            def layout(probs):
                return probs

        def run(on_layer: LayerCallback, src=src, tgt_in=tgt_in, layout=layout) -> None:
            def reduce(attention_type: str, layer: int, probs: torch.Tensor) -> None:
                on_layer(layer, layout(probs[None]))

            stream_attention(model, src, tgt_in, reduce, types=(role_type,))

        yield chunk, lengths, run


class _PerLayer:
    """One statistics accumulator per layer, fed that layer's maps alone ((1, B, H, S, S)); their
    tables, each of layer 0, joined with their own layer numbers. Every accumulator's per-head
    numbers depend on its own layer's maps only, and their shared counts (queries, sentences,
    instances) on the batch alone, so the joined table equals one accumulator's fed every layer at
    once (tests/test_long_inputs.py)."""

    def __init__(self, make):
        self.make, self.layers = make, {}

    def __getitem__(self, layer: int):
        if layer not in self.layers:
            self.layers[layer] = self.make()
        return self.layers[layer]

    @property
    def first(self):
        return self.layers[min(self.layers)] if self.layers else self.make()

    def table(self, table=lambda stats: stats.table()) -> pd.DataFrame:
        frames = [table(stats).assign(layer=layer) for layer, stats in sorted(self.layers.items())]
        frames = [f for f in frames if not f.empty]
        if not frames:
            return table(self.make())
        return pd.concat(frames, ignore_index=True)


def _fitting(segmenter, texts: Sequence[str], model, max_pieces: int | None, log=print) -> tuple[list[int], int, int]:
    """Indices of the sentences the analysis keeps: at most `max_pieces` subwords (if given) and
    within the model's positions; and how many were too long for each reason."""
    lengths = [len(x) for x in segmenter.encode(list(texts))]
    too_long = {i for i, n in enumerate(lengths) if max_pieces is not None and n > max_pieces}
    no_room = {i for i, n in enumerate(lengths) if n + _sink_positions(model) > model.max_positions} - too_long
    if no_room:  # left out, as sentences over max_pieces are: named, so that a document can be split
        first = sorted(no_room)[:5]
        log(f"role statistics leave out {len(no_room)} text(s) longer than the model's {model.max_positions} "
            f"positions ({', '.join(f'text {i}: {lengths[i]} pieces' for i in first)}"
            f"{', ...' if len(no_room) > len(first) else ''}); split them into parts of at most "
            f"{model.max_positions - _sink_positions(model)} pieces to have them counted")
    return [i for i in range(len(texts)) if i not in too_long | no_room], len(too_long), len(no_room)


def _word_maps(layer: int, probs: torch.Tensor, lengths: Sequence[int], piece_to_word: Sequence, words: Sequence,
               counts: dict[str, int]):
    """Each batch row's word-level attention of one layer: (row, (H, W + 1, W + 1)). On layer 0 it
    also adds the rows' words, and those without pieces, to `counts` (once per sentence)."""
    for row, n in enumerate(lengths):
        wa = word_attention(probs[:, row, :, :n, :n], piece_to_word[row], len(words[row]))
        if layer == 0:
            counts["words"] += len(words[row])
            counts["unplaced"] += int((~aligned_words(wa)).sum())
        yield row, wa


@torch.no_grad()
def text_statistics(model, segmenter, texts: Sequence[str], frequencies: Counter, lowercase: bool,
                    batch_size: int = 32, device: str | torch.device = "cpu", top_k: int = 500,
                    log=print) -> dict[str, pd.DataFrame]:
    """Positional, rare-token and sink statistics of running text (the experiment's own analysis
    set; they need no parse) for the heads that get roles (module docstring): {"positional",
    "rare", "sink"} DataFrames.

    Each line (lowercased when the model's data are) is segmented, given the model's sink token(s),
    and run through the model in batches; lines longer than the model's max_len are skipped. The
    rare-token words of a line are its `frequency_words`, the words `frequencies` (count_words) were
    counted as. "sink" is the share on the sink slot (an encoder-decoder model's EOS).
    """
    model.eval().to(device)
    texts = [t.lower() if lowercase else t for t in texts]
    keep, _, no_room = _fitting(segmenter, texts, model, None, log)
    positional, sink = _PerLayer(PositionalStats), _PerLayer(SinkStats)
    rare = _PerLayer(lambda: RareStats(frequencies, top_k, lowercase))
    by_kind = {kind: _PerLayer(PositionalStats) for kind in PIECE_KINDS}
    counts = {"words": 0, "unplaced": 0}  # over the sentences, counted on layer 0 (_word_maps)
    for chunk, lengths, run in _role_attention(model, segmenter, texts, keep, batch_size, device):
        pieces = [segmenter.pieces(texts[i]) for i in chunk]
        kind_masks = piece_kind_masks(pieces, max(lengths))
        words = [frequency_words(texts[i], lowercase) for i in chunk]
        piece_to_word = [align_pieces(w, p) for w, p in zip(words, pieces)]
        pieces_per_word = [np.bincount(p[p >= 0], minlength=len(w)) for w, p in zip(words, piece_to_word)]

        def on_layer(layer: int, probs: torch.Tensor, lengths=lengths, kind_masks=kind_masks, words=words,
                     piece_to_word=piece_to_word, pieces_per_word=pieces_per_word) -> None:
            positional[layer].update(probs, lengths)
            sink[layer].update(probs, lengths)
            for kind, mask in kind_masks.items():
                by_kind[kind][layer].update(probs, lengths, mask)
            for row, wa in _word_maps(layer, probs, lengths, piece_to_word, words, counts):
                rare[layer].update(wa, words[row], pieces_per_word[row])

        run(on_layer)
    log(f"positional and rare-token statistics: {len(keep)} of {len(texts)} sentences ({no_room} longer than "
        f"the model's positions), {counts['unplaced']} of {counts['words']} words without pieces, "
        f"{rare.first.n_sentences} eligible for rare tokens")
    if rare.first.n_uniform:
        log(f"rare tokens: a head attending uniformly over subwords would point to one of the two rarest "
            f"words in {rare.first.uniform_two_rarest / rare.first.n_uniform:.0%} of the eligible sentences")

    def with_kinds(layer_stats: PositionalStats, layer: int) -> pd.DataFrame:
        return with_piece_kinds(layer_stats.table(), {kind: by_kind[kind][layer] for kind in PIECE_KINDS})

    joined = [with_kinds(stats, layer).assign(layer=layer) for layer, stats in sorted(positional.layers.items())]
    joined = [f for f in joined if not f.empty]
    table = pd.concat(joined, ignore_index=True) if joined else with_piece_kinds(
        PositionalStats().table(), {kind: PositionalStats() for kind in PIECE_KINDS})
    return {"positional": table, "rare": rare.table(), "sink": sink.table()}


@torch.no_grad()
def sentence_positional_counts(model, segmenter, texts: Sequence[str], lowercase: bool, batch_size: int = 32,
                               device: str | torch.device = "cpu",
                               log=print) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The positional statistics of `text_statistics` (the same sentences, segmentation and maps:
    the `positional` table before its piece kinds) with each sentence's part of them, for resampling
    sentences: (table, hits, valid), hits and valid (len(texts), L, H) as PositionalStats'
    `sentence_counts`, at each head's most frequent offset over all the sentences. Row i is
    texts[i]; a line longer than the model's positions counts nothing (zeros), as it is left out of
    the table."""
    model.eval().to(device)
    texts = [t.lower() if lowercase else t for t in texts]
    keep, _, no_room = _fitting(segmenter, texts, model, None, log)
    stats = _PerLayer(lambda: PositionalStats(per_sentence=True))
    fed = []
    for chunk, lengths, run in _role_attention(model, segmenter, texts, keep, batch_size, device):
        run(lambda layer, probs, lengths=lengths: stats[layer].update(probs, lengths))
        fed += chunk
    counts = [stats.layers[layer].sentence_counts() for layer in sorted(stats.layers)]
    if counts:
        kept_hits = np.concatenate([h for h, _ in counts], axis=1)
        kept_valid = np.concatenate([v for _, v in counts], axis=1)
    else:
        kept_hits, kept_valid = PositionalStats(per_sentence=True).sentence_counts()
    hits = np.zeros((len(texts), *kept_hits.shape[1:]), np.int64)
    valid = np.zeros_like(hits)
    hits[fed], valid[fed] = kept_hits, kept_valid
    log(f"positional counts per sentence: {len(keep)} of {len(texts)} sentences ({no_room} longer than the "
        f"model's positions)")
    return stats.table(), hits, valid


@torch.no_grad()
def syntactic_statistics(model, segmenter, table: pd.DataFrame, lowercase: bool, batch_size: int = 32,
                         device: str | torch.device = "cpu", max_pieces: int | None = None,
                         log=print) -> dict[str, pd.DataFrame]:
    """Syntactic statistics of parsed sentences (a headcount.parses table) for the heads that get
    roles (module docstring; a causal model's: SyntacticStats' `causal`): {"syntactic", "table1"}
    DataFrames.

    Each sentence's `text` (lowercased when the model's data are) is segmented and encoded; the
    words are the table's surface tokens. Sentences of more than `max_pieces` subwords (e.g. the
    longest training sentence, for treebank text) or longer than the model's max_len are left out
    and counted in the log.
    """
    model.eval().to(device)
    sentences = [s for _, s in table.groupby("sentence", sort=True)]
    texts = [s["text"].iloc[0] for s in sentences]
    texts = [t.lower() if lowercase else t for t in texts]
    keep, too_long, no_room = _fitting(segmenter, texts, model, max_pieces, log)
    syntactic = _PerLayer(lambda: SyntacticStats(causal=is_causal(model)))
    counts = {"words": 0, "unplaced": 0}  # over the sentences, counted on layer 0 (_word_maps)
    for chunk, lengths, run in _role_attention(model, segmenter, texts, keep, batch_size, device):
        words = [sentence_tokens(sentences[i]) for i in chunk]
        piece_to_word = [align_pieces(w, segmenter.pieces(texts[i])) for w, i in zip(words, chunk)]
        pairs = [relation_pairs(sentences[i]) for i in chunk]

        def on_layer(layer: int, probs: torch.Tensor, lengths=lengths, words=words, piece_to_word=piece_to_word,
                     pairs=pairs) -> None:
            for row, wa in _word_maps(layer, probs, lengths, piece_to_word, words, counts):
                syntactic[layer].update(wa, pairs[row])

        run(on_layer)
    limit = f"{too_long} longer than {max_pieces} subwords, " if max_pieces is not None else ""
    log(f"syntactic statistics: {len(keep)} of {len(sentences)} parsed sentences ({limit}{no_room} longer than "
        f"the model's positions left out), {counts['unplaced']} of {counts['words']} words without pieces")
    syn = syntactic.table()
    if not syn.empty:  # SyntacticStats' order: relation and direction first, then layer and head
        keys = {key: i for i, key in enumerate(syntactic.first.keys)}
        order = [keys[(r, d)] for r, d in zip(syn["relation"], syn["direction"])]
        syn = syn.assign(_key=order).sort_values(["_key", "layer", "head"], kind="stable").drop(
            columns="_key").reset_index(drop=True)
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


@torch.no_grad()
def induction_statistics(model, vocab_size: int, length: int = 50, sequences: int = 20, seed: int = 0,
                         device: str | torch.device = "cpu", log=print) -> pd.DataFrame:
    """Induction, duplicate-token and previous-token scores of a decoder-only model's heads
    (statistics.repeated_sequence_scores) on `sequences` rows of BOS + r + r, r `length` random
    ids below `vocab_size` that are not special (seeded); `length` shrinks to fit the model's
    positions."""
    if not is_causal(model):
        raise ValueError(f"induction scores are for causal models, not {kind_of(model).name}")
    model.eval().to(device)
    length = min(length, (model.max_positions - 1) // 2)
    tgt_in = repeated_sequences(vocab_size, model.special, length, sequences, seed).to(device)
    layers = []

    def on_map(kind: str, layer: int, probs: torch.Tensor) -> None:
        layers.append(repeated_sequence_scores(probs[None], length).assign(layer=layer))

    stream_attention(model, torch.zeros(sequences, 0, dtype=torch.long, device=device), tgt_in, on_map,
                     types=("dec_self",))
    table = pd.concat(layers, ignore_index=True)
    best = table.loc[table["induction_score"].idxmax()]
    log(f"induction scores on {sequences} sequences of 2 x {length} random tokens (seed {seed}): best "
        f"{best['induction_score']:.2f} (layer {int(best['layer'])}, head {int(best['head'])})")
    return table


def longest_sentence(segmenter, lines: Iterable[str], lowercase: bool) -> int:
    """The number of subwords of the longest line (the training maximum for treebank text)."""
    lines = [line.lower() if lowercase else line for line in lines]
    return max((len(x) for x in segmenter.encode(lines)), default=0)
