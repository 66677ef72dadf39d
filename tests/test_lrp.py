"""LRP head relevance against an explicit, slow, per-neuron LRP and conservation laws."""

import math

import numpy as np
import pytest
import torch
from conftest import random_batch, randomise_norms_and_biases, tiny_config
from torch import nn

from headcount.analysis.relevance import head_relevance, sub_batches
from headcount.data.subwords import BOS_ID, PAD_ID
from headcount.models.lrp import lrp_forward, make_rules, step_relevance
from headcount.models.transformer import Transformer

torch.set_num_threads(1)


def tiny_lrp_model(seed: int = 0, biases: bool = True, **overrides) -> Transformer:
    """1+1 layers, d_model 8, 2 heads, vocab 12, in float64, with non-trivial biases and gains."""
    torch.manual_seed(seed)
    settings = dict(src_vocab=12, tgt_vocab=12, d_model=8, n_heads=2, d_ff=16, enc_layers=1, dec_layers=1)
    settings.update(overrides)
    return randomise_norms_and_biases(Transformer(tiny_config(**settings)).double().eval(), biases)


# --------------------------------------------------------------------------------------------
# An explicit LRP, one neuron at a time, on activations captured from model.py's own forward


def capture(model: Transformer, src: torch.Tensor, tgt_in: torch.Tensor):
    """(input, output) of every Linear and LayerNorm, and the attention probabilities, sentence 0."""
    acts, hooks = {}, []
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm)) and module is not model.generator:
            hooks.append(module.register_forward_hook(
                lambda mod, inp, out: acts.__setitem__(mod, (inp[0][0].detach().numpy(), out[0].detach().numpy()))))
    with torch.no_grad():
        logits, attn = model(src, tgt_in, need_weights=True)
    for h in hooks:
        h.remove()
    probs = {kind: [p[0].numpy() for p in layers] for kind, layers in attn.items()}  # (H, Tq, Tk)
    return acts, probs, logits[0].numpy()


def sgn(z):
    return 1.0 if z >= 0 else -1.0


def lrp_linear(x, W, z, R_out, eps):
    """z = W x + b at every position: R_i = sum_j x_i W_ji / (z_j + eps sgn z_j) R_j."""
    R = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(W.shape[0]):
            share = R_out[t, j] / (z[t, j] + eps * sgn(z[t, j]))
            for i in range(W.shape[1]):
                R[t, i] += x[t, i] * W[j, i] * share
    return R


def lrp_sum(a, b, R_out, eps):
    """out = a + b: each summand gets its proportion of the relevance."""
    Ra, Rb = np.zeros_like(a), np.zeros_like(b)
    for t in range(a.shape[0]):
        for i in range(a.shape[1]):
            den = a[t, i] + b[t, i] + eps * sgn(a[t, i] + b[t, i])
            Ra[t, i] = a[t, i] / den * R_out[t, i]
            Rb[t, i] = b[t, i] / den * R_out[t, i]
    return Ra, Rb


def lrp_layer_norm(norm, x, y, R_out, rule, eps):
    if rule == "ding":
        return R_out.copy()  # non-linearity ignored: passes through unchanged
    gamma = norm.weight.detach().numpy()  # the bias only enters through y
    D = x.shape[1]
    R = np.zeros_like(x)
    for t in range(x.shape[0]):
        mean = sum(x[t]) / D
        std = math.sqrt(sum((x[t, i] - mean) ** 2 for i in range(D)) / D + norm.eps)
        n = [(x[t, i] - mean) / std for i in range(D)]
        R_n = [gamma[j] * n[j] / (y[t, j] + eps * sgn(y[t, j])) * R_out[t, j] for j in range(D)]
        for j in range(D):  # centering, a linear map n_j = sum_i (delta_ij - 1/D) / std x_i
            for i in range(D):
                R[t, i] += x[t, i] * ((i == j) - 1.0 / D) / std / n[j] * R_n[j]
    return R


