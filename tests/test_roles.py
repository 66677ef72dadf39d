"""Head roles on synthetic attention maps with known answers (headcount.roles)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from fakes import PieceSegmenter

from headcount.analysis.roles.alignment import align_pieces, sentence_tokens, word_attention
from headcount.analysis.roles.collect import encoder_head_statistics
from headcount.analysis.roles.registry import assign_roles
from headcount.analysis.roles.statistics import (
    PositionalStats,
    RareStats,
    SyntacticStats,
    count_words,
    frequency_words,
    relation_pairs,
    source_lengths,
    syntactic_table,
)
from headcount.data.parses import COLUMNS
from headcount.data.subwords import EOS_ID
from headcount.models.transformer import ModelConfig, Transformer

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------------
# Helpers


def parse_table(sentences: list[list[tuple]]) -> pd.DataFrame:
    """Sentences as lists of (form, head, relation[, token]) -> a parse table; token = word index
    unless given."""
    rows = []
    for s, words in enumerate(sentences):
        text = " ".join(w[0] for w in words)
        for i, w in enumerate(words, start=1):
            form, head, rel = w[:3]
            token = w[3] if len(w) > 3 else i
            rows.append({"sentence": s, "sent_id": str(s), "word": i, "token": token, "form": form,
                         "token_form": form, "upos": "X", "head": head, "deprel": rel, "relation": rel,
                         "text": text})
    return pd.DataFrame(rows, columns=COLUMNS)


def peaked_row(size: int, target: int, peak: float = 0.5) -> np.ndarray:
    """A probability row, flat but for `peak` extra mass on `target`."""
    row = np.full(size, (1.0 - peak) / size)
    row[target] += peak
    return row


# --------------------------------------------------------------------------------------------
# Pieces -> words


@pytest.mark.parametrize(
    "words, pieces, expected",
    [
        (["unbelievable", "story", "."], ["▁un", "believ", "able", "▁story", "."], [0, 0, 0, 1, 2]),
        # sentencepiece normalisation (NFKC: full-width letters) and a lowercased model input
        (["Ｆｏｏ", "Bar"], ["▁foo", "▁bar"], [0, 1]),
        # a lone word-start marker belongs to the word it opens
        (["x", "Über"], ["▁x", "▁", "Über"], [0, 1, 1]),
        # a piece with no matching character (<unk>) stays with the word before it
        (["a☃", "b"], ["▁a", "<unk>", "▁b"], [0, 0, 1]),
        # a piece straddling two words counts for the first
        (["do", "n't", "go"], ["▁don", "'", "t", "▁go"], [0, 1, 1, 2]),
    ],
)
def test_align_pieces(words, pieces, expected):
    assert align_pieces(words, pieces).tolist() == expected


def test_word_attention_sums_to_and_averages_from():
    # words "ab" (pieces 0, 1) and "c" (piece 2); EOS at 3; position 4 is padding.
    attn = np.array([
        [0.1, 0.2, 0.3, 0.4, 0.0],
        [0.3, 0.3, 0.2, 0.2, 0.0],
        [0.5, 0.1, 0.1, 0.3, 0.0],
        [0.25, 0.25, 0.25, 0.25, 0.0],
        [9.0, 9.0, 9.0, 9.0, 9.0],  # padding row: must not count
    ])
    attn[:3, 4] = 0.5  # junk on the padding key: must not count either
    expected = np.array([
        [(0.3 + 0.6) / 2, (0.3 + 0.2) / 2, (0.4 + 0.2) / 2],  # from "ab": mean of rows 0 and 1
        [0.6, 0.1, 0.3],
        [0.5, 0.25, 0.25],
    ])
    out = word_attention(torch.tensor(attn)[None, None].repeat(2, 3, 1, 1), [0, 0, 1], 2)
    assert out.shape == (2, 3, 3, 3)
    np.testing.assert_allclose(out[1, 2], expected)
    np.testing.assert_allclose(word_attention(attn, [0, 0, 1], 2), expected)


def test_word_attention_sum_beats_a_larger_single_piece():
    """"c" gets 0.4 spread over two pieces; "ab" has the largest single piece (0.3)."""
    attn = np.array([
        [0.3, 0.1, 0.2, 0.2, 0.2],
        [0.0, 0.3, 0.2, 0.2, 0.3],
        [0.3, 0.1, 0.2, 0.2, 0.2],
        [0.3, 0.1, 0.2, 0.2, 0.2],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ])  # pieces: a b | c1 c2 | EOS
    out = word_attention(attn, [0, 0, 1, 1], 2)
    np.testing.assert_allclose(out[0], [(0.4 + 0.3) / 2, (0.4 + 0.4) / 2, (0.2 + 0.3) / 2])
    assert np.argmax(out[0, :2]) == 1


def test_word_without_pieces_has_nan_row_and_zero_column():
    attn = np.full((3, 3), 1 / 3)
    out = word_attention(attn, [0, 2], 3)  # word 1 got no piece
    assert np.isnan(out[1]).all()
    np.testing.assert_allclose(out[[0, 2, 3]][:, 1], 0.0)
    np.testing.assert_allclose(out[0], [1 / 3, 0, 1 / 3, 1 / 3])


# --------------------------------------------------------------------------------------------
# Positional heads


def positional_batch(lengths: list[int]):
    """(L=1, B, H=2, S, S) maps. Head 0: EOS gets 0.6, +1 gets the best remaining 0.3 (the last real
    token: -1); EOS rows point to -3; padding columns/rows carry large junk. Head 1: uniform."""
    S = max(lengths)
    probs = np.zeros((1, len(lengths), 2, S, S))
    for b, n in enumerate(lengths):
        eos = n - 1
        for i in range(n):
            row = np.full(n, 0.1 / n)
            if i == eos:
                row[max(i - 3, 0)] += 0.5
            else:
                row[eos] += 0.6
                row[i + 1 if i + 1 < eos else i - 1] += 0.3
            probs[0, b, 0, i, :n] = row
            probs[0, b, 1, i, :n] = 1.0 / n
        probs[0, b, 0, :n, n:] = 0.95  # padding keys: would win every argmax if counted
        probs[0, b, :, n:, :] = 0.5
        for i in range(n, S):  # padding queries: would add +1 hits if counted
            probs[0, b, 0, i, min(i + 1, S - 1)] = 1.0
    return torch.tensor(probs, dtype=torch.float32)


def test_positional_head_with_eos_and_padding_excluded():
    lengths = [12, 15, 20]
    stats = PositionalStats()
    stats.update(positional_batch(lengths), torch.tensor(lengths))
    table = stats.table().set_index("head")
    queries = sum(n - 1 for n in lengths)  # EOS rows and padding are not queries
    assert table.loc[0, "n_queries"] == queries == 44
    assert table.loc[0, "offset"] == 1
    # +1 is right wherever it has a valid key (not on the last real token, whose +1 is EOS)
    assert table.loc[0, "fraction"] == 1.0
    assert table.loc[0, "n_valid"] == sum(n - 2 for n in lengths)
    assert table.loc[0, "fraction_paper"] == pytest.approx(sum(n - 2 for n in lengths) / queries)  # 41/44
    assert table.loc[0, "second_offset"] == -1
    assert table.loc[0, "second_fraction"] == pytest.approx(len(lengths) / sum(n - 2 for n in lengths))
    # uniform head: the first-maximum rule gives key 0 always, offset -i: 3 queries for each offset
    # 0..-10; the first of them, -10, has a valid key for 1 + 4 + 9 queries
    assert table.loc[1, "offset"] == -10
    assert table.loc[1, "fraction"] == pytest.approx(3 / 14)
    assert table.loc[1, "fraction_paper"] == pytest.approx(3 / queries)


def planted_offset_maps(lengths: list[int], offsets: list[int], right: float = 1.0, seed: int = 0):
    """(L=1, B, H, S, S) maps, one head per offset k: each query puts 0.5 on EOS and 0.4 on q + k
    where that is a real token, else on itself; with `right` < 1 a random share of the queries
    that have q + k puts it on a random other real token instead. Padding keys carry junk. Also the
    expected share, counted directly."""
    rng = np.random.default_rng(seed)
    S = max(lengths) + 1
    probs = np.zeros((1, len(lengths), len(offsets), S, S))
    hits = np.zeros(len(offsets))
    valid = np.zeros(len(offsets))
    for b, n in enumerate(lengths):  # n real tokens, EOS at n
        for h, k in enumerate(offsets):
            can = [q for q in range(n) if 0 <= q + k < n]
            wrong = set(rng.choice(can, size=round(len(can) * (1 - right)), replace=False).tolist()) if can else set()
            for q in range(n):
                target = q + k if 0 <= q + k < n else q
                if q in wrong:
                    target = int(rng.choice([t for t in range(n) if t != q + k]))
                probs[0, b, h, q, :n + 1] = 0.1 / (n + 1)
                probs[0, b, h, q, n] += 0.5
                probs[0, b, h, q, target] += 0.4
                if 0 <= q + k < n:
                    valid[h] += 1
                    hits[h] += target == q + k
            probs[0, b, h, :n, n + 1:] = 0.9  # padding keys
    return torch.tensor(probs, dtype=torch.float32), hits / valid


@pytest.mark.parametrize("lengths, offsets", [([3], [-1, 1]), ([30], [-1, 1, -2]), ([3, 30, 9], [-1, 1, -2])])
def test_a_perfect_plus_minus_k_head_scores_one_at_any_length(lengths, offsets):
    probs, expected = planted_offset_maps(lengths, offsets)
    stats = PositionalStats()
    stats.update(probs, [n + 1 for n in lengths])
    table = stats.table()
    assert table["offset"].tolist() == offsets
    assert table["fraction"].tolist() == [1.0] * len(offsets) == expected.tolist()
    # the paper's reading (every query counts) misses the edges: 1 - 1/n for a +-1 head
    assert table["fraction_paper"].iloc[0] == pytest.approx(sum(n - 1 for n in lengths) / sum(lengths))


def test_a_head_right_80_percent_of_the_time_scores_0_8():
    lengths = [11, 31, 6]  # 10 + 30 + 5 queries have a valid -1 key and 10 + 30 + 5 a valid +1 key
    probs, expected = planted_offset_maps(lengths, [-1, 1], right=0.8, seed=3)
    stats = PositionalStats()
    stats.update(probs, [n + 1 for n in lengths])
    table = stats.table()
    assert table["offset"].tolist() == [-1, 1]
    assert table["fraction"].tolist() == pytest.approx([0.8, 0.8])
    assert expected.tolist() == pytest.approx([0.8, 0.8])  # the planted maps, counted directly


def test_piece_kinds_show_a_head_that_joins_subwords_where_the_pooled_share_does_not():
    """Head 0 attends from each continuation piece to the piece before it and from each word-initial
    piece to itself: pooled it is no positional head, per kind it is exact at both."""
    from headcount.analysis.roles.registry import PIECE_KINDS
    from headcount.analysis.roles.statistics import piece_kind_masks, with_piece_kinds

    sentences = [["\u2581a", "b", "\u2581c", "\u2581d", "e", "f"], ["\u2581g", "h", "\u2581i"], ["\u2581j"]]
    S = max(map(len, sentences)) + 1
    probs = np.zeros((1, len(sentences), 1, S, S))
    for b, pieces in enumerate(sentences):
        n = len(pieces)  # EOS at n, padding after
        for q, piece in enumerate(pieces):
            probs[0, b, 0, q, :n + 1] = 0.1 / (n + 1)
            probs[0, b, 0, q, n] += 0.5  # EOS: excluded from the argmax
            probs[0, b, 0, q, q if piece.startswith("\u2581") else q - 1] += 0.4
        probs[0, b, 0, :n, n + 1:] = 0.9  # padding keys
    probs = torch.tensor(probs, dtype=torch.float32)
    lengths = [len(p) + 1 for p in sentences]
    masks = piece_kind_masks(sentences, S)
    assert masks["continuation"].tolist()[1] == [False, True, False, False, False, False, False]
    assert masks["initial"].tolist()[1] == [True, False, True, False, False, False, False]
    pooled, by_kind = PositionalStats(), {kind: PositionalStats() for kind in PIECE_KINDS}
    pooled.update(probs, lengths)
    for kind in PIECE_KINDS:
        by_kind[kind].update(probs, lengths, masks[kind])
    row = with_piece_kinds(pooled.table(), by_kind).iloc[0]
    assert (row["offset"], row["fraction"]) == (0, pytest.approx(6 / 10))  # 6 initial of 10 pieces
    assert (row["continuation_offset"], row["continuation_fraction"], row["continuation_queries"]) == (-1, 1.0, 4)
    assert (row["initial_offset"], row["initial_fraction"], row["initial_queries"]) == (0, 1.0, 6)
    # Validity counted per query of the kind: +1 has a key from b, e and h, not from f (EOS follows).
    continuation = by_kind["continuation"]
    assert continuation.valid[continuation.radius + 1] == 3 and continuation.valid[continuation.radius - 1] == 4


def test_a_language_tag_is_neither_kind_of_piece_nor_part_of_a_word():
    """A multilingual tokenizer's leading tag (SPECIAL_PIECE) belongs to no word and no piece kind."""
    from headcount.analysis.roles.alignment import align_pieces
    from headcount.analysis.roles.statistics import piece_kind_masks
    from headcount.data.special import SPECIAL_PIECE

    pieces = [SPECIAL_PIECE, "\u2581a", "b", "\u2581cd"]
    masks = piece_kind_masks([pieces], 5)
    assert masks["initial"].tolist() == [[False, True, False, True, False]]
    assert masks["continuation"].tolist() == [[False, False, True, False, False]]
    assert align_pieces(["ab", "cd"], pieces).tolist() == [-1, 0, 0, 1]
    assert align_pieces(["ab", "cd"], pieces[1:]).tolist() == [0, 0, 1]


