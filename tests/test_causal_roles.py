"""Head roles on causal (decoder-only) attention, and the induction and sink roles, on planted maps
with known answers (headcount.analysis.roles; tests/fakes.PlantedCausalLM)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from fakes import PieceSegmenter, PlantedCausalLM, bos_only, induction_target, previous_token
from test_roles import parse_table

from headcount.analysis.roles.alignment import sentence_tokens
from headcount.analysis.roles.collect import (
    _bos_last,
    _cls_into_sep,
    _role_attention,
    induction_statistics,
    syntactic_statistics,
    text_statistics,
)
from headcount.analysis.roles.registry import (
    INDUCTION_THRESHOLD,
    SINK_THRESHOLD,
    assign_roles,
    role_names,
    role_precedence,
)
from headcount.analysis.roles.statistics import (
    PositionalStats,
    SinkStats,
    SyntacticStats,
    relation_pairs,
    repeated_sequence_scores,
    repeated_sequences,
)

torch.set_num_threads(1)

TEXTS = ["the old dog saw a cat", "a cat ran", "we saw the big red dog and the cat", "go now"]


def quiet(_):
    pass


def planted_model(**kwargs) -> PlantedCausalLM:
    """Heads: 0 previous token, 1 induction (0.3 on BOS), 2 a pure sink (0.9 on BOS, the rest
    spread evenly), 3 previous token with 0.6 on BOS."""
    return PlantedCausalLM([previous_token, induction_target, bos_only, previous_token], [0.0, 0.3, 0.9, 0.6],
                           **kwargs)


# --------------------------------------------------------------------------------------------
# Layout: every kind's maps as pieces + sink + padding


def test_bos_goes_behind_each_rows_pieces_and_cls_joins_sep():
    # row 0: BOS + 2 pieces + 1 padding; row 1: BOS + 3 pieces. Entry = 10 * query + key.
    T = 4
    grid = torch.tensor([[10.0 * q + k for k in range(T)] for q in range(T)])
    moved = _bos_last(grid.expand(1, 2, 1, T, T), [2, 3])
    assert moved[0, 0, 0, :3, :3].tolist() == [[11, 12, 10], [21, 22, 20], [1, 2, 0]]  # BOS row/column at 2
    assert moved[0, 0, 0, 3].tolist() == [31, 32, 30, 33]  # padding stays last
    assert moved[0, 1, 0, 3].tolist() == [1, 2, 3, 0]
    # [CLS] a b [SEP] pad: the sink column holds [CLS] + [SEP]; [CLS]'s row goes
    S = 5
    grid = torch.tensor([[10.0 * q + k for k in range(S)] for q in range(S)])
    joined = _cls_into_sep(grid.expand(1, 1, 1, S, S), [2])
    assert joined[0, 0, 0, 0].tolist() == [11, 12, 13 + 10, 14]


# --------------------------------------------------------------------------------------------
# Induction heads


def test_repeated_sequences_avoid_special_ids_and_repeat_once():
    model = planted_model()
    seqs = repeated_sequences(20, model.special, length=8, count=3, seed=5)
    assert seqs.shape == (3, 17) and seqs[:, 0].eq(model.special.bos).all()
    assert torch.equal(seqs[:, 1:9], seqs[:, 9:])
    assert all(len(set(row[1:9].tolist())) == 8 for row in seqs)  # no id twice in r: one earlier occurrence
    assert not set(seqs[:, 1:].flatten().tolist()) & {0, 1, 2, 3}
    assert torch.equal(seqs, repeated_sequences(20, model.special, 8, 3, seed=5))


def test_an_induction_head_scores_one_and_a_previous_token_head_zero_on_repeated_tokens():
    model = planted_model(peak=1.0)
    table = induction_statistics(model, vocab_size=64, length=10, sequences=3, log=quiet).set_index("head")
    assert model.calls[0].shape == (3, 21)
    # the induction head: 0.7 (all but its BOS share) on the token after the first occurrence
    assert table.loc[1, "induction_score"] == pytest.approx(0.7)
    assert table.loc[0, "induction_score"] == pytest.approx(0.0)
    assert table.loc[0, "previous_score"] == pytest.approx(1.0)
    assert table.loc[1, "previous_score"] == pytest.approx(0.0) and table.loc[1, "duplicate_score"] == 0.0
    assert table.loc[3, "previous_score"] == pytest.approx(0.4)
    assert table["induction_score"].ge(INDUCTION_THRESHOLD).tolist() == [False, True, False, False]


def test_induction_scores_read_the_maps_at_the_right_offsets():
    """One sequence, length 3 (T = 7): head 0 all on p - 2 (the token after the first occurrence),
    head 1 on p - 3 (the occurrence), head 2 on p - 1."""
    length, T = 3, 7
    probs = torch.zeros(1, 1, 3, T, T)
    for p in range(T):
        for h, back in enumerate((length - 1, length, 1)):
            probs[0, 0, h, p, max(p - back, 0)] = 1.0
    table = repeated_sequence_scores(probs, length)
    assert table["induction_score"].tolist() == [1.0, 0.0, 0.0]
    assert table["duplicate_score"].tolist() == [0.0, 1.0, 0.0]
    assert table["previous_score"].tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        repeated_sequence_scores(probs[..., :6, :6], length)


def test_induction_is_for_causal_models_only():
    from headcount.models.transformer import ModelConfig, Transformer

    model = Transformer(ModelConfig(src_vocab=16, tgt_vocab=16, d_model=8, n_heads=2, d_ff=8, enc_layers=1,
                                    dec_layers=1, max_len=16))
    with pytest.raises(ValueError, match="causal"):
        induction_statistics(model, 16, log=quiet)


# --------------------------------------------------------------------------------------------
# Positional heads and sinks on causal attention (the model run over text)


def test_previous_token_head_on_causal_attention_scores_one_and_the_next_token_is_never_hit():
    model, segmenter = planted_model(), PieceSegmenter()
    stats = text_statistics(model, segmenter, TEXTS, Counter(), lowercase=False, batch_size=3, log=quiet)
    n = [len(segmenter.pieces(t)) for t in TEXTS]
    tgt_in = model.calls[0]
    assert tgt_in[:, 0].eq(model.special.bos).all() and tgt_in.shape == (3, max(n[:3]) + 1)  # BOS + pieces
    positional = stats["positional"].set_index("head")
    assert positional["n_queries"].eq(sum(n)).all()  # BOS is no query
    for head in (0, 3):  # a previous-token head, with or without a sink beside it
        assert positional.loc[head, "offset"] == -1
        assert positional.loc[head, "fraction"] == 1.0  # -1 is valid from the second piece on
        assert positional.loc[head, "fraction_paper"] == pytest.approx((sum(n) - len(n)) / sum(n))
        assert positional.loc[head, "second_offset"] == 0  # the first piece: BOS left out, itself
    # +1 counts its valid queries but no causal head can hit it: share 0, not a division error
    probe = PositionalStats()
    for _, lengths, run in _role_attention(model, segmenter, TEXTS, range(len(TEXTS)), 8, "cpu"):
        run(lambda layer, probs, lengths=lengths: probe.update(probs, lengths))
    assert probe.valid[probe.radius + 1] == sum(m - 1 for m in n) and probe.shares()[:, :, probe.radius + 1].max() == 0


def test_sink_share_is_the_attention_on_bos_without_the_bos_query():
    model, segmenter = planted_model(), PieceSegmenter()
    stats = text_statistics(model, segmenter, TEXTS, Counter(), lowercase=False, log=quiet)
    sink = stats["sink"].set_index("head")
    expected = {h: [] for h in range(4)}
    for text in TEXTS:
        for i in range(1, len(segmenter.pieces(text)) + 1):  # queries: the pieces, at positions 1..n
            for h, (target, share) in enumerate(zip(model.targets, model.sinks)):
                on_target = model.peak * (1 - share) if target([1] * (i + 1), i) == 0 else 0.0
                expected[h].append(share + on_target + (1 - model.peak) * (1 - share) / (i + 1))
    assert sink["sink_share"].tolist() == pytest.approx([np.mean(expected[h]) for h in range(4)], abs=1e-6)
    assert (sink["sink_share"] >= SINK_THRESHOLD).tolist() == [False, False, True, True]


def test_sink_stats_leave_out_the_sink_row_and_padding():
    probs = torch.zeros(1, 2, 1, 4, 4)
    probs[0, 0, 0, :2, 2] = 0.8  # two pieces, sink at 2
    probs[0, 0, 0, 2:, 2] = 1.0  # the sink's own row and padding: not counted
    probs[0, 1, 0, :3, 3] = 0.2  # three pieces, sink at 3
    stats = SinkStats()
    stats.update(probs, [3, 4])
    assert stats.table()["sink_share"].iloc[0] == pytest.approx((2 * 0.8 + 3 * 0.2) / 5)
    assert stats.n_queries == 5


# --------------------------------------------------------------------------------------------
# Syntactic heads on causal attention


SENTENCES = [  # (form, head, relation): subject before the verb, after it, before it
    [("the", 2, "det"), ("dog", 3, "nsubj"), ("ran", 0, "root")],
    [("now", 2, "advmod"), ("ran", 0, "root"), ("the", 4, "det"), ("cat", 2, "nsubj")],
    [("a", 3, "det"), ("big", 3, "amod"), ("dog", 4, "nsubj"), ("ate", 0, "root"), ("now", 4, "advmod")],
]


def causal_word_maps(W: int, targets) -> np.ndarray:
    """(1, H, W + 1, W + 1) lower-triangular word maps, the sink last: query q puts 0.5 on the sink,
    0.4 on targets[h](q) (<= q) and 0.1 spread over 0..q."""
    maps = np.zeros((1, len(targets), W + 1, W + 1))
    for h, target in enumerate(targets):
        for q in range(W + 1):
            maps[0, h, q, W] += 0.5
            maps[0, h, q, target(q)] += 0.4
            maps[0, h, q, :q + 1] += 0.1 / (q + 1)
    return maps


def test_causal_syntactic_heads_are_scored_on_backward_answers_against_a_backward_baseline():
    """v->s: answerable in sentences 0 and 2 (subject before the verb, offsets -1, -1), not in 1.
    s->v: answerable only in sentence 1 (-2). v->adv in sentence 2 has its adverb after the verb:
    unanswerable, and sentence 1's v->adv points back (-1)."""
    bidirectional, causal = SyntacticStats(), SyntacticStats(causal=True)
    for words in SENTENCES:
        table = parse_table([words])
        maps = causal_word_maps(len(words), [lambda q: max(q - 1, 0), lambda q: 0])  # previous word, first word
        bidirectional.update(maps, relation_pairs(table))
        causal.update(maps, relation_pairs(table))
    syn = causal.table().set_index(["relation", "direction", "head"]).sort_index()
    assert "n_unanswerable" in syn.columns and "n_unanswerable" not in bidirectional.table().columns
    v_s, s_v = syn.loc[("nsubj", "head->dep")], syn.loc[("nsubj", "dep->head")]
    assert v_s["n"].tolist() == [2, 2] and v_s["n_unanswerable"].tolist() == [1, 1]
    assert v_s["accuracy"].tolist() == [1.0, 0.0]  # the previous-word head is right wherever it can be
    assert (v_s["baseline_offset"].iloc[0], v_s["baseline_accuracy"].iloc[0]) == (-1, 1.0)
    assert (s_v["n"].iloc[0], s_v["n_unanswerable"].iloc[0]) == (1, 2)
    assert s_v["baseline_offset"].iloc[0] == -2  # bidirectionally +1, which a causal head cannot attend to
    both = bidirectional.table().set_index(["relation", "direction", "head"]).sort_index().loc[("nsubj", "dep->head")]
    assert (both["n"].iloc[0], both["baseline_offset"].iloc[0]) == (3, 1)
    v_adv = syn.loc[("advmod", "head->dep")]
    assert (v_adv["n"].iloc[0], v_adv["n_unanswerable"].iloc[0], v_adv["baseline_offset"].iloc[0]) == (1, 1, -1)