def lrp_attention(m, acts, probs, x_q, x_kv, R_out, rule, eps):
    """Relevance of one attention block: -> (R at the query input, R at the key/value input, R per head)."""
    H, Dh = m.n_heads, m.head_dim
    out_in, out = acts[m.out_proj]
    R_ctx = lrp_linear(out_in, m.out_proj.weight.detach().numpy(), out, R_out, eps)  # (Tq, D), gates are 1
    head_rel = [float(np.abs(R_ctx[:, h * Dh : (h + 1) * Dh]).sum()) for h in range(H)]
    q = acts[m.q_proj][1]
    k = acts[m.k_proj][1]
    v = acts[m.v_proj][1]
    Tq, Tk = q.shape[0], k.shape[0]
    R_q, R_k, R_v = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(H):
        P = probs[h]
        R_P = np.zeros((Tq, Tk))
        for qi in range(Tq):
            for d in range(Dh):
                c = h * Dh + d
                ctx = sum(P[qi, kj] * v[kj, c] for kj in range(Tk))
                for kj in range(Tk):
                    share = P[qi, kj] * v[kj, c] / (ctx + eps * sgn(ctx)) * R_ctx[qi, c]
                    if rule == "ding":
                        R_v[kj, c] += share  # probabilities constant: all relevance to V
                    else:
                        R_v[kj, c] += 0.5 * share
                        R_P[qi, kj] += 0.5 * share
        if rule == "attnlrp":
            for qi in range(Tq):
                total = R_P[qi].sum()
                for kj in range(Tk):
                    if P[qi, kj] == 0:  # masked key: no relevance
                        continue
                    raw = sum(q[qi, h * Dh + d] * k[kj, h * Dh + d] for d in range(Dh))
                    score = raw / math.sqrt(Dh)
                    R_score = score * (R_P[qi, kj] - P[qi, kj] * total)  # softmax rule
                    for d in range(Dh):  # q.k: z-rule over d, half to each factor
                        share = q[qi, h * Dh + d] * k[kj, h * Dh + d] / (raw + eps * sgn(raw)) * R_score
                        R_q[qi, h * Dh + d] += 0.5 * share
                        R_k[kj, h * Dh + d] += 0.5 * share
    R_xq = lrp_linear(x_q, m.q_proj.weight.detach().numpy(), q, R_q, eps)
    R_xkv = lrp_linear(x_kv, m.k_proj.weight.detach().numpy(), k, R_k, eps)
    R_xkv += lrp_linear(x_kv, m.v_proj.weight.detach().numpy(), v, R_v, eps)
    return R_xq, R_xkv, head_rel


def lrp_pre_norm_block(norm, normed, x, branch_out, R_out, relevance_of_branch, rule, eps):
    """x_out = x + branch(LN(x)): -> relevance at x (both paths), plus whatever the branch returns."""
    R_x, R_branch = lrp_sum(x, branch_out, R_out, eps)
    R_normed, extra = relevance_of_branch(R_branch)
    return R_x + lrp_layer_norm(norm, x, normed, R_normed, rule, eps), extra