def test_positional_accepts_layer_list_and_merges_batches_of_different_size():
    lengths = [12, 15, 20]
    probs = positional_batch(lengths)
    one = PositionalStats()
    one.update([probs[0]], lengths)  # list of per-layer (B, H, S, S)
    two = PositionalStats()
    two.update(probs[:, :1, :, :12, :12], lengths[:1])
    two.update(probs[:, 1:], lengths[1:])
    pd.testing.assert_frame_equal(one.table(), two.table())
    np.testing.assert_array_equal(one.counts, two.counts)


def test_source_lengths_counts_eos_not_padding():
    src = torch.tensor([[5, 6, EOS_ID, 0], [7, EOS_ID, 0, 0]])
    assert source_lengths(src, 0).tolist() == [3, 2]


# --------------------------------------------------------------------------------------------
# Syntactic heads


def test_relation_pairs_use_tokens_and_drop_arcs_inside_a_token():
    # "It wasn't taken": was(2) and n't(3) share token 2; n't -> was is advmod inside the token.
    table = parse_table([[("It", 4, "nsubj", 1), ("was", 4, "aux", 2), ("n't", 2, "advmod", 2),
                          ("taken", 0, "root", 3)]])
    pairs = relation_pairs(table)
    assert pairs == [("nsubj", "head->dep", 2, 0), ("nsubj", "dep->head", 0, 2)]
    assert sentence_tokens(table) == ["It", "was", "taken"]


