"""Single-head ablation with several heads per forward pass (importance.masked_mean_nlls through
gates.row_head_masks) against the reference it replaces, one head masked at a time with the
model's own 0/1 gates, on tiny models of every kind: headcount's Transformer, a transformers
encoder-decoder (Marian), causal LMs (GPT-2; Llama and Qwen2 with grouped-query attention) and a
BERT. fp32, as the models run in the workflow."""


import pytest
import torch
from conftest import tiny_config, toy_corpus
from fakes import louder, random_texts, tiny_marian

from headcount.analysis.importance import dev_batches, head_ablation, masked_mean_nlls, mean_nll
from headcount.models.gates import row_head_masks
from headcount.models.seq2seq import kind_of
from headcount.models.transformer import Transformer

torch.set_num_threads(1)

TOLERANCE = 1e-5  # fp32 losses of ~3-5 nats; batched and unbatched matmuls round differently


def one_head_at_a_time(model, batches) -> dict[tuple[str, int, int], float]:
    """The reference: each unmasked head masked alone through set_head_mask, one dev pass per head."""
    original = {kind: m.clone() for kind, m in model.head_mask().items()}
    base = mean_nll(model, batches)
    out = {}
    for kind, mask in original.items():
        for layer in range(mask.shape[0]):
            for head in range(mask.shape[1]):
                if mask[layer, head] == 0:
                    continue
                masked = mask.clone()
                masked[layer, head] = 0.0
                model.set_head_mask({kind: masked})
                out[(kind, layer, head)] = mean_nll(model, batches) - base
                model.set_head_mask({kind: mask})
    return out


def assert_batched_equals_reference(model, batches, heads_per_pass: int):
    reference = one_head_at_a_time(model, batches)
    masks = {kind: m.clone() for kind, m in model.head_mask().items()}
    table = head_ablation(model, batches, heads_per_pass=heads_per_pass)
    got = {(r.type, r.layer, r.head): r.delta_loss for r in table.itertuples() if r.delta_loss == r.delta_loss}
    assert got.keys() == reference.keys()
    assert max(abs(v) for v in reference.values()) > 100 * TOLERANCE  # the heads matter: agreement is not trivial
    for key, expected in reference.items():
        assert got[key] == pytest.approx(expected, abs=TOLERANCE), key
    assert all(torch.equal(m, masks[kind]) for kind, m in model.head_mask().items())  # restored


@pytest.mark.slow
def test_headcount_transformer_with_a_masked_head():
    torch.manual_seed(0)
    model = Transformer(tiny_config(d_model=16, n_heads=4, enc_layers=2, dec_layers=2)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.set_head_mask({"dec_enc": torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])})
    sp = model.special
    src = random_texts(model.cfg.src_vocab, {sp.pad, sp.bos, sp.eos}, seed=1)
    tgt = random_texts(model.cfg.tgt_vocab, {sp.pad, sp.bos, sp.eos}, seed=2)
    batches = dev_batches(src, tgt, max_tokens=40, special=sp)
    assert len(batches) > 1 and any(b[0].shape[0] > 1 for b in batches)
    for heads_per_pass in (1, 5, 64):  # one, several (the last chunk shorter), all in one pass
        assert_batched_equals_reference(model, batches, heads_per_pass)


@pytest.mark.slow
def test_a_transformers_encoder_decoder_with_masked_and_removed_heads():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tiny_marian(2)
    model.attention_modules()["enc_self"][1].keep_heads([0, 2])  # physically pruned: 2 of 4 heads left
    model.set_head_mask({"dec_self": torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])})
    sp = model.special
    avoid = {sp.pad, sp.bos, sp.eos, 0, 1, 2, 3}
    batches = dev_batches(random_texts(40, avoid, seed=1), random_texts(40, avoid, seed=2), max_tokens=40, special=sp)
    assert_batched_equals_reference(model, batches, heads_per_pass=7)


@pytest.fixture(scope="module")
def lines():
    src, tgt = toy_corpus(80, seed=5)
    return src + tgt


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "bert"])
@pytest.mark.slow
def test_language_models_including_grouped_query_attention(family, lines, tmp_path):
    pytest.importorskip("transformers")
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.testing import tiny_lm

    write = getattr(tiny_lm, f"write_tiny_{family}")
    model = louder(load_pretrained_lm(write(tmp_path / family, lines, layers=3))).eval()
    if family in ("llama", "qwen2"):  # 4 query heads on 2 KV heads
        assert model.hf.config.num_key_value_heads < model.hf.config.num_attention_heads
    sp = model.special
    texts = random_texts(model.hf.config.vocab_size, {sp.pad, sp.bos, sp.eos, sp.unk, sp.mask}, n=8)
    batches = dev_batches(texts, texts, max_tokens=60, special=sp, objective=kind_of(model).objective)
    assert_batched_equals_reference(model, batches, heads_per_pass=5)