def test_syntactic_statistics_of_a_decoder_only_model_run_on_its_causal_maps():
    """Words of at most 3 letters are one piece each: the planted previous-token head is the
    previous-word head, right on every backward v->s and s->v instance at offset -1."""
    model = planted_model()
    table = parse_table(SENTENCES)
    stats = syntactic_statistics(model, PieceSegmenter(), table, lowercase=False, log=quiet)
    syn = stats["syntactic"].set_index(["relation", "direction", "head"]).sort_index()
    v_s = syn.loc[("nsubj", "head->dep")]
    assert v_s["n"].tolist() == [2] * 4 and v_s["n_unanswerable"].tolist() == [1] * 4
    assert v_s.loc[0, "accuracy"] == 1.0 and v_s.loc[3, "accuracy"] == 1.0
    assert [sentence_tokens(s) for _, s in table.groupby("sentence")][1] == ["now", "ran", "the", "cat"]


# --------------------------------------------------------------------------------------------
# Roles of a decoder-only model


def test_roles_of_a_decoder_only_model_and_their_precedence():
    assert role_names("decoder_only") == ["positional", "syntactic", "rare", "induction", "sink", "none"]
    assert role_precedence("decoder_only") == ("induction", "rare", "syntactic", "sink", "positional")
    assert role_precedence("encoder_only") == ("rare", "syntactic", "sink", "positional")
    assert role_precedence() == ("rare", "syntactic", "positional")  # an encoder-decoder's, as before
    assert role_names("encoder_only") == ["positional", "syntactic", "rare", "sink", "none"]
    assert role_names() == ["positional", "syntactic", "rare", "none"]  # an encoder-decoder's, as before
    model, segmenter = planted_model(), PieceSegmenter()
    stats = text_statistics(model, segmenter, TEXTS, Counter(), lowercase=False, log=quiet)
    stats.update(syntactic_statistics(model, segmenter, parse_table(SENTENCES), lowercase=False, log=quiet))
    induction = induction_statistics(model, len(segmenter), length=12, sequences=2, log=quiet)
    roles = assign_roles(stats["positional"], stats["syntactic"], stats["rare"], kind="decoder_only",
                         statistics={"induction": induction, "sink": stats["sink"]}).set_index("head")
    # head 1 (induction) looks at itself on text without repeats: positional too, induction first;
    # head 3 (0.6 on BOS, the rest on the previous token) is a sink and positional: sink first
    assert roles["role"].tolist() == ["positional", "induction", "sink", "sink"]
    assert roles["is_positional"].tolist() == [True, True, False, True]
    assert roles["is_sink"].tolist() == [False, False, True, True]
    assert roles.loc[1, "statistic"] == roles.loc[1, "induction_score"]
    assert roles.loc[2, "statistic"] == roles.loc[2, "sink_share"]
    strict = assign_roles(stats["positional"], stats["syntactic"], stats["rare"], kind="decoder_only",
                          statistics={"induction": induction, "sink": stats["sink"]},
                          rules={"sink_threshold": 0.999, "induction_threshold": 0.99})
    assert strict["role"].tolist() == ["positional", "positional", "none", "positional"]
    with pytest.raises(ValueError, match="induction"):
        assign_roles(stats["positional"], stats["syntactic"], stats["rare"], kind="decoder_only",
                     statistics={"sink": stats["sink"]})