def test_syntactic_accuracy_baseline_and_eos():
    """Three sentences with verb -> subject offsets -1, -1, +2: baseline offset -1 at 2/3.

    Head 0 puts most weight on EOS and the next most on the subject (correct only if EOS is left out);
    head 1 attends to the word before the verb (the baseline); head 2 puts the most on EOS and the
    next most on a wrong word."""
    sentences = [
        ([("the", 2, "det"), ("dog", 3, "nsubj"), ("barks", 0, "root"), ("loud", 3, "advmod")], 2, 1, 3),
        ([("a", 2, "det"), ("cat", 3, "nsubj"), ("sleeps", 0, "root"), ("now", 3, "advmod")], 2, 1, 0),
        ([("here", 2, "advmod"), ("sleeps", 0, "root"), ("the", 4, "det"), ("cat", 2, "nsubj")], 1, 3, 0),
    ]
    stats = SyntacticStats()
    for words, verb, subj, wrong in sentences:
        table = parse_table([words])
        W = len(words)
        maps = np.tile(np.full((W + 1, W + 1), 1.0 / (W + 1)), (1, 3, 1, 1))
        maps[0, 0, verb] = peaked_row(W + 1, W, 0.6)
        maps[0, 0, verb, subj] += 0.2
        maps[0, 1, verb] = peaked_row(W + 1, verb - 1, 0.5)
        maps[0, 2, verb] = peaked_row(W + 1, W, 0.6)
        maps[0, 2, verb, wrong] += 0.2
        stats.update(maps, relation_pairs(table))
    syn = stats.table()
    v_s = syn[(syn["relation"] == "nsubj") & (syn["direction"] == "head->dep")].set_index("head")
    assert (v_s["name"] == "v->s").all()
    assert (v_s["n"] == 3).all()
    assert v_s.loc[0, "accuracy"] == pytest.approx(1.0)
    assert v_s.loc[1, "accuracy"] == pytest.approx(2 / 3)
    assert v_s.loc[2, "accuracy"] == pytest.approx(0.0)
    assert v_s.loc[0, "baseline_offset"] == -1
    assert v_s.loc[0, "baseline_accuracy"] == pytest.approx(2 / 3)
    # advmod adv->v: offsets -1, -1, +1 -> baseline 2/3; obj never occurs
    adv_v = syn[(syn["relation"] == "advmod") & (syn["direction"] == "dep->head")]
    assert adv_v["baseline_accuracy"].iloc[0] == pytest.approx(2 / 3)
    assert syn[syn["relation"] == "obj"]["n"].eq(0).all()

    table1 = syntactic_table(syn).set_index(["relation", "direction"])
    assert len(table1) == 8
    assert table1.loc[("nsubj", "head->dep"), "best_head"] == 0
    assert table1.loc[("nsubj", "head->dep"), "best_accuracy"] == pytest.approx(1.0)
    assert table1.loc[("nsubj", "head->dep"), "baseline_accuracy"] == pytest.approx(2 / 3)