def test_row_masks_mask_each_row_alone():
    """Row r of a batch under row_head_masks is the same sentence run alone with mask r as its
    model's head mask."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 10, 2], [5, 6, 7, 2]])
    tgt_in = torch.tensor([[1, 5, 6], [1, 7, 8], [1, 5, 6]])
    masks = {"enc_self": torch.ones(3, 2, 4), "dec_enc": torch.ones(3, 2, 4)}
    masks["enc_self"][0, 1, 2] = 0.0
    masks["dec_enc"][1, 0, :3] = 0.0
    with row_head_masks(model, masks):
        together, _ = model(src, tgt_in)
    for r in range(3):
        model.set_head_mask({kind: m[r] for kind, m in masks.items()})
        alone, _ = model(src[r:r + 1], tgt_in[r:r + 1])
        torch.testing.assert_close(together[r:r + 1], alone, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(together[0], together[2])  # same sentence, different masks
    with pytest.raises(ValueError, match="rows"):
        with row_head_masks(model, masks):
            model(src[:2], tgt_in[:2])


def test_masked_losses_of_no_batch_and_bad_chunk():
    model = Transformer(tiny_config()).eval()
    assert masked_mean_nlls(model, [], [("enc_self", 0, 0)]) == [0.0]
    with pytest.raises(ValueError, match="heads_per_pass"):
        head_ablation(model, [], heads_per_pass=0)


def test_each_sentences_masked_loss_and_the_paired_interval_against_brute_force():
    """masked_sentence_losses' per-sentence sums are each sentence's summed NLL run alone with the
    head masked (an independent pass per sentence); head_ablation's interval is the percentile
    bootstrap of those per-sentence differences, recomputed here by hand; a head with zero output
    weights costs exactly nothing, with the interval [0, 0]."""
    from headcount.analysis.importance import masked_sentence_losses, summed_nll
    from headcount.training.evaluate import bootstrap_indices, bootstrap_interval

    torch.manual_seed(0)
    model = Transformer(tiny_config(d_model=16, n_heads=4, enc_layers=2, dec_layers=2)).eval()
    sp = model.special
    src = random_texts(model.cfg.src_vocab, {sp.pad, sp.bos, sp.eos}, n=12, seed=1)
    tgt = random_texts(model.cfg.tgt_vocab, {sp.pad, sp.bos, sp.eos}, n=12, seed=2)
    batches = dev_batches(src, tgt, max_tokens=40, special=sp)
    heads = [("enc_self", 0, 1), None, ("dec_enc", 1, 3)]
    sums, units = masked_sentence_losses(model, batches, heads)
    assert sums.shape == (3, 12) and units.shape == (12,)
    original = {kind: m.clone() for kind, m in model.head_mask().items()}
    column = 0
    for batch in batches:
        for row in range(batch[0].shape[0]):
            one = [x[row:row + 1] for x in batch[:3]]
            length = int(one[2].ne(sp.pad).sum())
            one = [one[0][:, :int(one[0].ne(sp.pad).sum())], one[1][:, :length], one[2][:, :length]]
            for i, head in enumerate(heads):
                masks = {kind: m.clone() for kind, m in original.items()}
                if head is not None:
                    masks[head[0]][head[1], head[2]] = 0.0
                model.set_head_mask(masks)
                with torch.no_grad():
                    alone, n = summed_nll(model, *one)
                assert sums[i, column] == pytest.approx(float(alone), abs=1e-4)
                assert units[column] == n
            column += 1
    model.set_head_mask(original)

    with torch.no_grad():  # head 2 of encoder layer 1 writes nothing: masking it changes nothing
        layer = model.encoder_layers[1].self_attn
        layer.out_proj.weight[:, 2 * 4:3 * 4] = 0.0
    sums, units = masked_sentence_losses(model, batches, [None, ("enc_self", 0, 1)])
    table = head_ablation(model, batches).set_index(["type", "layer", "head"])
    differences = sums[1] - sums[0]
    index = bootstrap_indices(len(units))
    low, high = bootstrap_interval(differences[index].sum(axis=1) / units[index].sum(axis=1))
    row = table.loc[("enc_self", 0, 1)]
    assert row["delta_loss_low"] == pytest.approx(low, abs=1e-9)
    assert row["delta_loss_high"] == pytest.approx(high, abs=1e-9)
    assert row["delta_loss_low"] <= row["delta_loss"] <= row["delta_loss_high"] and high > low
    dead = table.loc[("enc_self", 1, 2)]
    assert abs(dead["delta_loss"]) < 1e-6 and abs(dead["delta_loss_low"]) < 1e-6 and abs(dead["delta_loss_high"]) < 1e-6