def explicit_lrp(model: Transformer, src, tgt_in, rule: str, eps: float):
    """Per step t of sentence 0: {type: [per layer, H sums of |R|]}, and the total relevance at the inputs.

    The model has one encoder and one decoder layer; the relevance flows top-down, block by block.
    """
    acts, probs, logits = capture(model, src, tgt_in)
    eps = 0.0 if rule == "ding" else eps
    W = model.generator.weight.detach().numpy()
    T = int(tgt_in[0].ne(PAD_ID).sum())
    enc, dec = model.encoder_layers[0], model.decoder_layers[0]
    x0, normed_e = acts[enc.self_attn_norm]
    h_e = acts[enc.self_attn.out_proj][1]
    x1 = x0 + h_e
    f_e = acts[enc.ffn.w_out][1]
    y0, normed_d = acts[dec.self_attn_norm]
    h_s = acts[dec.self_attn.out_proj][1]
    y1 = y0 + h_s
    h_c = acts[dec.cross_attn.out_proj][1]
    y2 = y1 + h_c
    f_d = acts[dec.ffn.w_out][1]
    y3, hidden = acts[model.decoder_norm]
    memory = acts[model.encoder_norm][1]

    def block(norm, x, branch_out, R, branch):
        return lrp_pre_norm_block(norm, acts[norm][1], x, branch_out, R, branch, rule, eps)

    def ffn_branch(layer):
        def branch(R_f):
            w_in_x, w_in_z = acts[layer.ffn.w_in]
            relu, out = acts[layer.ffn.w_out]
            R_relu = lrp_linear(relu, layer.ffn.w_out.weight.detach().numpy(), out, R_f, eps)  # ReLU: passes
            return lrp_linear(w_in_x, layer.ffn.w_in.weight.detach().numpy(), w_in_z, R_relu, eps), None

        return branch

    def cross_branch(R_h):
        R_q, R_mem, heads = lrp_attention(dec.cross_attn, acts, probs["dec_enc"][0], acts[dec.cross_attn_norm][1],
                                          memory, R_h, rule, eps)
        return R_q, (R_mem, heads)

    def self_branch(R_h):
        R_q, R_kv, heads = lrp_attention(dec.self_attn, acts, probs["dec_self"][0], normed_d, normed_d, R_h, rule, eps)
        return R_q + R_kv, heads

    def enc_branch(R_h):
        R_q, R_kv, heads = lrp_attention(enc.self_attn, acts, probs["enc_self"][0], normed_e, normed_e, R_h, rule, eps)
        return R_q + R_kv, heads

    results = []
    for t in range(T):
        row = logits[t].copy()
        row[PAD_ID] = row[BOS_ID] = -np.inf
        c = int(row.argmax())
        s = logits[t, c]
        R_hidden = np.zeros_like(hidden)
        for i in range(hidden.shape[1]):
            R_hidden[t, i] = hidden[t, i] * W[c, i] / (s + eps * sgn(s))  # start: R = 1 on the logit
        R = lrp_layer_norm(model.decoder_norm, y3, hidden, R_hidden, rule, eps)
        R, _ = block(dec.ffn_norm, y2, f_d, R, ffn_branch(dec))
        R, (R_mem, heads_c) = block(dec.cross_attn_norm, y1, h_c, R, cross_branch)
        R_y0, heads_s = block(dec.self_attn_norm, y0, h_s, R, self_branch)
        R = lrp_layer_norm(model.encoder_norm, acts[model.encoder_norm][0], memory, R_mem, rule, eps)
        R, _ = block(enc.ffn_norm, x1, f_e, R, ffn_branch(enc))
        R_x0, heads_e = block(enc.self_attn_norm, x0, h_e, R, enc_branch)
        results.append(({"enc_self": [heads_e], "dec_self": [heads_s], "dec_enc": [heads_c]},
                        R_x0.sum() + R_y0.sum()))
    return results


@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
@pytest.mark.parametrize("max_seeds", [1, 3, 8])  # one prefix per step, two uneven chunks, one chunk
def test_matches_explicit_per_neuron_lrp(rule, max_seeds):
    model = tiny_lrp_model(seed=3)
    src = torch.tensor([[5, 7, 9, 3]])
    tgt_in = torch.tensor([[BOS_ID, 4, 11, 6]])
    eps = 1e-2  # large enough that a missing epsilon would show
    fast = step_relevance(model, src, tgt_in, rule=rule, eps=eps, max_seeds=max_seeds)
    slow = explicit_lrp(model, src, tgt_in, rule, eps)
    assert len(slow) == 4
    for t, (heads, input_total) in enumerate(slow):
        for kind, ref in heads.items():
            np.testing.assert_allclose(fast.heads[kind][t, 0].numpy(), np.array(ref), rtol=1e-6, atol=1e-9)
        assert float(fast.cuts["enc.0"][t, 0]) == pytest.approx(input_total, rel=1e-6, abs=1e-9)


