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


# --------------------------------------------------------------------------------------------
# The analyses and pruning on a tiny GPT-2, Llama and BERT (hf_lm adapters), against transformers' own losses

LM_FAMILIES = ("gpt2", "llama", "bert")


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    from conftest import toy_corpus

    from headcount.testing import tiny_lm

    src, tgt = toy_corpus(120, seed=5)
    return {family: getattr(tiny_lm, f"write_tiny_{family}")(tmp_path_factory.mktemp(family), src + tgt)
            for family in LM_FAMILIES}, src[:12]


def _adapter_and_texts(lm_dirs, family):
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.models.hf_lm_tokenizer import load_lm_tokenizer

    dirs, lines = lm_dirs
    torch.manual_seed(0)
    model = load_pretrained_lm(dirs[family]).double().eval()
    ids = load_lm_tokenizer(dirs[family]).encode(lines)
    return model, [x for x in ids if x]


def _transformers_loss(directory, family, src, tgt_out, zeroed: tuple[int, int] | None) -> float:
    """transformers' own mean NLL of one text (its `labels` loss), with one head's output-projection
    input columns zeroed: an implementation independent of headcount's gates and batches."""
    import transformers

    auto = transformers.AutoModelForMaskedLM if family == "bert" else transformers.AutoModelForCausalLM
    hf = auto.from_pretrained(str(directory), attn_implementation="eager").double().eval()
    if zeroed is not None:
        layer, head = zeroed
        if family == "gpt2":
            block = hf.transformer.h[layer].attn
            dh = block.head_dim
            with torch.no_grad():  # Conv1D: weight (in, out); head h owns input rows h*dh:(h+1)*dh
                block.c_proj.weight[head * dh:(head + 1) * dh, :] = 0
        elif family == "llama":
            proj = hf.model.layers[layer].self_attn.o_proj
            dh = hf.config.hidden_size // hf.config.num_attention_heads
            with torch.no_grad():
                proj.weight[:, head * dh:(head + 1) * dh] = 0
        else:
            proj = hf.bert.encoder.layer[layer].attention.output.dense
            dh = hf.config.hidden_size // hf.config.num_attention_heads
            with torch.no_grad():
                proj.weight[:, head * dh:(head + 1) * dh] = 0
    with torch.no_grad():
        if family == "bert":
            labels = tgt_out.masked_fill(tgt_out.eq(0), -100)  # BERT's [PAD] is 0: unscored positions
            return float(hf(input_ids=src, labels=labels).loss)
        text = tgt_out  # BOS + text: transformers shifts the labels itself
        return float(hf(input_ids=torch.cat([torch.full_like(text[:, :1], hf.config.bos_token_id), text], 1),
                        labels=torch.cat([torch.full_like(text[:, :1], -100), text], 1)).loss)


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_an_lms_ablation_is_transformers_own_loss_with_the_heads_columns_zeroed(lm_dirs, family):
    from headcount.analysis.importance import dev_batches, head_ablation, head_confidence, mean_nll
    from headcount.training.perplexity import sentence_nll

    model, texts = _adapter_and_texts(lm_dirs, family)
    kind = kind_of(model)
    text = texts[0]
    one = dev_batches([text], [text], special=model.special, objective=kind.objective)
    src, _, tgt_out = one[0]
    assert mean_nll(model, one) == pytest.approx(_transformers_loss(lm_dirs[0][family], family, src, tgt_out, None),
                                                 abs=1e-6)  # transformers' loss runs in float32
    table = head_ablation(model, one)
    assert set(table["type"]) == set(kind.attention_types)
    strongest = table.loc[table["delta_loss"].abs().idxmax()]
    # Ten times the agreement asked for below, so agreement is not by default. (A fixed 1e-4 failed
    # once on a clean clone: the tiny BERT's strongest head moved its loss by 9.9e-5. Its tokenizer,
    # trained here by `tokenizers`, breaks ties differently from one process to the next, so the
    # vocabulary and hence the random model vary between runs: 9e-5 to 3e-4 in seven.)
    tolerance = 2e-6
    assert abs(strongest["delta_loss"]) > 10 * tolerance
    for layer, head in ((0, 1), (int(strongest["layer"]), int(strongest["head"]))):
        row = table[(table["layer"] == layer) & (table["head"] == head)].iloc[0]
        masked = _transformers_loss(lm_dirs[0][family], family, src, tgt_out, (layer, head))
        assert row["delta_loss"] == pytest.approx(masked - mean_nll(model, one), abs=tolerance)
    # Per-sentence NLL (perplexity's) and the pooled dev loss are the same sums.
    batches = dev_batches(texts, texts, max_tokens=200, special=model.special, objective=kind.objective)
    nll, tokens = sentence_nll(model, texts, texts, max_tokens=200)
    assert nll.sum() / tokens.sum() == pytest.approx(mean_nll(model, batches), rel=1e-9)
    confidence = head_confidence(model, batches)
    assert set(confidence["type"]) == set(kind.attention_types)
    assert ((confidence["confidence"] > 0) & (confidence["confidence"] <= 1)).all()


