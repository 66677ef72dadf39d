"""Long inputs (issue 62, item 3): the analyses read attention one layer at a time and give the
numbers of reading every layer at once; a text longer than a batch's budget is analysed alone, one
longer than the model's positions is refused by its index.

The references below are the code before streaming: every layer's maps from one
`model(..., need_weights=True)` call, stacked, fed to one accumulator each.
"""

from __future__ import annotations

import gc
import weakref
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_config
from fakes import PieceSegmenter
from test_roles import parse_table

from headcount.analysis.importance import confidence_masks, confidence_sums, dev_batches, head_confidence
from headcount.analysis.roles.alignment import align_pieces, sentence_tokens, word_attention
from headcount.analysis.roles.collect import (
    _bos_last,
    _role_batches,
    induction_statistics,
    sentence_positional_counts,
    syntactic_statistics,
    text_statistics,
)
from headcount.analysis.roles.statistics import (
    PIECE_KINDS,
    PositionalStats,
    RareStats,
    SinkStats,
    SyntacticStats,
    count_words,
    frequency_words,
    piece_kind_masks,
    relation_pairs,
    repeated_sequence_scores,
    repeated_sequences,
    with_piece_kinds,
)
from headcount.analysis.tables import head_rows
from headcount.data.batching import TextTooLong, check_lengths
from headcount.data.special import SpecialIds
from headcount.models.attention_stream import stream_attention
from headcount.models.seq2seq import kind_of
from headcount.models.transformer import Transformer

TEXTS = ["the old dog saw a cat near the red barn", "a cat ran", "we saw the big red dog and the small cat",
         "go now", "antidisestablishmentarianism is a long word"]
PARSED = [[("dogs", 2, "nsubj"), ("chase", 0, "root"), ("red", 4, "amod"), ("cats", 2, "obj")],
          [("she", 2, "nsubj"), ("runs", 0, "root"), ("fast", 2, "advmod")]]


def quiet(_):
    pass


def tiny_llama(layers: int = 3):
    from transformers import LlamaConfig, LlamaForCausalLM

    from headcount.models.hf_lm import HFCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=70, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return HFCausalLM(LlamaForCausalLM(config), special=SpecialIds(pad=0, bos=1, eos=2, unk=3)).eval()


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@torch.no_grad()
def all_layers(model, tgt_in):
    """(L, B, H, T, T): every layer's map at once, as the analyses read them before streaming."""
    _, attention = model(torch.zeros(len(tgt_in), 0, dtype=torch.long), tgt_in, need_weights=True)
    return torch.stack(attention["dec_self"])


def reference_text_statistics(model, segmenter, texts, frequencies):
    positional, rare, sink = PositionalStats(), RareStats(frequencies, 500, False), SinkStats()
    by_kind = {kind: PositionalStats() for kind in PIECE_KINDS}
    for text in texts:  # one sentence per batch: the statistics are sums over sentences
        pieces, ids = segmenter.pieces(text), segmenter.encode([text])[0]
        probs = _bos_last(all_layers(model, torch.tensor([[model.special.bos, *ids]])), [len(ids)])
        lengths = [len(ids) + 1]
        positional.update(probs, lengths)
        sink.update(probs, lengths)
        for kind, mask in piece_kind_masks([pieces], probs.shape[-1]).items():
            by_kind[kind].update(probs, lengths, mask)
        words = frequency_words(text, False)
        ptw = align_pieces(words, pieces)
        wa = word_attention(probs[:, 0, :, :lengths[0], :lengths[0]], ptw, len(words))
        rare.update(wa, words, np.bincount(ptw[ptw >= 0], minlength=len(words)))
    return {"positional": with_piece_kinds(positional.table(), by_kind), "rare": rare.table(), "sink": sink.table()}


def test_streamed_role_statistics_equal_every_layer_at_once(llama):
    segmenter = PieceSegmenter()
    frequencies = count_words(TEXTS[:2], lowercase=False)
    streamed = text_statistics(llama, segmenter, TEXTS, frequencies, lowercase=False, batch_size=2, log=quiet)
    reference = reference_text_statistics(llama, segmenter, TEXTS, frequencies)
    for name in ("positional", "rare", "sink"):
        assert len(streamed[name]) == 3 * 4, name  # every layer and head
        pd.testing.assert_frame_equal(streamed[name], reference[name], check_dtype=False, obj=name)

    table, hits, valid = sentence_positional_counts(llama, segmenter, TEXTS, lowercase=False, batch_size=2, log=quiet)
    pd.testing.assert_frame_equal(table, reference["positional"][table.columns], check_dtype=False)
    probe = PositionalStats(per_sentence=True)
    for text in TEXTS:
        ids = segmenter.encode([text])[0]
        probe.update(_bos_last(all_layers(llama, torch.tensor([[1, *ids]])), [len(ids)]), [len(ids) + 1])
    ref_hits, ref_valid = probe.sentence_counts()
    assert np.array_equal(hits, ref_hits) and np.array_equal(valid, ref_valid)