def test_forward_matches_model():
    model = tiny_lrp_model(seed=1, enc_layers=2, dec_layers=2)
    src, tgt_in = random_batch(model)
    logits, _ = model(src, tgt_in)
    logits[..., PAD_ID] = logits[..., BOS_ID] = float("-inf")
    for rule in ("ding", "attnlrp"):
        trace = lrp_forward(model, src, tgt_in, make_rules(rule))
        torch.testing.assert_close(trace.top_logit, logits.max(dim=-1).values, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Conservation


def test_conservation_exact_without_biases():
    """Bias-free: every map is linear or ignored, so each cut holds exactly the start value 1."""
    model = tiny_lrp_model(seed=2, biases=False, enc_layers=2, dec_layers=2)
    src, tgt_in = random_batch(model)
    result = step_relevance(model, src, tgt_in, rule="ding")
    assert len(result.cuts) == 6
    for name, total in result.cuts.items():
        torch.testing.assert_close(total[result.valid], torch.ones_like(total[result.valid]), rtol=0, atol=1e-9,
                                   msg=name)
    assert (result.cuts["dec.0"][~result.valid] == 0).all()  # padded steps carry nothing


def test_conservation_drift_reported_with_biases():
    model = tiny_lrp_model(seed=2, biases=True, enc_layers=2, dec_layers=2)
    src, tgt_in = random_batch(model)
    out = head_relevance(model, [(src, tgt_in)], rule="ding", log=print)
    table = out.conservation.set_index("cut")
    assert table.loc["dec.2", "max_abs_error"] < 1e-9  # the top cut lies above every bias
    assert table["max_abs_error"].max() > 1e-3  # biases absorb relevance lower down, and it shows
    assert np.isfinite(table["mean_total"]).all()


# --------------------------------------------------------------------------------------------
# Batching, padding, aggregation


@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
@pytest.mark.parametrize("max_seeds", [2, 16])
def test_invariant_to_batch_composition_and_padding(rule, max_seeds):
    model = tiny_lrp_model(seed=4, enc_layers=2, dec_layers=2)
    src, tgt_in = random_batch(model, batch=3, src_len=7, tgt_len=5)
    batch = step_relevance(model, src, tgt_in, rule=rule, max_seeds=max_seeds).normalised()
    for b in range(3):
        s, t = src[b : b + 1], tgt_in[b : b + 1]
        s, t = s[:, : int(s.ne(PAD_ID).sum())], t[:, : int(t.ne(PAD_ID).sum())]  # no padding at all
        alone = step_relevance(model, s, t, rule=rule, max_seeds=1).normalised()
        for kind in alone:
            torch.testing.assert_close(batch[kind][: t.shape[1], b], alone[kind][:, 0], rtol=1e-9, atol=1e-12)


def ragged_batch(src_lengths: list[int], tgt_lengths: list[int], seed: int):
    """A padded batch of random sentences: source lengths with EOS, target lengths with BOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.zeros(len(src_lengths), max(src_lengths), dtype=torch.long)
    tgt_in = torch.zeros(len(tgt_lengths), max(tgt_lengths), dtype=torch.long)
    for b, (s_len, t_len) in enumerate(zip(src_lengths, tgt_lengths)):
        src[b, :s_len] = torch.randint(4, 12, (s_len,), generator=g)
        tgt_in[b, 0], tgt_in[b, 1:t_len] = BOS_ID, torch.randint(4, 12, (t_len - 1,), generator=g)
    return src, tgt_in


@pytest.mark.parametrize("max_seeds", [2, 3])
def test_ragged_batch_matches_each_sentence_alone(max_seeds):
    """Target lengths 2..9 and source lengths 3..8: the set of sentences taking part (and the
    source columns they need) changes from chunk to chunk; every step, head share and cut must
    still be the sentence's own, with zeros where a sentence has no such step."""
    model = tiny_lrp_model(seed=6, enc_layers=2, dec_layers=2)
    src_lengths, tgt_lengths = [5, 3, 8, 4], [2, 9, 4, 7]  # with EOS / with BOS
    src, tgt_in = ragged_batch(src_lengths, tgt_lengths, seed=6)
    batch = step_relevance(model, src, tgt_in, max_seeds=max_seeds)
    for b, t_len in enumerate(tgt_lengths):
        s, t = src[b : b + 1, : src_lengths[b]], tgt_in[b : b + 1, :t_len]
        alone = step_relevance(model, s, t, max_seeds=1)
        for kind in alone.heads:
            torch.testing.assert_close(batch.heads[kind][:t_len, b], alone.heads[kind][:, 0], rtol=1e-9, atol=1e-12)
            assert not batch.heads[kind][t_len:, b].any()
        for cut in alone.cuts:
            torch.testing.assert_close(batch.cuts[cut][:t_len, b], alone.cuts[cut][:, 0], rtol=1e-9, atol=1e-12)
    assert torch.equal(batch.valid, tgt_in.ne(PAD_ID).T)


def test_head_relevance_averages_normalised_steps():
    model = tiny_lrp_model(seed=5, enc_layers=2, dec_layers=2, n_heads=4)
    src, tgt_in = random_batch(model)
    model.set_head_mask({"enc_self": torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])})
    out = head_relevance(model, [(src[:2], tgt_in[:2]), (src[2:], tgt_in[2:])])
    table = out.table.set_index(["type", "layer", "head"])
    steps = step_relevance(model, src, tgt_in)
    normed = steps.normalised()
    n = int(steps.valid.sum())
    assert (out.table["n_steps"] == n).all()
    for kind in normed:
        expected = normed[kind][steps.valid].mean(dim=0)  # (L, H)
        got = torch.tensor([[table.loc[(kind, layer, h), "lrp"] for h in range(4)] for layer in range(2)],
                           dtype=torch.float64)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got.sum(dim=1), torch.ones(2, dtype=torch.float64))
    assert table.loc[("enc_self", 0, 1), "lrp"] == 0.0  # a masked head receives no relevance


