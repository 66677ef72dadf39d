"""The Transformer against independent computations."""

import dataclasses
import math

import pytest
import torch
from conftest import random_batch, tiny_config
from torch import nn

from headcount.models.transformer import Dropout, MultiHeadAttention, Transformer, lane_keep_mask, sinusoidal_positions


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


def test_torch_dropout_masks_are_torch_dropout_exactly():
    x = torch.randn(64, 33)
    torch.manual_seed(5)
    ours = Dropout(0.1, "torch")(x)
    torch.manual_seed(5)
    assert torch.equal(ours, nn.Dropout(0.1)(x))


def test_fast_dropout_masks_are_the_lanes_of_the_random_integers():
    """The mask against an explicit reading of each 64-bit draw's four 16-bit lanes, low lane first."""
    p, n = 0.25, 4 * 50 + 3  # not a multiple of four: the last draw's spare lane is unused
    torch.manual_seed(7)
    mask = lane_keep_mask(torch.Size([n]), p)
    torch.manual_seed(7)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64).tolist()
    lanes = [((w % 2**64) >> (16 * k)) & 0xFFFF for w in words for k in range(4)][:n]  # unsigned
    signed = [lane - 2**16 if lane >= 2**15 else lane for lane in lanes]  # two's complement
    assert mask.tolist() == [lane + 2**15 >= p * 2**16 for lane in signed]


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_fast_dropout_is_bernoulli_with_independent_neighbours(p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1001) + 0.5  # no zeros of its own; an odd count of elements
    layer = Dropout(p, "fast")
    y = layer(x)
    dropped = (y == 0).flatten()
    n = dropped.numel()
    assert abs(dropped.double().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / n)  # binomial, 5 sigma
    # Kept elements are scaled by 1 / (1 - p), so the expectation is unchanged.
    kept = ~(y == 0)
    assert torch.equal(y[kept], x[kept] * torch.tensor(1 / (1 - p)))
    # Lanes of one draw (lags 1-3) and of neighbouring draws (4, 5) are independent: P(both) = p^2.
    for lag in (1, 2, 3, 4, 5):
        both = (dropped[:-lag] & dropped[lag:]).double().mean().item()
        assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / n), lag
    # The gradient is the same mask and scale; masks come from torch's generator, so seeds repeat them.
    x.requires_grad_()
    torch.manual_seed(1)
    layer(x).sum().backward()
    torch.manual_seed(1)
    assert torch.equal(x.grad, lane_keep_mask(x.shape, p).float() * torch.tensor(1 / (1 - p)))
    assert not torch.equal(layer(x), layer(x))  # a fresh mask each call
    assert torch.equal(layer.eval()(x), x)


def test_dropout_masks_change_training_only():
    outputs = {}
    for masks in ("torch", "fast"):
        torch.manual_seed(0)
        model = Transformer(tiny_config(dropout=0.3, relu_dropout=0.3, dropout_masks=masks))
        batch = random_batch(model, seed=2)
        torch.manual_seed(1)
        train_out, _ = model(*batch)
        outputs[masks] = (train_out, model.eval()(*batch)[0])
    assert not torch.allclose(outputs["torch"][0], outputs["fast"][0])  # different masks
    assert torch.equal(outputs["torch"][1], outputs["fast"][1])  # same weights, same evaluation
    with pytest.raises(ValueError, match="dropout_masks"):
        tiny_config(dropout_masks="philox")


def test_model_settings_round_trip_through_to_dict():
    """Checkpoints and run fingerprints hash to_dict(): it holds every setting, and a config rebuilt
    from it is the same config (a setting missing from an older dict takes its default)."""
    cfg = tiny_config(dropout_masks="fast")
    saved = cfg.to_dict()
    assert saved["dropout_masks"] == "fast" and set(saved) == {f.name for f in dataclasses.fields(cfg)}
    assert set(tiny_config().to_dict()) == set(saved)  # a setting at its default is written too
    assert type(cfg)(**saved) == cfg
    older = {k: v for k, v in saved.items() if k != "dropout_masks"}
    assert type(cfg)(**older).dropout_masks == "torch"
    assert Transformer(type(cfg)(**saved)).cfg.dropout_masks == "fast"


def test_qkv_init_gain_scales_only_the_query_key_value_projections():
    import dataclasses

    cfg = tiny_config(d_model=64, n_heads=4, d_ff=128)
    torch.manual_seed(0)
    plain = Transformer(cfg)
    torch.manual_seed(0)
    again = Transformer(dataclasses.replace(cfg, qkv_init_gain=1.0))
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), again.state_dict().values()))
    torch.manual_seed(0)
    scaled = Transformer(dataclasses.replace(cfg, qkv_init_gain=0.5))
    bound = (6 / (64 + 64)) ** 0.5  # Xavier uniform's bound for a 64x64 matrix, gain 1
    for modules in scaled.attention_modules().values():
        for m in modules:
            for proj in (m.q_proj, m.k_proj, m.v_proj):
                assert float(proj.weight.detach().abs().max()) <= 0.5 * bound + 1e-7
                assert float(proj.weight.detach().std()) == pytest.approx(0.5 * bound / 3**0.5, rel=0.1)
            assert float(m.out_proj.weight.detach().abs().max()) > 0.5 * bound  # W^O keeps gain 1
    assert plain.cfg.to_dict()["qkv_init_gain"] == 1.0


def test_ffn_init_torch_gives_the_feed_forward_layers_nn_linears_own_init_and_nothing_else():
    import dataclasses

    cfg = tiny_config(d_model=64, n_heads=4, d_ff=128)
    torch.manual_seed(0)
    plain = Transformer(cfg)
    torch.manual_seed(0)
    torch_init = Transformer(dataclasses.replace(cfg, ffn_init="torch"))
    for name, value in torch_init.state_dict().items():
        if ".ffn." not in name:  # drawn after the rest: every other tensor is the default model's
            assert torch.equal(value, plain.state_dict()[name]), name
    for layer in (*torch_init.encoder_layers, *torch_init.decoder_layers):
        for linear in (layer.ffn.w_in, layer.ffn.w_out):
            bound = linear.in_features**-0.5  # nn.Linear's init: weights and biases within 1/sqrt(fan_in)
            for tensor in (linear.weight, linear.bias):
                assert float(tensor.detach().abs().max()) <= bound
                # uniform on [-bound, bound] has sd bound/sqrt(3); fairseq's FFN starts so
                assert float(tensor.detach().std()) == pytest.approx(bound / 3**0.5, rel=0.25)
    assert all(float(layer.ffn.w_in.bias.abs().max()) == 0 for layer in plain.encoder_layers)  # Xavier: zero
    assert plain.cfg.to_dict()["ffn_init"] == "xavier" and torch_init.cfg.to_dict()["ffn_init"] == "torch"
    with pytest.raises(ValueError, match="model.ffn_init"):
        dataclasses.replace(cfg, ffn_init="kaiming")