def test_sink_outranks_positional_but_not_the_conditional_roles():
    """Five heads on hand-made tables, each qualifying for the sink (share >= 0.5) and one more
    role but the last: 0 positional (SmolLM2's 14.3: 0.94 on BOS) -> sink; 1 syntactic -> syntactic;
    2 rare-token -> rare; 3 induction -> induction; 4 positional with 0.3 on BOS -> positional."""
    heads = range(5)
    positional = pd.DataFrame({"layer": 0, "head": heads, "offset": -1,
                               "fraction": [0.95, 0.2, 0.2, 0.2, 0.95]})
    syntactic = pd.DataFrame({"relation": "obj", "direction": "head->dep", "name": "v->o", "layer": 0, "head": heads,
                              "accuracy": [0.3, 0.9, 0.3, 0.3, 0.3], "n": 50, "baseline_offset": -1,
                              "baseline_accuracy": 0.4})
    rare = pd.DataFrame({"layer": 0, "head": heads, "rate_rarest": 0.1, "rate_two_rarest": [0.1, 0.1, 0.8, 0.1, 0.1],
                         "n_sentences": 40})
    induction = pd.DataFrame({"layer": 0, "head": heads, "induction_score": [0.0, 0.0, 0.0, 0.45, 0.0],
                              "duplicate_score": 0.0, "previous_score": 0.0, "shifted_induction_score": 0.0})
    sink = pd.DataFrame({"layer": 0, "head": heads, "sink_share": [0.94, 0.6, 0.7, 0.5, 0.3]})
    roles = assign_roles(positional, syntactic, rare, kind="decoder_only",
                         statistics={"induction": induction, "sink": sink})
    assert roles["role"].tolist() == ["sink", "syntactic", "rare", "induction", "positional"]
    assert roles["is_positional"].tolist() == [True, False, False, False, True]  # the flag stays
    assert roles["is_sink"].tolist() == [True, True, True, True, False]
    assert roles.loc[0, "statistic"] == 0.94  # the sink share is the number behind head 0's role