def test_streamed_syntactic_and_induction_statistics_equal_every_layer_at_once(llama):
    segmenter, table = PieceSegmenter(), parse_table(PARSED)
    streamed = syntactic_statistics(llama, segmenter, table, lowercase=False, log=quiet)["syntactic"]
    reference = SyntacticStats(causal=True)
    for _, sentence in table.groupby("sentence", sort=True):
        text = sentence["text"].iloc[0]
        ids, words = segmenter.encode([text])[0], sentence_tokens(sentence)
        probs = _bos_last(all_layers(llama, torch.tensor([[1, *ids]])), [len(ids)])
        wa = word_attention(probs[:, 0], align_pieces(words, segmenter.pieces(text)), len(words))
        reference.update(wa, relation_pairs(sentence))
    pd.testing.assert_frame_equal(streamed, reference.table(), check_dtype=False)

    induction = induction_statistics(llama, vocab_size=70, length=6, sequences=3, log=quiet)
    expected = repeated_sequence_scores(all_layers(llama, repeated_sequences(70, llama.special, 6, 3)), 6)
    pd.testing.assert_frame_equal(induction, expected, check_dtype=False)


@torch.no_grad()
def reference_confidence(model, batches):
    sums, counts = {}, {}
    for src, tgt_in, _ in batches:
        _, attentions = model(src, tgt_in, need_weights=True)
        masks = confidence_masks(src, tgt_in, model.special, False, kind_of(model).layout)
        for kind, (query_keep, key_keep) in masks.items():
            per_layer = [confidence_sums(p.double(), query_keep, key_keep) for p in attentions[kind]]
            sums[kind] = sums.get(kind, 0) + torch.stack([s for s, _ in per_layer])
            counts[kind] = counts.get(kind, 0) + per_layer[0][1]
    return head_rows({kind: s / max(counts[kind], 1) for kind, s in sums.items()}, "confidence")


@pytest.mark.parametrize("family", ["headcount", "llama"])
def test_streamed_confidence_equals_every_layer_at_once(family, llama):
    rng = np.random.default_rng(0)
    if family == "headcount":
        torch.manual_seed(0)
        model, objective = Transformer(tiny_config()).eval(), "translation"
        src = [list(rng.integers(4, 23, rng.integers(2, 12))) for _ in range(7)]
        tgt = [list(rng.integers(4, 19, rng.integers(2, 12))) for _ in range(7)]
    else:
        model, objective = llama, "causal_lm"
        src = tgt = [list(rng.integers(4, 70, rng.integers(2, 30))) for _ in range(7)]
    batches = dev_batches(src, tgt, max_tokens=40, special=model.special, objective=objective)
    streamed = head_confidence(model, batches)
    assert len(streamed) == sum(len(m) * m[0].n_heads for m in model.attention_modules().values())
    pd.testing.assert_frame_equal(streamed, reference_confidence(model, batches))


@pytest.mark.parametrize("family", ["headcount", "llama"])
@pytest.mark.slow
def test_a_layers_map_is_gone_before_the_next_layer_computes_its_own(family, llama):
    """What streaming is for: when layer l's map reaches the callback, no earlier layer's map is
    alive anywhere (the model's own output lists included), so memory holds one layer's maps."""
    if family == "headcount":
        torch.manual_seed(0)
        model = Transformer(tiny_config(enc_layers=3)).eval()
        src, tgt_in, kind = torch.randint(4, 23, (2, 9)), torch.full((2, 1), 1), "enc_self"
    else:
        model, kind = llama, "dec_self"
        src, tgt_in = torch.zeros(2, 0, dtype=torch.long), torch.randint(4, 70, (2, 9))
    alive, seen = [], []

    def on_map(attention_type, layer, probs):
        gc.collect()
        alive.append(sum(ref() is not None for ref in seen))
        seen.append(weakref.ref(probs))

    with torch.no_grad():  # as every analysis runs it (with gradients, autograd would keep the maps)
        stream_attention(model, src, tgt_in, on_map, types=(kind,))
    assert len(seen) == 3 and alive == [0, 0, 0]


def test_a_text_longer_than_the_batch_budget_is_analysed_alone_and_one_beyond_the_context_is_named(llama):
    ids = [[5] * 10, [6] * 50, [7] * 12]
    batches = dev_batches(ids, ids, max_tokens=30, special=llama.special, objective="causal_lm",
                          max_positions=llama.max_positions)
    widths = sorted(b[1].shape for b in batches)
    assert (1, 50) in widths and sum(b[1].shape[0] for b in batches) == 3  # the long one alone, none lost
    assert head_confidence(llama, batches)["confidence"].notna().all()
    too_long = [[5] * 10, [6] * 64, [7] * 65]
    with pytest.raises(TextTooLong, match=r"text 2 has 65 tokens.*at most 64.*split it into parts of at most 64"):
        dev_batches(too_long, too_long, special=llama.special, objective="causal_lm", max_positions=64)
    with pytest.raises(TextTooLong, match=r"source 1 has 70 tokens, 71 positions"):
        check_lengths([[4], [4] * 70], [[4], [4]], 64, "translation")
    unchecked = dev_batches(too_long, too_long, max_tokens=100, special=llama.special, objective="causal_lm")
    with pytest.raises(TextTooLong, match=r"65 positions long \(row 0: 65 tokens\).*at most 64"):
        head_confidence(llama, [b for b in unchecked if b[1].shape[1] == 65])


def test_role_batches_hold_a_document_alone_and_sentences_by_the_batch_size():
    assert _role_batches([10] * 70, 32) == [(0, 32), (32, 64), (64, 70)]
    assert _role_batches([10, 3000, 5, 2000, 2000], 32) == [(0, 1), (1, 2), (2, 4), (4, 5)]


def test_role_statistics_name_the_texts_too_long_for_the_model(llama):
    messages = []
    text_statistics(llama, PieceSegmenter(), ["a b c", "w " * 70], Counter(), lowercase=False, log=messages.append)
    assert any("text 1: 70 pieces" in m and "at most 63 pieces" in m for m in messages)