def test_a_verb_with_two_adverbs_is_one_instance_with_two_answers():
    """"soon go now" (adverbs at -1 and +1) and "go now" (+1): always answering +1 is right twice."""
    stats = SyntacticStats()
    table = parse_table([[("soon", 2, "advmod"), ("go", 0, "root"), ("now", 2, "advmod")]])
    maps = np.full((1, 2, 4, 4), 0.25)
    maps[0, 0, 1] = peaked_row(4, 2)  # "go" -> "now"
    maps[0, 1, 1] = peaked_row(4, 1)  # "go" -> itself
    stats.update(maps, relation_pairs(table))
    table = parse_table([[("go", 0, "root"), ("now", 1, "advmod")]])
    maps = np.full((1, 2, 3, 3), 1 / 3)
    maps[0, :, 0] = peaked_row(3, 1)  # both heads: "go" -> "now"
    stats.update(maps, relation_pairs(table))
    v_adv = stats.table().query("relation == 'advmod' and direction == 'head->dep'").set_index("head")
    assert v_adv["n"].tolist() == [2, 2]
    assert v_adv["accuracy"].tolist() == [1.0, 0.5]
    assert v_adv.loc[0, "baseline_offset"] == 1
    assert v_adv.loc[0, "baseline_accuracy"] == 1.0


# --------------------------------------------------------------------------------------------
# Rare-token heads


def frequencies() -> Counter:
    """600 common words c0..c599 (c0 most frequent) and rare words r1..r50 (r_k seen k times)."""
    freq = Counter({f"c{i}": 10_000 - i for i in range(600)})
    freq.update({f"r{k}": k for k in range(1, 51)})
    return freq


def test_rare_head_uses_mean_over_queries_and_excludes_eos():
    """Words: c0 c1 r7 c2 r3 (r3 rarest, r7 second). Head 0: 4 of 5 rows peak on c1 a little, one row on
    r3 a lot: the mean points to r3 (the EOS row, all on c1, would tip it back if it counted).
    Head 1: EOS takes most, r7 the next: one of the two rarest."""
    words = ["c0", "c1", "r7", "c2", "r3"]
    W = len(words)
    maps = np.full((1, 2, W + 1, W + 1), 1.0 / (W + 1))
    for q in (0, 1, 2, 3):
        maps[0, 0, q] = peaked_row(W + 1, 1, 0.1)
    maps[0, 0, 4] = peaked_row(W + 1, 4, 0.95)
    maps[0, 0, W] = np.eye(W + 1)[1]
    for q in range(W + 1):
        maps[0, 1, q] = peaked_row(W + 1, W, 0.7)
        maps[0, 1, q, 2] += 0.1
    # per-query majority would say c1 for head 0:
    assert np.bincount(maps[0, 0, :W, :W].argmax(-1)).argmax() == 1
    stats = RareStats(frequencies(), top_k=500, lowercase=False)
    assert stats.update(maps, words)
    table = stats.table().set_index("head")
    assert table.loc[0, "rate_rarest"] == 1.0 and table.loc[0, "rate_two_rarest"] == 1.0
    assert table.loc[1, "rate_rarest"] == 0.0 and table.loc[1, "rate_two_rarest"] == 1.0