def test_sub_batches_regroup_every_sentence_once_without_extra_padding():
    model = tiny_lrp_model(seed=7, enc_layers=1, dec_layers=1)
    src_lengths, tgt_lengths = [5, 3, 8, 4, 2, 6, 9], [2, 9, 4, 7, 3, 3, 5]
    src, tgt_in = ragged_batch(src_lengths, tgt_lengths, seed=7)
    parts = sub_batches(model, src, tgt_in, max_tokens=16)
    assert len(parts) > 2
    seen = []
    for s, t in parts:
        assert s.shape[0] == t.shape[0]
        assert s.shape[0] == 1 or s.shape[0] * max(s.shape[1], t.shape[1]) <= 16  # the budget, longer side
        assert s[:, -1].ne(PAD_ID).any() and t[:, -1].ne(PAD_ID).any()  # cut to its longest sentence
        for row_s, row_t in zip(s, t):  # which sentence each row is: its unpadded source and target
            matches = [b for b in range(len(src_lengths))
                       if torch.equal(src[b, : src_lengths[b]], row_s[row_s.ne(PAD_ID)])
                       and torch.equal(tgt_in[b, : tgt_lengths[b]], row_t[row_t.ne(PAD_ID)])]
            seen += matches[:1]
    assert sorted(seen) == list(range(len(src_lengths)))


@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
def test_head_relevance_is_the_same_in_sub_batches(rule):
    model = tiny_lrp_model(seed=8, enc_layers=2, dec_layers=2)
    src, tgt_in = ragged_batch([5, 3, 8, 4, 2, 6, 9], [2, 9, 4, 7, 3, 3, 5], seed=8)
    whole = head_relevance(model, [(src, tgt_in)], rule=rule, max_tokens=10**6)
    parts = head_relevance(model, [(src, tgt_in)], rule=rule, max_tokens=16)
    assert whole.table["n_steps"].iloc[0] == parts.table["n_steps"].iloc[0] == int(tgt_in.ne(PAD_ID).sum())
    torch.testing.assert_close(torch.tensor(parts.table["lrp"].values), torch.tensor(whole.table["lrp"].values),
                               rtol=1e-9, atol=1e-12)
    for column in ("mean_total", "mean_abs_error", "max_abs_error"):
        torch.testing.assert_close(torch.tensor(parts.conservation[column].values),
                                   torch.tensor(whole.conservation[column].values), rtol=1e-9, atol=1e-12)


