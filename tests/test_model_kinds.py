"""The three model kinds (models.seq2seq.MODEL_KINDS): each objective's batches, the attention
types each kind's analyses and pruning settings see, and a language model's quality intervals."""

import numpy as np
import pytest
import torch

from headcount.analysis.importance import confidence_masks
from headcount.data.batching import (
    MASK_RATE,
    causal_lm_tensors,
    masked_lm_tensors,
    masked_positions,
    objective_tensors,
    source_tensor,
    target_tensors,
)
from headcount.data.special import SpecialIds
from headcount.models.seq2seq import ATTENTION_TYPES, MODEL_KINDS, kind_of
from headcount.pruning.methods import kind_settings, setting_types
from headcount.training.perplexity import paired_bootstrap_nll, perplexity

LM = SpecialIds(pad=0, bos=1, eos=1)  # GPT-2-like: start and end are one id, no padding id of its own
MLM = SpecialIds(pad=0, bos=101, eos=102, mask=103)
TEXTS = [[5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


def test_every_kind_has_types_in_the_papers_order_and_an_objective():
    for kind in MODEL_KINDS.values():
        assert kind.attention_types == tuple(t for t in ATTENTION_TYPES if t in kind.attention_types)
    assert kind_of(object()).name == "encoder_decoder"  # a model that declares nothing: older code

    class LanguageModel:
        model_kind = "decoder_only"

    assert kind_of(LanguageModel()).objective == "causal_lm"


def test_causal_lm_batch_predicts_each_token_from_bos_and_the_tokens_before_it():
    src, tgt_in, tgt_out = causal_lm_tensors(TEXTS, LM)
    assert src.shape == (3, 0)
    for row, text in enumerate(TEXTS):
        n = len(text)
        assert tgt_out[row, :n].tolist() == text and tgt_out[row, n:].eq(LM.pad).all()
        assert tgt_in[row, 0] == LM.bos and tgt_in[row, 1:n].tolist() == text[:-1]
    # Every scored target is a text token: none is the EOS id, which here doubles as padding.
    assert int(tgt_out.ne(LM.pad).sum()) == sum(map(len, TEXTS))
    with pytest.raises(ValueError, match="empty text"):
        causal_lm_tensors([[5], []], LM)


def test_masked_lm_batch_masks_a_fixed_draw_and_scores_only_it():
    src, tgt_in, tgt_out = masked_lm_tensors(TEXTS, MLM, seed=3)
    assert tgt_in.shape == (3, 0) and src.shape == tgt_out.shape
    for row, text in enumerate(TEXTS):
        chosen = masked_positions(text, 3)
        assert len(chosen) == max(1, round(MASK_RATE * len(text)))
        assert src[row, 0] == MLM.bos and src[row, len(text) + 1] == MLM.eos
        for i, token in enumerate(text):
            if i in chosen:
                assert src[row, i + 1] == MLM.mask and tgt_out[row, i + 1] == token
            else:
                assert src[row, i + 1] == token and tgt_out[row, i + 1] == MLM.pad
    # The draw depends on the text and the seed only: the same in another batch, new with a new seed.
    again = masked_lm_tensors([TEXTS[2]], MLM, seed=3)[0]
    assert again[0].tolist() == src[2, :len(TEXTS[2]) + 2].tolist()
    draws = {tuple(masked_positions(list(range(40)), seed)) for seed in range(20)}
    assert len(draws) > 15
    with pytest.raises(ValueError, match="mask id"):
        masked_lm_tensors(TEXTS, LM)


def test_translation_batch_is_the_one_every_stage_made_before():
    src_ids, tgt_ids = [[5, 6], [7]], [[8], [9, 10, 11]]
    special = SpecialIds(pad=0, bos=2, eos=3)
    made = objective_tensors("translation", src_ids, tgt_ids, special)
    expected = (source_tensor(src_ids, special), *target_tensors(tgt_ids, special))
    assert all(torch.equal(a, b) for a, b in zip(made, expected))
    with pytest.raises(ValueError, match="unknown objective"):
        objective_tensors("summarisation", src_ids, tgt_ids, special)


def test_confidence_masks_hold_a_kinds_types_and_leave_out_its_sinks():
    src, _, _ = masked_lm_tensors(TEXTS, MLM)
    masks = confidence_masks(src, torch.zeros(3, 0, dtype=torch.long), MLM, model_kind="encoder_only")
    assert list(masks) == ["enc_self"]
    query, key = masks["enc_self"]
    # [CLS] and [SEP] are both left out (no-op sinks), padding too; every text token stays.
    assert int(key.sum()) == sum(map(len, TEXTS)) and not key[:, 0].any()
    _, tgt_in, _ = causal_lm_tensors(TEXTS, LM)
    masks = confidence_masks(torch.zeros(3, 0, dtype=torch.long), tgt_in, LM, model_kind="decoder_only")
    assert list(masks) == ["dec_self"]
    assert int(masks["dec_self"][0].sum()) == sum(map(len, TEXTS))  # BOS (= padding id here) is a real query


def test_pruning_settings_follow_the_kind():
    assert setting_types("enc") == ("enc_self",) and setting_types("all") == ATTENTION_TYPES
    assert kind_settings("encoder_decoder") == ("enc", "all")
    assert kind_settings("decoder_only") == ("all",) and setting_types("all", "decoder_only") == ("dec_self",)
    assert setting_types("all", "encoder_only") == ("enc_self",)
    with pytest.raises(ValueError, match="not one of a decoder_only model's"):
        setting_types("enc", "decoder_only")


def test_paired_bootstrap_of_nll_matches_an_explicit_resampling():
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 30, size=40)
    reference = tokens * rng.uniform(2.0, 3.0, size=40)
    worse = reference + tokens * rng.normal(0.3, 0.2, size=40)
    out = paired_bootstrap_nll(worse, reference, tokens, n_samples=200, seed=7)
    assert out["difference"] == pytest.approx((worse.sum() - reference.sum()) / tokens.sum())
    index = np.random.default_rng(7).choice(40, size=(200, 40), replace=True)
    explicit = sorted(sum(worse[i] - reference[i] for i in row) / sum(tokens[i] for i in row) for row in index)
    assert out["low"] == pytest.approx(explicit[5]) and out["high"] == pytest.approx(explicit[194])
    assert 0 < out["low"] < out["difference"] < out["high"] and out["p_value"] < 0.05
    assert out["perplexity"] == pytest.approx(np.exp(worse.sum() / tokens.sum()))
    same = paired_bootstrap_nll(reference, reference, tokens, n_samples=200)
    assert same["low"] == same["high"] == 0.0
    assert perplexity(np.array([0.0]), np.array([5])) == 1.0