@pytest.mark.slow
def test_find_head_roles_on_a_decoder_only_model(tmp_path, monkeypatch):
    """The stage: the model's kind decides the heads, the roles and the extra tables."""
    from headcount.pipeline import role_finding

    model, segmenter = planted_model(), PieceSegmenter()
    monkeypatch.setattr(role_finding, "load_model", lambda path: model)
    monkeypatch.setattr(role_finding, "open_tokenizer", lambda path, side: segmenter)
    parse_table(SENTENCES).to_parquet(tmp_path / "parses.parquet", index=False)
    (tmp_path / "train.txt").write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    settings = {"max_sentences": 100, "top_k": 5, "positional_threshold": 0.9, "positional_share": "valid",
                "syntactic_margin": 0.1, "rare_threshold": 0.5, "rare_margin": 0.1, "min_instances": 10,
                "induction_length": 12, "induction_sequences": 2}
    names = ("roles", "positional", "syntactic", "rare", "table1", "induction", "sink")
    out = {name: str(tmp_path / f"{name}.csv") for name in names}
    out.update(table1_md=str(tmp_path / "table1.md"), function_map=str(tmp_path / "map.png"),
               relative_positions=str(tmp_path / "positions.png"))
    roles, _ = role_finding.find_head_roles("model.pt", "spm", str(tmp_path / "parses.parquet"),
                                            str(tmp_path / "train.txt"), False, settings, out,
                                            analysis_src=str(tmp_path / "dev.txt"), log=quiet)
    assert roles["role"].tolist() == ["positional", "induction", "sink", "sink"]
    assert pd.read_csv(out["induction"])["induction_score"].gt(0.5).tolist() == [False, True, False, False]
    assert pd.read_csv(out["sink"])["sink_share"].ge(0.5).tolist() == [False, False, True, True]
    assert "n_unanswerable" in pd.read_csv(out["syntactic"]).columns


def test_an_encoder_only_model_has_its_cls_and_sep_as_one_sink():
    """[CLS] and [SEP] are both left out of the argmaxes, and the sink share is their sum."""
    from fakes import PlantedMaskedLM

    model, segmenter = PlantedMaskedLM(cls=[0.3, 0.5], sep=[0.1, 0.3]), PieceSegmenter()
    stats = text_statistics(model, segmenter, TEXTS, Counter(), lowercase=False, log=quiet)
    positional, sink = stats["positional"].set_index("head"), stats["sink"].set_index("head")
    n = [len(segmenter.pieces(t)) for t in TEXTS]
    assert positional["n_queries"].eq(sum(n)).all()
    assert positional["offset"].tolist() == [1, 1] and positional["fraction"].tolist() == [1.0, 1.0]
    assert sink["sink_share"].tolist() == pytest.approx([0.4, 0.8])
    assert role_names("encoder_only")[-2:] == ["sink", "none"]
