"""The Transformer against independent computations."""

import math

import pytest
import torch
from conftest import random_batch, tiny_config
from torch import nn

from headcount.model import MultiHeadAttention, Transformer, sinusoidal_positions


def copied_torch_mha(ours: MultiHeadAttention, d_model: int, n_heads: int) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(d_model, n_heads, dropout=0.0, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("d_model,n_heads", [(16, 4), (24, 3), (8, 1)])
@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_matches_torch_multihead_attention(d_model, n_heads, need_weights):
    torch.manual_seed(1)
    ours = MultiHeadAttention(d_model, n_heads, 0.0).eval()
    ref = copied_torch_mha(ours, d_model, n_heads)
    x = torch.randn(3, 6, d_model)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, -2:] = pad[2, -1:] = True
    out, probs = ours(x, key_padding_mask=pad, need_weights=need_weights)
    ref_out, ref_probs = ref(x, x, x, key_padding_mask=pad, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(probs, ref_probs, atol=1e-6, rtol=1e-5)


def test_cross_and_causal_attention_match_torch():
    torch.manual_seed(2)
    d, h = 16, 4
    ours = MultiHeadAttention(d, h, 0.0).eval()
    ref = copied_torch_mha(ours, d, h)
    y, memory = torch.randn(2, 5, d), torch.randn(2, 7, d)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, -3:] = True
    out, _ = ours(y, memory, key_padding_mask=pad)
    ref_out, _ = ref(y, memory, memory, key_padding_mask=pad)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)

    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch: True = not allowed
    out, probs = ours(y, causal=True, need_weights=True)
    ref_out, ref_probs = ref(y, y, y, attn_mask=causal, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs, ref_probs, atol=1e-6, rtol=1e-5)
    fast, _ = ours(y, causal=True)  # the SDPA path agrees with the explicit one
    torch.testing.assert_close(fast, out, atol=1e-5, rtol=1e-5)


def test_head_mask_equals_dropping_the_head_by_hand():
    torch.manual_seed(3)
    d, H = 16, 4
    Dh = d // H
    mha = MultiHeadAttention(d, H, 0.0).eval()
    x = torch.randn(2, 5, d)
    dropped = 1
    mha.head_mask.copy_(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    out, _ = mha(x)

    # Explicitly: each head's context, then the output projection over the surviving heads only.
    q, k, v = (x @ lin.weight.T + lin.bias for lin in (mha.q_proj, mha.k_proj, mha.v_proj))
    expected = mha.out_proj.bias.expand(2, 5, d).clone()
    for head in range(H):
        if head == dropped:
            continue
        cols = slice(head * Dh, (head + 1) * Dh)
        weights = torch.softmax(q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(Dh), dim=-1)
        expected += (weights @ v[..., cols]) @ mha.out_proj.weight[:, cols].T
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_model_head_masks_change_only_the_masked_type(tiny_model):
    src, tgt = random_batch(tiny_model)
    base, _ = tiny_model(src, tgt)
    mask = torch.ones(2, 4)
    mask[0, 1] = 0
    tiny_model.set_head_mask({"dec_enc": mask})
    masked, _ = tiny_model(src, tgt)
    assert not torch.allclose(base, masked)
    assert tiny_model.head_mask()["dec_enc"].tolist() == mask.tolist()
    assert tiny_model.head_mask()["enc_self"].sum() == 8
    with pytest.raises(ValueError, match="expected"):
        tiny_model.set_head_mask({"enc_self": torch.ones(3, 4)})


def test_attention_probabilities_are_distributions_that_ignore_padding(tiny_model):
    src, tgt = random_batch(tiny_model)
    logits, att = tiny_model(src, tgt, need_weights=True)
    assert set(att) == {"enc_self", "dec_self", "dec_enc"}
    for layers in att.values():
        assert len(layers) == 2
        for p in layers:
            torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    enc = att["enc_self"][0]  # (B, H, S, S)
    assert torch.all(enc[1:, :, :, -2:] == 0)  # padded source keys get nothing
    dec = att["dec_self"][0]
    assert torch.all(dec.triu(1) == 0)  # no peeking at later target positions
    # The returned weights do not change the output.
    plain, _ = tiny_model(src, tgt)
    torch.testing.assert_close(plain, logits, atol=1e-5, rtol=1e-5)


def test_incremental_decoding_matches_the_full_pass(tiny_model):
    src, tgt = random_batch(tiny_model)
    tgt = tgt[:1]
    src = src[:1]
    memory, src_pad, _ = tiny_model.encode(src)
    full, _, _ = tiny_model.decode(tgt, memory, src_pad)
    cache = [{} for _ in tiny_model.decoder_layers]
    steps = [tiny_model.decode(tgt[:, t : t + 1], memory, src_pad, cache=cache, start=t)[0]
             for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_a_sentence(tiny_model):
    src, tgt = random_batch(tiny_model, batch=2)
    src[0, -2:] = 0
    alone, _ = tiny_model(src[:1, :-2], tgt[:1])
    batched, _ = tiny_model(src, tgt)
    torch.testing.assert_close(batched[:1], alone, atol=1e-5, rtol=1e-5)


def test_sinusoidal_positions_formula():
    table = sinusoidal_positions(10, 6)
    pos, i = 7, 2  # dimension 2i = 4 and 2i+1 = 5
    angle = pos / 10000 ** (2 * i / 6)
    assert table[pos, 4].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 5].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("tie", [True, False])
def test_tied_embeddings_and_gradients_reach_every_parameter(tie):
    torch.manual_seed(0)
    model = Transformer(tiny_config(tie_target_embeddings=tie, dropout=0.1))
    assert (model.generator.weight is model.tgt_embed.weight) == tie
    src, tgt = random_batch(model)
    logits, _ = model(src, tgt)
    logits.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="divisible"):
        tiny_config(d_model=18, n_heads=4)