def test_uniform_reference_points_at_the_word_with_most_pieces():
    """Uniform subword attention summed per word favours words split into many pieces."""
    words = ["c0", "r9", "c1", "r2"]  # r2 rarest, r9 second
    stats = RareStats(frequencies(), lowercase=False)
    flat = np.full((1, 1, 5, 5), 0.2)
    stats.update(flat, words, pieces_per_word=[1, 3, 1, 2])  # r9 has most pieces: two-rarest hit only
    stats.update(flat, words, pieces_per_word=[1, 1, 4, 2])  # c1: no hit
    table = stats.table()
    assert table["uniform_rate_rarest"].iloc[0] == 0.0
    assert table["uniform_rate_two_rarest"].iloc[0] == 0.5
    # Tied for the most pieces (r9, c1, r2: two of them among the two rarest): 2/3 of a hit.
    stats.update(flat, words, pieces_per_word=[1, 2, 2, 2])
    assert stats.table()["uniform_rate_two_rarest"].iloc[0] == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert stats.table()["uniform_rate_rarest"].iloc[0] == pytest.approx((0 + 0 + 1 / 3) / 3)


def test_rare_eligibility():
    stats = RareStats(frequencies(), top_k=500, lowercase=True)
    flat = np.full((1, 1, 5, 5), 0.2)
    assert not stats.update(flat, ["c0", "c1", "c2", "c499"])  # rarest is a top-500 word
    assert stats.update(flat, ["C0", "C1", "c2", "c500"])  # c500 is not; lowercased lookup
    assert not stats.update(np.full((1, 1, 3, 3), 1 / 3), ["c0", "r1"])  # fewer than 3 words
    assert stats.n_sentences == 1 and stats.n_seen == 3


def test_count_words_uses_the_parse_tokenizer():
    assert count_words(["Don't stop.", "don't"], lowercase=True) == Counter({"do": 2, "n't": 2, "stop": 1, ".": 1})


def test_every_analysed_word_of_a_counted_line_is_in_the_table():
    lines = ["It's a U.S. thing -- didn't he say... \"Don't\"?", "the cat's 15-year-old toy, isn't it?"]
    counts = count_words(lines, lowercase=True)
    for line in lines:
        assert all(counts[w] > 0 for w in frequency_words(line, lowercase=True))


def test_a_common_multi_part_token_is_not_rare():
    """Tokens "didn't", "It's", "--" (as a treebank or spaCy has them) are split as the counts were:
    common words, not unseen ones (frequency 0 made them the rarest word of their sentence)."""
    training = ["It's the dog, didn't it -- yes"] * 100 + ["go home"] * 20 + ["the aardvark"]
    stats = RareStats(count_words(training), top_k=10, lowercase=True)
    assert stats.frequency("didn't") == 100 and stats.frequency("It's") == 100 and stats.frequency("--") == 200
    assert stats.frequency("go") == 20 and stats.frequency("aardvark") == 1 and stats.frequency("okapi") == 0
    words = ["It's", "the", "dog", "didn't", "--"]
    W = len(words)
    assert not stats.update(np.full((1, 3, W + 1, W + 1), 1 / (W + 1)), words)  # every word is common
    # with rare words the sentence is eligible (aardvark rarest, go second); "didn't" is neither
    words = ["the", "dog", "didn't", "go", "aardvark"]
    W = len(words)
    maps = np.full((1, 3, W + 1, W + 1), 1 / (W + 1))
    for head, target in enumerate((2, 3, 4)):  # heads point at "didn't", "go", "aardvark"
        maps[0, head] = peaked_row(W + 1, target, 0.5)
    assert stats.update(maps, words)
    table = stats.table().set_index("head")
    assert table["rate_rarest"].tolist() == [0.0, 0.0, 1.0]
    assert table["rate_two_rarest"].tolist() == [0.0, 1.0, 1.0]
    assert stats.n_sentences == 1


# --------------------------------------------------------------------------------------------
# All roles together: one synthetic corpus with four heads of known function


def synthetic_corpus(seed: int = 0, n_sentences: int = 60):
    """Sentences of 10-14 words, one piece per word: "c0" first, a verb and a subject at random
    places, one or two rare words elsewhere, common fillers. Heads (L=1, H=4):
    0 attends to the previous token, 1 from the verb to its subject (random elsewhere),
    2 to the rarest word, 3 uniform. Returns the parse table and padded (1, B, 4, S, S) maps."""
    rng = np.random.default_rng(seed)
    freq = frequencies()
    sentences, maps, rows = [], [], []
    for _ in range(n_sentences):
        W = int(rng.integers(10, 15))
        verb, subj = rng.choice(np.arange(1, W), size=2, replace=False)
        others = [p for p in range(1, W) if p not in (verb, subj)]
        rare_pos = rng.choice(others, size=int(rng.integers(1, 3)), replace=False)
        forms = ["c0"] + [f"c{int(rng.integers(1, 100))}" for _ in range(W - 1)]
        for p in rare_pos:
            forms[p] = f"r{int(rng.integers(1, 51))}"
        rarest = min(range(W), key=lambda p: (freq[forms[p]], p))
        words = [(forms[p], 0 if p == verb else verb + 1, "root" if p == verb else "nsubj" if p == subj else "dep")
                 for p in range(W)]
        sentences.append(words)
        rows.append((verb, subj))
        n = W + 1  # pieces + EOS
        m = np.zeros((4, n, n))
        for i in range(n):
            m[0, i] = peaked_row(n, max(i - 1, 0), 0.5)
            m[1, i] = rng.dirichlet(np.ones(n))
            m[2, i] = peaked_row(n, rarest, 0.5)
            m[3, i] = 1.0 / n
        m[1, verb] = peaked_row(n, subj, 0.5)
        maps.append(m)
    S = max(m.shape[-1] for m in maps)
    probs = np.zeros((1, len(maps), 4, S, S))
    for b, m in enumerate(maps):
        probs[0, b, :, : m.shape[1], : m.shape[1]] = m
        probs[0, b, :, m.shape[1]:, :] = 0.7  # padding rows: junk
    return parse_table(sentences), torch.tensor(probs, dtype=torch.float32), rows, freq