def test_unknown_rule_rejected():
    with pytest.raises(ValueError, match="unknown LRP rule"):
        make_rules("lrp-gamma")


@pytest.mark.parametrize("layers, heads", [((2, 2), 2), ((3, 1), 4), ((1, 3), 2)])
def test_hand_written_ding_backward_matches_autograd(layers, heads):
    """The hand-written "ding" backward (packed decoder rows) against autograd's, on a ragged batch
    with a closed head and a half-open gate: every step, head and cut."""
    from headcount.models.transformer_lrp import ding_step_relevance

    model = tiny_lrp_model(seed=9, enc_layers=layers[0], dec_layers=layers[1], n_heads=heads, d_model=8)
    model.set_head_mask({"dec_self": torch.ones(layers[1], heads).index_fill_(1, torch.tensor([1]), 0.0)})
    with torch.no_grad():
        model.encoder_layers[0].self_attn.out_proj.weight[:, :2] *= 0.5  # as a gate of 0.5 would
    src, tgt_in = ragged_batch([5, 3, 8, 4, 6], [2, 9, 4, 7, 1], seed=9)
    expected = step_relevance(model, src, tgt_in, max_seeds=3)
    got = ding_step_relevance(model, src, tgt_in)
    assert torch.equal(got.valid, expected.valid)
    for kind in expected.heads:
        torch.testing.assert_close(got.heads[kind], expected.heads[kind], rtol=1e-9, atol=1e-12)
    assert not got.heads["dec_self"][:, :, :, 1].any()  # the closed head
    for cut in expected.cuts:
        torch.testing.assert_close(got.cuts[cut], expected.cuts[cut], rtol=1e-9, atol=1e-12)


def test_head_relevance_uses_the_hand_written_backward_for_ding_only(monkeypatch):
    import headcount.models.transformer_lrp as headcount_lrp

    model = tiny_lrp_model(seed=10, enc_layers=1, dec_layers=1)
    src, tgt_in = ragged_batch([5, 3], [4, 2], seed=10)
    calls = []
    original = headcount_lrp.ding_step_relevance
    monkeypatch.setattr(headcount_lrp, "ding_step_relevance", lambda *a, **k: calls.append(1) or original(*a, **k))
    fast = head_relevance(model, [(src, tgt_in)], rule="ding")
    assert calls
    calls.clear()
    head_relevance(model, [(src, tgt_in)], rule="attnlrp")
    assert not calls
    reference = step_relevance(model, src, tgt_in).normalised()
    for kind, r in reference.items():
        mean = r[tgt_in.ne(PAD_ID).T].mean(dim=0)  # (L, H)
        table = fast.table[fast.table["type"] == kind].sort_values(["layer", "head"])
        torch.testing.assert_close(torch.tensor(table["lrp"].values).reshape(mean.shape), mean, rtol=1e-9, atol=1e-12)


def test_a_batch_too_large_for_the_hand_written_backward_takes_autograds(monkeypatch):
    import headcount.models.transformer_lrp as headcount_lrp

    model = tiny_lrp_model(seed=11, enc_layers=1, dec_layers=2)
    src, tgt_in = ragged_batch([5, 3, 7], [4, 6, 2], seed=11)
    hand = model.lrp_forward().ding_relevance(src, tgt_in)
    monkeypatch.setattr(headcount_lrp, "HAND_WRITTEN_MAX_BYTES", 1000)
    monkeypatch.setattr(headcount_lrp, "ding_step_relevance", lambda *a, **k: pytest.fail("hand-written path taken"))
    fallback = model.lrp_forward().ding_relevance(src, tgt_in)
    for kind in hand.heads:
        torch.testing.assert_close(fallback.heads[kind], hand.heads[kind], rtol=1e-9, atol=1e-12)
