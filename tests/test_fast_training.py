"""The fast training step (issue 60): the fused attention path against the explicit one the analyses
read, the fused Adam update, and the fixed-shape (bucketed) step for CUDA graphs."""

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from headcount.models.gates import attach_gates
from headcount.models.transformer import Transformer
from headcount.training.loop import TrainConfig, forward_loss, make_optimizer, parameter_groups, sequence_loss, update
from headcount.training.static_shapes import Buckets, pad_batch, padded_loss, static_sequence_loss


def batch(model, rows=4, src_len=9, tgt_len=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, model.cfg.src_vocab, (rows, src_len), generator=g)
    tgt_out = torch.randint(4, model.cfg.tgt_vocab, (rows, tgt_len), generator=g)
    src[1:, -3:] = model.special.pad  # key padding in encoder and cross attention
    tgt_out[2:, -2:] = model.special.pad
    tgt_in = torch.cat([torch.full((rows, 1), model.special.bos), tgt_out[:, :-1]], dim=1)
    return src, tgt_in, tgt_out


def gated_training_model(dropout: float) -> Transformer:
    """Dropout on attention and residuals, a fixed head mask with a closed head and Hard Concrete
    gates on every attention type, in training mode (gates sampled)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(d_model=32, n_heads=4, d_ff=48, dropout=dropout, attn_dropout=dropout,
                                    relu_dropout=dropout, dropout_masks="fast"))
    model.set_head_mask({"enc_self": torch.tensor([[1.0, 0, 1, 1], [1, 1, 1, 1]])})
    attach_gates(model)
    return model.train()


def loss_and_grads(model, data, need_weights: bool, seed: int, dtype=None):
    """Label-smoothed loss of a teacher-forced pass through the fused (need_weights=False, SDPA) or
    the explicit (need_weights=True) attention, and every parameter's gradient."""
    src, tgt_in, tgt_out = data
    torch.manual_seed(seed)  # the same dropout masks and gate samples for both paths
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        logits, attentions = model(src, tgt_in, need_weights=need_weights)
    assert (attentions is not None) == need_weights
    real = tgt_out.ne(model.special.pad)
    loss = F.cross_entropy(logits[real].float(), tgt_out[real], label_smoothing=0.1)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fused_and_explicit_attention_train_alike_fp32(dropout):
    """SDPA (training's path) and the need_weights path (the analyses') give the same loss and
    gradients on a fixed batch, with gates, a head mask, padding and causal masks, and with dropout:
    both draw the attention dropout from the same generator in the same order."""
    model = gated_training_model(dropout)
    data = batch(model)
    fused, fused_grads = loss_and_grads(model, data, need_weights=False, seed=5)
    explicit, explicit_grads = loss_and_grads(model, data, need_weights=True, seed=5)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-6)
    assert fused_grads.keys() == explicit_grads.keys()
    assert any("log_alpha" in name for name in fused_grads)  # the gates are trained through both paths
    for name in fused_grads:
        torch.testing.assert_close(fused_grads[name], explicit_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    if dropout:  # a different draw changes the loss: the agreement above is not dropout being off
        other, _ = loss_and_grads(model, data, need_weights=True, seed=6)
        assert not torch.allclose(other, explicit, rtol=1e-4)


def test_fused_and_explicit_attention_train_alike_bf16():
    """The same under bf16 autocast (emulated on CPUs without AVX512-BF16), within bf16's precision:
    the fused path's loss and gradients are no further from the exact (fp32, explicit) ones than a
    few times the explicit path's own bf16 error, and within 10% of them over all parameters."""
    model = gated_training_model(0.1)
    data = batch(model)
    fused, fused_grads = loss_and_grads(model, data, need_weights=False, seed=5, dtype=torch.bfloat16)
    explicit, explicit_grads = loss_and_grads(model, data, need_weights=True, seed=5, dtype=torch.bfloat16)
    exact, exact_grads = loss_and_grads(model, data, need_weights=True, seed=5)
    torch.testing.assert_close(fused, explicit, rtol=2e-2, atol=1e-2)
    for name in exact_grads:
        if name.endswith("k_proj.bias"):
            continue  # its gradient is zero (a key bias shifts a row's scores alike): only rounding
        error, bf16_error = (float((g[name] - exact_grads[name]).norm()) for g in (fused_grads, explicit_grads))
        assert error <= 4 * bf16_error + 1e-6, (name, error, bf16_error)
    flat = {key: torch.cat([g[n].flatten() for n in exact_grads]) for key, g in
            (("fused", fused_grads), ("exact", exact_grads))}
    assert float((flat["fused"] - flat["exact"]).norm()) <= 0.1 * float(flat["exact"].norm())


def test_fused_adam_is_the_loop_optimizer_and_matches_the_for_loop_update():
    torch.manual_seed(0)
    models = [Transformer(tiny_config()).train() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    cfg = TrainConfig()
    optimizers = [make_optimizer(parameter_groups(m), cfg, torch.device("cpu"), fused=f)
                  for m, f in zip(models, (None, False))]
    assert optimizers[0].defaults["fused"] and not optimizers[1].defaults["fused"]
    data = batch(models[0])
    for _ in range(3):
        for model, optimizer in zip(models, optimizers):
            for group in optimizer.param_groups:
                group["lr"] = 1e-3
            loss = forward_loss(model, data, cfg, torch.device("cpu"), None)[0]
            update(optimizer, loss, list(model.parameters()), cfg.clip_norm)
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        if not name.endswith("k_proj.bias"):  # a zero gradient: Adam normalises its rounding noise
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_buckets_and_padding():
    buckets = Buckets(rows_multiple=8, length_multiple=4)
    assert buckets.shape(5, 9, 1) == (8, 12, 4)
    assert buckets.shape(16, 12, 8) == (16, 12, 8)  # already on a bucket
    model = Transformer(tiny_config())
    data = batch(model, rows=5, src_len=9, tgt_len=7)
    src, tgt_in, tgt_out = pad_batch(data, buckets.shape(5, 9, 7), model.special)
    assert src.shape == (8, 12) and tgt_in.shape == tgt_out.shape == (8, 8)
    assert torch.equal(src[:5, :9], data[0]) and src[:5, 9:].eq(model.special.pad).all()
    assert src[5:, 0].eq(model.special.eos).all() and src[5:, 1:].eq(model.special.pad).all()
    assert tgt_in[5:, 0].eq(model.special.bos).all() and tgt_out[5:].eq(model.special.pad).all()
    with pytest.raises(ValueError, match="does not fit"):
        pad_batch(data, (4, 12, 8), model.special)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_static_loss_on_a_padded_batch_equals_the_loop_loss(label_smoothing):
    """Padding rows and positions to a bucket changes neither the loss, the NLL, the token count
    nor any gradient (the padded rows' sources are one EOS: no attention row is empty)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    data = batch(model, rows=5, src_len=9, tgt_len=7)
    loss, nll, n = sequence_loss(model, *data, label_smoothing)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    padded = pad_batch(data, Buckets(8, 4).shape(5, 9, 7), model.special)
    static_loss, static_nll, static_n = static_sequence_loss(model, *padded, label_smoothing)
    static_grads = torch.autograd.grad(static_loss, list(model.parameters()), allow_unused=True)
    assert int(static_n) == n
    torch.testing.assert_close(static_loss, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(static_nll, nll, rtol=1e-5, atol=1e-5)
    for a, b in zip(static_grads, grads):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bucketed_step_trains_as_the_loop_step():
    """forward_loss on batches padded to their buckets (static_shapes.padded_loss, what
    training.compile_step selects) takes the loop's own step: the same weights after two updates
    (no dropout, so no random stream to tell them apart). Traced by torch.compile: test_train."""
    torch.manual_seed(0)
    models = [Transformer(tiny_config(enc_layers=1, dec_layers=1)).train() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    cfg = TrainConfig()
    optimizers = [make_optimizer(parameter_groups(m), cfg, torch.device("cpu")) for m in models]
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = 1e-3
    padded = padded_loss(models[1], cfg.label_smoothing, None, "buckets", Buckets(8, 4))
    for seed in (1, 2):
        data = batch(models[0], rows=5, src_len=9, tgt_len=6, seed=seed)
        for model, optimizer, pad in zip(models, optimizers, (None, padded)):
            loss, _, _, n_tokens = forward_loss(model, data, cfg, torch.device("cpu"), None, padded=pad)
            update(optimizer, loss, list(model.parameters()), cfg.clip_norm)
            assert n_tokens == int(data[2].ne(0).sum())
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        if not name.endswith("k_proj.bias"):  # a zero gradient: Adam normalises its rounding noise
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="backend"):
        padded_loss(models[1], 0.1, None, backend="xla")