def test_assign_roles_on_synthetic_heads():
    table, probs, verb_subj, freq = synthetic_corpus()
    sentences = [s for _, s in table.groupby("sentence")]
    lengths = [len(s) + 1 for s in sentences]
    positional, syntactic, rare = PositionalStats(), SyntacticStats(), RareStats(freq, lowercase=False)
    positional.update(probs, lengths)
    for b, sentence in enumerate(sentences):
        words = sentence_tokens(sentence)
        pieces = ["▁" + w for w in words]
        wa = word_attention(probs[:, b], align_pieces(words, pieces), len(words))
        syntactic.update(wa, relation_pairs(sentence))
        rare.update(wa, words)
    pos, syn, rar = positional.table(), syntactic.table(), rare.table()

    # known answers, computed from the construction
    assert pos.loc[0, "offset"] == -1
    assert pos.loc[0, "fraction"] == 1.0
    assert pos.loc[0, "fraction_paper"] == pytest.approx(sum(n - 2 for n in lengths) / sum(n - 1 for n in lengths))
    offsets = Counter(int(s - v) for v, s in verb_subj)
    baseline = max(offsets.values()) / len(verb_subj)
    v_s = syn.query("relation == 'nsubj' and direction == 'head->dep'").set_index("head")
    assert v_s.loc[1, "accuracy"] == 1.0
    assert v_s.loc[1, "baseline_accuracy"] == pytest.approx(baseline)
    assert baseline < 0.5
    assert rar.loc[2, "rate_rarest"] == 1.0
    assert rar["n_sentences"].iloc[0] == 60

    roles = assign_roles(pos, syn, rar).set_index("head")
    assert roles["role"].tolist() == ["positional", "syntactic", "rare", "none"]
    assert roles.loc[0, "positional_offset"] == -1
    assert roles.loc[0, "statistic"] == pytest.approx(pos.loc[0, "fraction"])
    assert (roles.loc[1, "syntactic_relation"], roles.loc[1, "syntactic_name"]) == ("nsubj", "v->s")
    assert roles.loc[1, "statistic"] == pytest.approx(1.0 - baseline)
    assert roles.loc[2, "statistic"] == 1.0
    assert not roles.loc[3, ["is_positional", "is_syntactic", "is_rare"]].any()


def test_role_precedence_and_thresholds():
    positional = pd.DataFrame({"layer": 0, "head": [0, 1, 2, 3], "offset": [-1, 1, 1, 0],
                               "fraction": [0.95, 0.90, 0.89, 0.2]})
    syntactic = pd.DataFrame({"relation": "amod", "direction": "head->dep", "name": "noun->adj", "layer": 0,
                              "head": [0, 1, 2, 3], "accuracy": [0.5, 0.85, 0.60, 0.7], "n": [100, 100, 100, 5],
                              "baseline_offset": -1, "baseline_accuracy": 0.5})
    rare = pd.DataFrame({"layer": 0, "head": [0, 1, 2, 3], "rate_rarest": 0.4,
                         "rate_two_rarest": [0.51, 0.2, 0.5, 0.9], "n_sentences": 100})
    roles = assign_roles(positional, syntactic, rare).set_index("head")
    # head 0: positional and rare -> rare; head 1: positional (0.90 counts) and syntactic (+35) -> syntactic;
    # head 2: 0.89, +10 points exactly, rate 0.5 (not > 0.5) -> syntactic; head 3: too few instances -> rare
    assert roles["role"].tolist() == ["rare", "syntactic", "syntactic", "rare"]
    assert roles["is_positional"].tolist() == [True, True, False, False]
    assert roles["is_syntactic"].tolist() == [False, True, True, False]
    assert roles["is_rare"].tolist() == [True, False, False, True]
    assert roles.loc[2, "statistic"] == pytest.approx(0.10)
    other = assign_roles(positional, syntactic, rare, precedence=("positional", "syntactic", "rare"))
    assert other["role"].tolist() == ["positional", "positional", "syntactic", "rare"]
    # with the optional margin over the uniform reference, head 0 (0.51 vs 0.45 + 0.1) is not rare
    rare["uniform_rate_two_rarest"] = 0.45
    strict = assign_roles(positional, syntactic, rare, rare_margin=0.1)
    assert strict["is_rare"].tolist() == [False, False, False, True]
    assert strict["role"].tolist() == ["positional", "syntactic", "syntactic", "rare"]
    # the paper's reading (plain > 50%) is kept beside the project's
    assert strict["is_rare_paper"].tolist() == [True, False, False, True]
    assert strict["role_paper"].tolist() == ["rare", "syntactic", "syntactic", "rare"]


def test_positional_paper_reading_beside_the_edge_corrected_share():
    positional = pd.DataFrame({"layer": 0, "head": [0, 1, 2], "offset": [-1, 1, 0],
                               "fraction": [1.0, 0.92, 0.5], "fraction_paper": [0.89, 0.85, 0.5]})
    roles = assign_roles(positional, SyntacticStats().table(), RareStats(Counter()).table())
    assert roles["is_positional"].tolist() == [True, True, False]
    assert roles["is_positional_paper"].tolist() == [False, False, False]
    assert roles["role"].tolist() == ["positional", "positional", "none"]
    assert roles["role_paper"].tolist() == ["none", "none", "none"]
    assert roles["statistic"].iloc[0] == 1.0
    paper = assign_roles(positional, SyntacticStats().table(), RareStats(Counter()).table(), positional_share="all",
                         positional_threshold=0.85)
    assert paper["role"].tolist() == ["positional", "positional", "none"]
    assert paper["statistic"].tolist()[:2] == [0.89, 0.85]