@pytest.mark.parametrize("family", ("gpt2", "bert"))
def test_an_lm_prunes_with_hard_concrete_gates_on_its_own_attention(lm_dirs, family, tmp_path):
    from headcount.analysis.importance import dev_batches, michel_importance
    from headcount.pruning.hard_concrete import penalty, prepare_for_pruning
    from headcount.training.loop import Corpus, DevSet, TrainConfig, train

    model, texts = _adapter_and_texts(lm_dirs, family)
    model.float()
    kind = kind_of(model)
    gates, groups = prepare_for_pruning(model, "all", log_alpha_init=None, gate_lr_scale=10.0)
    assert len(gates) == len(model.attention_modules()[kind.attention_types[0]])
    before = [g.log_alpha.detach().clone() for g in gates]
    cfg = TrainConfig(max_tokens=200, max_steps=6, warmup_steps=2, eval_interval=6, checkpoint_interval=6,
                      dev_bleu_sentences=0, select="last", threads=1, precision="fp32")
    summary = train(model, cfg, Corpus(texts, texts), DevSet(texts[:4], texts[:4]), tmp_path / "run",
                    parameters=groups, extra_loss=penalty(gates, 1.0), log=lambda s: None)
    assert summary["steps"] == 6
    assert all(not torch.equal(b, g.log_alpha.detach()) for b, g in zip(before, gates))  # the gates trained
    model.eval()
    for g in gates:
        g.log_alpha.requires_grad_(False)
    scores = michel_importance(model, dev_batches(texts, texts, special=model.special, objective=kind.objective))
    assert set(scores["type"]) == set(kind.attention_types) and scores["michel"].notna().all()


def test_removing_heads_frees_key_value_cache_only_where_a_whole_group_goes(lm_dirs):
    from headcount.pruning.removal import kv_cache_bytes_per_token, remove_pruned_heads

    for family, groups_shared in (("gpt2", False), ("llama", True)):
        model, texts = _adapter_and_texts(lm_dirs, family)
        modules = model.attention_modules()["dec_self"]
        dh, heads, layers = modules[0].head_dim, modules[0].n_heads, len(modules)
        kv_heads = int(getattr(modules[0], "n_kv_heads", heads))
        full = kv_cache_bytes_per_token(model)
        assert full == 2 * layers * kv_heads * dh * 2
        src, tgt_in, _ = causal_lm_tensors(texts[:3], model.special)
        mask = torch.ones(layers, heads)
        mask[0, 0] = 0  # one query head: frees a KV head only if it has one of its own
        mask[1, :heads // 2] = 0  # half the heads of layer 1: a whole KV group of llama's
        model.set_head_mask({"dec_self": mask})
        with torch.no_grad():
            expected = model(src, tgt_in)[0]
        remove_pruned_heads(model)
        with torch.no_grad():
            assert torch.allclose(model(src, tgt_in)[0], expected, atol=1e-10)
        freed = full - kv_cache_bytes_per_token(model)
        per_kv_head = 2 * dh * 2
        assert freed == (per_kv_head * (1 + heads // 2) if not groups_shared else per_kv_head * (kv_heads // 2))