def test_assign_roles_with_positional_statistics_only():
    """Decoder attention has no word-level statistics: every head is positional or none."""
    positional = pd.DataFrame({"layer": 0, "head": [0, 1], "offset": [0, -1], "fraction": [0.99, 0.5]})
    roles = assign_roles(positional, SyntacticStats().table(), RareStats(Counter()).table())
    assert roles["role"].tolist() == ["positional", "none"]
    assert roles["statistic"].iloc[0] == pytest.approx(0.99) and np.isnan(roles["statistic"].iloc[1])


def test_a_role_registered_once_reaches_every_table_and_figure(monkeypatch, tmp_path):
    """A new role is one Role in the registry: assign_roles flags and assigns it, the pruning
    table counts it and Figure 8 and the function map draw it."""
    from headcount.analysis.roles import registry as roles
    from headcount.report import plots
    from headcount.report.pruning_report import _role_counts

    diffuse = roles.Role("diffuse", "diffuse", "#000000", 3,
                         lambda stats, rules: stats["positional"][["layer", "head", "fraction"]].rename(
                             columns={"fraction": "diffuse_share"}),
                         lambda table, rules: table["diffuse_share"] < 0.3, lambda rules: "diffuse_share")
    monkeypatch.setitem(roles.ROLES, "diffuse", diffuse)
    positional = pd.DataFrame({"layer": 0, "head": [0, 1, 2], "offset": [-1, 1, 0], "fraction": [0.95, 0.2, 0.5]})
    rare = pd.DataFrame({"layer": 0, "head": [0, 1, 2], "rate_rarest": 0.4, "rate_two_rarest": [0.9, 0.1, 0.1],
                         "n_sentences": 100})
    table = assign_roles(positional, SyntacticStats().table(), rare)
    assert table["role"].tolist() == ["rare", "diffuse", "none"]
    assert table["is_diffuse"].tolist() == [False, True, False]
    assert table["statistic"].tolist()[1] == 0.2 and "diffuse_share" in table
    assert roles.role_names() == ["positional", "syntactic", "rare", "diffuse", "none"]
    role_of = {(r.layer, r.head): r.role for r in table.itertuples()}
    counts = _role_counts([(0, 0), (0, 1), (0, 2)], role_of)
    assert counts == {"role_positional": 0, "role_syntactic": 0, "role_rare": 1, "role_diffuse": 1, "role_none": 1}
    runs = pd.DataFrame([{"setting": "enc", "lam": lam, "retained_enc_self": 3, **counts} for lam in (0.5, 1, 2, 4)])
    legends = []
    monkeypatch.setattr(plots, "save", lambda fig, path: legends.append(
        [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]))
    plots.retained_functions(runs, tmp_path / "figure8.png", "functions")
    plots.head_function_map(table, None, tmp_path / "map.png", "roles")
    assert legends == [["positional", "syntactic", "rare tokens", "diffuse", "other"]] * 2


# --------------------------------------------------------------------------------------------
# Driver: a real (tiny, random) model, batching must not change the statistics



@pytest.mark.slow
def test_encoder_head_statistics_is_batch_invariant():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab=64, tgt_vocab=64, d_model=16, n_heads=2, d_ff=32, enc_layers=2,
                                    dec_layers=1, max_len=64))
    table, _, _, freq = synthetic_corpus(seed=1, n_sentences=12)
    table["token_form"] = table["form"] = table["form"].str.replace("c", "Word", regex=False)
    table["text"] = table.groupby("sentence")["form"].transform(" ".join)
    segmenter = PieceSegmenter()
    one = encoder_head_statistics(model, segmenter, table, freq, lowercase=True, batch_size=1, log=lambda _: None)
    five = encoder_head_statistics(model, segmenter, table, freq, lowercase=True, batch_size=5, log=lambda _: None)
    n_pieces = sum(len(segmenter.pieces(t.lower())) for t in table.groupby("sentence")["text"].first())
    assert one["positional"]["n_queries"].eq(n_pieces).all()
    assert len(one["positional"]) == 4 and len(one["rare"]) == 4 and len(one["table1"]) == 8
    assert one["syntactic"].query("relation == 'nsubj'")["n"].eq(12).all()
    for key in ("positional", "syntactic", "rare"):
        pd.testing.assert_frame_equal(one[key], five[key], check_exact=False)


def test_positional_and_rare_come_from_the_given_text_and_long_parsed_sentences_are_left_out():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab=64, tgt_vocab=64, d_model=16, n_heads=2, d_ff=32, enc_layers=1,
                                    dec_layers=1, max_len=64))
    table, _, _, freq = synthetic_corpus(seed=2, n_sentences=6)
    texts = ["c1 c2 r5 c3", "c4 r9 c5 c6 c7 r2"]  # the analysis set: 4 + 6 pieces
    segmenter = PieceSegmenter()
    logs = []
    stats = encoder_head_statistics(model, segmenter, table, freq, lowercase=False, texts=texts, max_pieces=11,
                                    log=logs.append)
    assert stats["positional"]["n_queries"].eq(10).all()
    assert stats["rare"]["n_sentences"].eq(2).all()
    lengths = table.groupby("sentence").size()  # one piece per word
    assert stats["syntactic"].query("relation == 'nsubj'")["n"].eq((lengths <= 11).sum()).all()
    assert 0 < (lengths > 11).sum() < len(lengths)
    assert any(f"{(lengths > 11).sum()} longer than 11 subwords" in line for line in logs)


# --------------------------------------------------------------------------------------------
# The stage: which text and which parser each table comes from


@pytest.mark.slow
def test_find_head_roles_names_its_text_and_parser_and_cross_checks_on_gold_trees(tmp_path):
    import json

    from conftest import NOUNS, tiny_config, toy_conllu, toy_corpus

    from headcount.data.subwords import Segmenter, train_bpe
    from headcount.models.checkpoint import save_checkpoint
    from headcount.pipeline.role_finding import find_head_roles, parse_analysis_sentences

    (tmp_path / "train.txt").write_text("\n".join(toy_corpus(300, 1)[0]) + "\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text("\n".join(toy_corpus(30, 2)[0]) + "\n", encoding="utf-8")
    long_sentence = " ".join((NOUNS * 3)[:25]).capitalize() + "."  # longer than any training line
    (tmp_path / "tb.conllu").write_text(toy_conllu(toy_corpus(20, 3)[0] + [long_sentence]), encoding="utf-8")
    (tmp_path / "in_domain.conllu").write_text(toy_conllu(toy_corpus(30, 2)[0]), encoding="utf-8")
    train_bpe(tmp_path / "train.txt", tmp_path / "src.model", 60)
    torch.manual_seed(0)
    cfg = tiny_config(src_vocab=len(Segmenter(str(tmp_path / "src.model"))))
    save_checkpoint(tmp_path / "model.pt", {"model": Transformer(cfg).state_dict(), "model_config": cfg.to_dict()})
    settings = {"max_sentences": 100, "top_k": 5, "positional_threshold": 0.9, "positional_share": "valid",
                "syntactic_margin": 0.1, "rare_threshold": 0.5, "rare_margin": 0.1, "min_instances": 5}
    names = ("roles", "positional", "syntactic", "rare", "table1")

    def run(parses: str, info: str, reference=()):
        out = {name: str(tmp_path / f"{name}.csv") for name in names}
        out.update(table1_md=str(tmp_path / "table1.md"), function_map=str(tmp_path / "map.png"),
                   relative_positions=str(tmp_path / "positions.png"))
        logs = []
        find_head_roles(str(tmp_path / "model.pt"), str(tmp_path / "src.model"), parses, str(tmp_path / "train.txt"),
                        False, settings, out, analysis_src=str(tmp_path / "dev.txt"), analysis_sentences=20,
                        analysis_label="dev[:20] of toy", parses_info_path=info, reference_treebanks=reference,
                        log=logs.append)
        return {name: pd.read_csv(out[name]) for name in names}, (tmp_path / "table1.md").read_text(), logs

    # gold treebank text: the long sentence is left out, and every table says where it comes from
    parse_analysis_sentences("gold", [str(tmp_path / "tb.conllu")], None, None, "en", 100,
                             str(tmp_path / "gold.parquet"), info_path=str(tmp_path / "gold.json"))
    tables, markdown, logs = run(str(tmp_path / "gold.parquet"), str(tmp_path / "gold.json"))
    longest = max(len(x) for x in Segmenter(str(tmp_path / "src.model")).encode(toy_corpus(300, 1)[0]))
    assert any(f"20 of 21 parsed sentences (1 longer than {longest} subwords" in line for line in logs)
    for name in ("positional", "rare"):
        assert tables[name]["text"].eq("dev[:20] of toy").all() and tables[name]["parser"].str.startswith("none").all()
    assert tables["positional"]["n_queries"].iloc[0] == sum(
        len(x) for x in Segmenter(str(tmp_path / "src.model")).encode(toy_corpus(30, 2)[0][:20]))
    syntactic_text = f"treebanks tb.conllu, sentences of at most {longest} subwords (the longest training sentence)"
    for name in ("roles", "syntactic", "table1"):
        assert tables[name]["parser"].eq("gold treebank trees").all()
    assert tables["roles"]["syntactic_text"].eq(syntactic_text).all() and tables["syntactic"]["text"].eq(
        syntactic_text).all()
    assert markdown.startswith(f"Text: {syntactic_text}. Parser: gold treebank trees.\n")
    assert {"role_paper", "is_positional_paper", "is_rare_paper"} <= set(tables["roles"].columns)
    assert "is_syntactic_gold" not in tables["roles"].columns

    # in-domain parses (any parser) with the gold treebank as a cross-check beside them
    parse_analysis_sentences("gold", [str(tmp_path / "in_domain.conllu")], None, None, "en", 20,
                             str(tmp_path / "parsed.parquet"))
    (tmp_path / "parsed.json").write_text(json.dumps({"parser": "a parser 1.0", "text": "dev[:20] of toy",
                                                      "in_domain": True}), encoding="utf-8")
    tables, markdown, logs = run(str(tmp_path / "parsed.parquet"), str(tmp_path / "parsed.json"),
                                 [str(tmp_path / "tb.conllu")])
    roles, table1 = tables["roles"], tables["table1"]
    assert roles["parser"].eq("a parser 1.0").all() and roles["syntactic_text"].eq("dev[:20] of toy").all()
    assert roles["syntactic_text_gold"].eq(syntactic_text).all()
    assert {"is_syntactic_gold", "syntactic_margin_gold"} <= set(roles.columns)
    amod = table1[table1["relation"] == "amod"]
    assert (amod["n"] > 0).all() and (amod["n_gold"] > 0).all()
    assert "Parser: a parser 1.0." in markdown
    assert f"Cross-check: text: {syntactic_text}. Parser: gold trees." in markdown
