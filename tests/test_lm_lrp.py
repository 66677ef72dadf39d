"""LRP head relevance of the language-model adapters (hf_lm_lrp.py) on tiny random GPT-2, GPT-NeoX,
OPT, Llama, Qwen2, Qwen3, BERT and RoBERTa models: the LRP forward pass against the model, an explicit
per-neuron LRP (GPT-2 and Llama, both rules) on activations captured from transformers' own forward pass,
conservation per rule, batching, and head_relevance on each kind. The comparison with lxt's AttnLRP
is tools/crosscheck_lxt.py (lxt 2.1 does not import with this project's transformers)."""

import numpy as np
import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import module_state  # noqa: E402
from test_hf_lm import DECODERS, FAMILIES, _write, adapter, batch, real, run  # noqa: E402
from test_lrp import lrp_layer_norm, lrp_linear, lrp_sum, sgn  # noqa: E402  the same explicit reference

from headcount.analysis.relevance import head_relevance  # noqa: E402
from headcount.io import HeadcountError  # noqa: E402
from headcount.models import hf_lm  # noqa: E402
from headcount.models.lrp import lrp_forward, make_rules, masked_step_relevance, step_relevance  # noqa: E402
from headcount.testing import tiny_lm  # noqa: E402

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it trains, or loads real weights

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def lines():
    from conftest import toy_corpus

    src, tgt = toy_corpus(60, seed=5)
    return src + tgt


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, lines):
    return {family: _write(family, tmp_path_factory.mktemp(family), lines) for family in FAMILIES}


def lm(tiny_dirs, family: str):
    """The adapter over the tiny model, norms and biases randomised (test_hf_lm.adapter), float64.
    Qwen starts from its padding id, whose embedding row transformers initialises to zero (a trained
    Qwen's is not): without attention biases (Qwen3) position 0 would have a zero logit, nothing to
    explain, so that row is drawn at random."""
    model = adapter(tiny_dirs, family).double()
    with torch.no_grad():
        embeddings = model.hf.get_input_embeddings().weight
        embeddings[model.special.bos] = torch.randn(embeddings.shape[1], generator=torch.Generator().manual_seed(0),
                                                    dtype=embeddings.dtype)
    return model


def inputs(model, x):
    """(src, tgt_in) of a batch of rows x, by kind."""
    empty = x.new_zeros(x.shape[0], 0)
    return (x, empty) if model.model_kind == "encoder_only" else (empty, x)


def zero_biases(model):
    with torch.no_grad():
        for name, p in model.hf.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return model


# --------------------------------------------------------------------------------------------
# The LRP forward pass is the model's


@pytest.mark.parametrize("family", FAMILIES)
def test_lrp_forward_matches_the_model(tiny_dirs, family):
    model = lm(tiny_dirs, family)
    x = batch(model)
    logits, _ = run(model, x)
    logits[..., list(model.special.never_generated())] = float("-inf")
    best = logits.max(dim=-1)
    where = real(model, x)
    # Llama/Qwen, GPT-NeoX, OPT: transformers' eager softmax runs in float32 even in a float64 model.
    tol = 1e-7 if family in ("gpt_neox", "opt", "llama", "qwen2", "qwen3") else 1e-12
    for rule in ("ding", "attnlrp"):
        trace = lrp_forward(model, *inputs(model, x), make_rules(rule))
        torch.testing.assert_close(trace.top_logit[where], best.values[where], rtol=tol, atol=tol)
        assert torch.equal(trace.target[where], best.indices[where])
        types = set(trace.contexts)
        assert types == {"dec_self" if family in DECODERS else "enc_self"}


# --------------------------------------------------------------------------------------------
# An explicit LRP, one neuron at a time, on one-layer models


def one_layer(tmp_path, lines, family: str):
    """GPT-2 (d 8, 2 heads) or Llama (d 8, 4 query heads sharing 2 KV heads, Dh 2), one layer,
    norms and biases randomised, float64."""
    if family == "gpt2":
        directory = tiny_lm.write_tiny_gpt2(tmp_path / family, lines, d_model=8, layers=1, heads=2, seed=3)
    else:
        directory = tiny_lm.write_tiny_llama(tmp_path / family, lines, d_model=8, layers=1, heads=4, kv_heads=2,
                                                ffn=16, seed=3)
    return adapter({family: directory}, family).double()


def capture(model, modules: dict[str, nn.Module], x):
    """name -> (input, output) of each module for sentence 0, as numpy; and the final logits."""
    acts, hooks = {}, []
    for name, module in modules.items():
        hooks.append(module.register_forward_hook(
            lambda mod, inp, out, name=name: acts.__setitem__(name, (inp[0][0].detach().numpy(),
                                                                      out[0].detach().numpy()))))
    with torch.no_grad():
        logits, _ = run(model, x)
    for h in hooks:
        h.remove()
    return acts, logits[0].numpy()


def explicit_attention(q, k, v, R_ctx, kv_of, scaling, rule, eps):
    """Relevance through one causal attention, neuron by neuron: q (T, H*Dh) (after rotary), k and v
    (T, KV*Dh), R_ctx (T, H*Dh) -> R_q, R_k, R_v. Probabilities from q and k, float64."""
    T, H = q.shape[0], len(kv_of)
    Dh = q.shape[1] // H
    R_q, R_k, R_v = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(H):
        g = kv_of[h]
        qh, kh, vh = q[:, h * Dh:(h + 1) * Dh], k[:, g * Dh:(g + 1) * Dh], v[:, g * Dh:(g + 1) * Dh]
        raw = qh @ kh.T  # (T, T)
        scores = np.where(np.tril(np.ones((T, T))) > 0, raw * scaling, -np.inf)
        P = np.exp(scores - scores.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        R_P = np.zeros((T, T))
        for qi in range(T):
            for d in range(Dh):
                context = sum(P[qi, kj] * vh[kj, d] for kj in range(T))
                for kj in range(qi + 1):
                    share = P[qi, kj] * vh[kj, d] / (context + eps * sgn(context)) * R_ctx[qi, h * Dh + d]
                    if rule == "ding":
                        R_v[kj, g * Dh + d] += share  # probabilities constant: all relevance to V
                    else:
                        R_v[kj, g * Dh + d] += 0.5 * share
                        R_P[qi, kj] += 0.5 * share
        if rule == "attnlrp":
            for qi in range(T):
                total = R_P[qi].sum()
                for kj in range(qi + 1):
                    R_score = scores[qi, kj] * (R_P[qi, kj] - P[qi, kj] * total)  # softmax rule
                    for d in range(Dh):  # q.k: z-rule over d (epsilon on q.k), half to each factor
                        share = qh[qi, d] * kh[kj, d] / (raw[qi, kj] + eps * sgn(raw[qi, kj])) * R_score
                        R_q[qi, h * Dh + d] += 0.5 * share
                        R_k[kj, g * Dh + d] += 0.5 * share
    return R_q, R_k, R_v


def head_sums(R_ctx, H):
    Dh = R_ctx.shape[1] // H
    return [float(np.abs(R_ctx[:, h * Dh:(h + 1) * Dh]).sum()) for h in range(H)]


def start_relevance(hidden, W, logits, t, special, eps):
    """R at the final hidden state for relevance 1 on the top-1 logit of step t (no output bias)."""
    row = logits[t].copy()
    row[list(special.never_generated())] = -np.inf
    c = int(row.argmax())
    s = logits[t, c]
    R = np.zeros_like(hidden)
    R[t] = hidden[t] * W[c] / (s + eps * sgn(s))
    return R


def explicit_gpt2(model, x, rule, eps):
    """Per step t of sentence 0: (H head sums, total R at the stream after the layer, at the input)."""
    base, slot = model.hf.base_model, model.attention_modules()["dec_self"][0]
    block = base.h[0]
    acts, logits = capture(model, {"ln_1": block.ln_1, "c_attn": block.attn.c_attn, "o": slot.proj,
                                   "ln_2": block.ln_2, "c_fc": block.mlp.c_fc, "proj": block.mlp.c_proj,
                                   "ln_f": base.ln_f}, x)
    eps = 0.0 if rule == "ding" else eps
    x0, n1 = acts["ln_1"]
    ctx, a = acts["o"]
    x1, n2 = acts["ln_2"]
    pre = acts["c_fc"][1]
    act, m = acts["proj"]
    x2, hidden = acts["ln_f"]
    qkv = acts["c_attn"][1]
    D = qkv.shape[1] // 3
    q, k, v = qkv[:, :D], qkv[:, D:2 * D], qkv[:, 2 * D:]
    weight = lambda conv: conv.weight.detach().numpy().T  # noqa: E731  Conv1D (in, out) -> (out, in)
    W = model.hf.lm_head.weight.detach().numpy()
    out = []
    for t in range(x.shape[1]):
        R_hidden = start_relevance(hidden, W, logits, t, model.special, eps)
        R_x2 = lrp_layer_norm(base.ln_f, x2, hidden, R_hidden, rule, eps)
        R_x1, R_m = lrp_sum(x1, m, R_x2, eps)
        R_pre = lrp_linear(act, weight(block.mlp.c_proj), m, R_m, eps)  # GELU: passes through
        R_x1 = R_x1 + lrp_layer_norm(block.ln_2, x1, n2, lrp_linear(n2, weight(block.mlp.c_fc), pre, R_pre, eps),
                                     rule, eps)
        R_x0, R_a = lrp_sum(x0, a, R_x1, eps)
        R_ctx = lrp_linear(ctx, slot.proj.weight.detach().numpy(), a, R_a, eps)
        R_q, R_k, R_v = explicit_attention(q, k, v, R_ctx, [0, 1], block.attn.scaling, rule, eps)
        R_n1 = lrp_linear(n1, weight(block.attn.c_attn), qkv, np.concatenate([R_q, R_k, R_v], axis=1), eps)
        R_x0 = R_x0 + lrp_layer_norm(block.ln_1, x0, n1, R_n1, rule, eps)
        out.append((head_sums(R_ctx, 2), R_x2.sum(), R_x0.sum()))
    return out


def rms_relevance(y, R_y, rule, eps):
    """RMSNorm y = w x / rms(x): ding passes R through; attnlrp holds rms constant, a diagonal
    linear map, epsilon rule: R_x = y / (y + eps sgn y) R_y."""
    if rule == "ding":
        return R_y.copy()
    sign = np.where(y >= 0, 1.0, -1.0)
    return y / (y + eps * sign) * R_y


def rotary_matrix(cos, sin):
    """The rotary map of one position as a (Dh, Dh) matrix M, rotated = M @ x."""
    Dh = len(cos)
    half = Dh // 2
    M = np.diag(cos).astype(float)
    for j in range(half):
        M[j, j + half] = -sin[j]
        M[j + half, j] = sin[j + half]
    return M


def explicit_llama(model, x, rule, eps):
    base, slot = model.hf.base_model, model.attention_modules()["dec_self"][0]
    layer = base.layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    acts, logits = capture(model, {"in_norm": layer.input_layernorm, "q": attention.q_proj, "k": attention.k_proj,
                                   "v": attention.v_proj, "o": slot.proj, "post_norm": layer.post_attention_layernorm,
                                   "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj,
                                   "norm": base.norm}, x)
    eps = 0.0 if rule == "ding" else eps
    T, Dh = x.shape[1], slot.head_dim
    x0, n1 = acts["in_norm"]
    q_raw, k_raw, v = acts["q"][1], acts["k"][1], acts["v"][1]
    ctx, a = acts["o"]
    x1, n2 = acts["post_norm"]
    gate, up = acts["gate"][1], acts["up"][1]
    prod, m = acts["down"]
    x2, hidden = acts["norm"]
    with torch.no_grad():
        cos, sin = base.rotary_emb(torch.zeros(1, T, 8, dtype=torch.float64), torch.arange(T)[None])
    rot = [rotary_matrix(cos[0, t].numpy(), sin[0, t].numpy()) for t in range(T)]

    def rotate(z):  # (T, n*Dh), each head's Dh features rotated by its position's matrix
        return np.stack([np.concatenate([rot[t] @ z[t, i:i + Dh] for i in range(0, z.shape[1], Dh)])
                         for t in range(T)])

    def unrotate_relevance(z, z_rot, R_rot):  # z-rule through the rotary map (no bias, no epsilon)
        R = np.zeros_like(z)
        for t in range(T):
            for i0 in range(0, z.shape[1], Dh):
                for i in range(Dh):
                    for j in range(Dh):
                        if R_rot[t, i0 + j] != 0:
                            R[t, i0 + i] += z[t, i0 + i] * rot[t][j, i] / z_rot[t, i0 + j] * R_rot[t, i0 + j]
        return R

    q, k = rotate(q_raw), rotate(k_raw)
    W = lambda lin: lin.weight.detach().numpy()  # noqa: E731
    out = []
    for t in range(T):
        R_hidden = start_relevance(hidden, W(model.hf.lm_head), logits, t, model.special, eps)
        R_x2 = rms_relevance(hidden, R_hidden, rule, eps)
        R_x1, R_m = lrp_sum(x1, m, R_x2, eps)
        R_prod = lrp_linear(prod, W(mlp.down_proj), m, R_m, eps)
        R_gate, R_up = 0.5 * R_prod, 0.5 * R_prod  # the product: half to each factor; SiLU passes through
        R_n2 = lrp_linear(n2, W(mlp.gate_proj), gate, R_gate, eps) + lrp_linear(n2, W(mlp.up_proj), up, R_up, eps)
        R_x1 = R_x1 + rms_relevance(n2, R_n2, rule, eps)
        R_x0, R_a = lrp_sum(x0, a, R_x1, eps)
        R_ctx = lrp_linear(ctx, W(slot.proj), a, R_a, eps)
        R_q, R_k, R_v = explicit_attention(q, k, v, R_ctx, slot.kv_of, attention.scaling, rule, eps)
        R_n1 = (lrp_linear(n1, W(attention.q_proj), q_raw, unrotate_relevance(q_raw, q, R_q), eps)
                + lrp_linear(n1, W(attention.k_proj), k_raw, unrotate_relevance(k_raw, k, R_k), eps)
                + lrp_linear(n1, W(attention.v_proj), v, R_v, eps))
        R_x0 = R_x0 + rms_relevance(n1, R_n1, rule, eps)
        out.append((head_sums(R_ctx, slot.n_heads), R_x2.sum(), R_x0.sum()))
    return out


@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_matches_explicit_per_neuron_lrp(tmp_path, lines, family, rule, record_property):
    model = one_layer(tmp_path, lines, family)
    x = batch(model, lengths=(4,), seed=2)  # BOS + 4 tokens
    eps = 1e-2  # large enough that a missing epsilon would show
    fast = step_relevance(model, *inputs(model, x), rule=rule, eps=eps, max_seeds=2)
    slow = (explicit_gpt2 if family == "gpt2" else explicit_llama)(model, x, rule, eps)
    assert len(slow) == x.shape[1]
    errors = []
    for t, (heads, top_total, input_total) in enumerate(slow):
        got = fast.heads["dec_self"][t, 0, 0].numpy()
        errors.append(float(np.abs(got - heads).max() / max(np.abs(heads).max(), 1e-12)))
        np.testing.assert_allclose(got, heads, rtol=1e-6, atol=1e-9)
        assert float(fast.cuts["dec.1"][t, 0]) == pytest.approx(top_total, rel=1e-6, abs=1e-9)
        assert float(fast.cuts["dec.0"][t, 0]) == pytest.approx(input_total, rel=1e-6, abs=1e-9)
    record_property("max_relative_error", max(errors))


# --------------------------------------------------------------------------------------------
# Conservation


@pytest.mark.parametrize("family", FAMILIES)
def test_ding_conserves_exactly_without_biases(tiny_dirs, family):
    """Bias-free, the paper's rule is linear throughout (norms and activations pass relevance
    through, the probabilities are constant, the gated product halves): every cut holds 1."""
    model = zero_biases(lm(tiny_dirs, family))
    x = batch(model)
    result = step_relevance(model, *inputs(model, x), rule="ding")
    prefix = "enc" if family not in DECODERS else "dec"
    assert sorted(result.cuts) == [f"{prefix}.{i}" for i in range(3)]
    for name, total in result.cuts.items():
        torch.testing.assert_close(total[result.valid], torch.ones_like(total[result.valid]), rtol=0, atol=1e-9,
                                   msg=name)
    for total in result.cuts.values():
        assert (total[~result.valid] == 0).all()  # steps that do not exist carry nothing


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_attnlrp_conservation_is_reported_per_cut(tiny_dirs, family):
    """AttnLRP, bias-free: the top cut holds 1 up to epsilon (the final norm is a bias-free linear
    map once its scale is constant; above BERT's top cut the MLM head's dense, LayerNorm and decoder
    are too), so its error shrinks with epsilon; the softmax rule on the q/k path is not
    conservative, so lower cuts drift whatever epsilon, and head_relevance reports it."""
    model = zero_biases(lm(tiny_dirs, family))
    x = batch(model)
    prefix = "enc" if family not in DECODERS else "dec"
    top = {}
    for eps in (1e-6, 1e-9):
        out = head_relevance(model, [(*inputs(model, x), None)], rule="attnlrp", eps=eps)
        table = out.conservation.set_index("cut")
        assert list(table.index) == [f"{prefix}.{i}" for i in (2, 1, 0)]
        assert (table["rule"] == "attnlrp").all()
        top[eps] = table.loc[f"{prefix}.2", "max_abs_error"]
        # far beyond epsilon's share (BERT's near-uniform random attention drifts least: 9e-4)
        assert table["max_abs_error"].max() > 1e-4
    assert top[1e-6] < 1e-4 and top[1e-9] < 1e-7


# --------------------------------------------------------------------------------------------
# Batching and head_relevance


@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
@pytest.mark.parametrize("family", ["gpt2", "qwen3", "roberta"])
def test_batch_equals_each_sentence_alone(tiny_dirs, family, rule):
    model = lm(tiny_dirs, family)
    x = batch(model, lengths=(7, 5, 3), seed=4)
    whole = step_relevance(model, *inputs(model, x), rule=rule, max_seeds=3)
    kind = next(iter(whole.heads))
    for b in range(x.shape[0]):
        row = x[b:b + 1, : int(real(model, x)[b].sum())]
        alone = step_relevance(model, *inputs(model, row), rule=rule, max_seeds=1)
        n = row.shape[1]
        torch.testing.assert_close(whole.heads[kind][:n, b], alone.heads[kind][:, 0], rtol=1e-9, atol=1e-12)
        assert torch.equal(whole.valid[:n, b], alone.valid[:, 0])
        for cut in alone.cuts:
            torch.testing.assert_close(whole.cuts[cut][:n, b], alone.cuts[cut][:, 0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_head_relevance_on_language_models(tiny_dirs, family):
    """Rows for the model's own attention type only, normalised per layer, one step per next-token
    prediction (decoder-only) or per masked position (encoder-only); a masked head gets nothing."""
    model = lm(tiny_dirs, family)
    kind = "dec_self" if family in DECODERS else "enc_self"
    model.set_head_mask({kind: torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])})
    x = batch(model, lengths=(7, 5, 3, 6), seed=1)
    out = head_relevance(model, [(*inputs(model, x[:2]), None), (*inputs(model, x[2:]), None)], rule="ding")
    table = out.table
    assert set(table["type"]) == {kind} and len(table) == 2 * 4
    expected_steps = int(real(model, x).sum()) if family in DECODERS else int(x.eq(model.special.mask).sum())
    assert (table["n_steps"] == expected_steps).all()
    sums = table.groupby("layer")["lrp"].sum()
    np.testing.assert_allclose(sums.values, 1.0, rtol=1e-9)
    assert table.set_index(["layer", "head"]).loc[(0, 1), "lrp"] == 0.0
    assert len(out.conservation) == 3


def test_masked_positions_are_the_steps(tiny_dirs):
    model = lm(tiny_dirs, "bert")
    x = batch(model, lengths=(6, 4), seed=3)
    result = masked_step_relevance(model, x, rule="attnlrp", max_seeds=1)
    assert torch.equal(result.valid, x.eq(model.special.mask).T)
    assert (result.heads["enc_self"][~result.valid] == 0).all()
    assert (result.heads["enc_self"][result.valid].sum(dim=-1) > 0).all()


def test_a_sliding_window_is_refused(tiny_dirs):
    model = lm(tiny_dirs, "qwen2")
    model.config.use_sliding_window, model.config.sliding_window = True, 4
    with pytest.raises(HeadcountError, match="sliding-window"):
        model.lrp_forward()
    assert isinstance(hf_lm.LRPNotImplemented("x"), NotImplementedError)


def test_pruned_grouped_query_heads_read_their_kv_head(tiny_dirs):
    """After keep_heads a GQA layer maps each query head to its KV head explicitly (kv_of): the
    LRP forward still reproduces the model, and each remaining head keeps its relevance."""
    model = lm(tiny_dirs, "llama")
    model.attention_modules()["dec_self"][0].keep_heads([1, 2])  # one query head of each KV group
    x = batch(model)
    logits, _ = run(model, x)
    logits[..., list(model.special.never_generated())] = float("-inf")
    where = real(model, x)
    trace = lrp_forward(model, *inputs(model, x), make_rules("attnlrp"))
    torch.testing.assert_close(trace.top_logit[where], logits.max(dim=-1).values[where], rtol=1e-7, atol=1e-7)
    assert trace.contexts["dec_self"][0].shape[1] == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_module_level_rules_leave_the_model_as_it_was(tiny_dirs, family):
    """LRP runs transformers' own forward with the rule on its modules (hf_lm_lrp._module_rules),
    recomputed layers included: afterwards no module keeps a forward, hook or config of the pass, and
    the model computes what it did."""
    model = lm(tiny_dirs, family)
    x = batch(model)
    before, _ = run(model, x)

    def state():
        return module_state(model.hf)

    kept = state()
    for rule in ("ding", "attnlrp"):
        step_relevance(model, *inputs(model, x), rule=rule, max_seeds=4, recompute=True)
    assert state() == kept
    after, _ = run(model, x)
    assert torch.equal(before, after)
    assert {m.config._attn_implementation for m in model.hf.modules() if hasattr(m, "config")} == {"eager"}


def test_attnlrp_agrees_with_lxt():
    """tools/crosscheck_lxt.py in a process of its own (lxt's patches change transformers' and
    torch's forward passes for good): with a negligible epsilon, headcount's attnlrp and lxt's AttnLRP
    give the same relevance at every head context and residual stream of GPT-2 and Llama. Runs only
    in .venv-crosscheck, which make test builds (lxt does not go into the project's venv: see the tool's docstring)."""
    import os
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    python = root / ".venv-crosscheck" / "bin" / "python"  # make crosscheck-venv: lxt beside the project
    if not python.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{python} is missing: make test builds it (make crosscheck-venv)")
        pytest.skip(f"{python} is missing (make crosscheck-venv builds it)")
    run_tool = subprocess.run([str(python), str(root / "tools" / "crosscheck_lxt.py")], capture_output=True,
                              text=True, cwd=root, timeout=600, env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert run_tool.returncode == 0, run_tool.stderr[-2000:]
    found = re.findall(r"^(\w+) eps=1e-12: max abs error (\S+), max relative error (\S+)$", run_tool.stdout, re.M)
    assert {family for family, _, _ in found} == {"gpt2", "llama"}
    for _, _, relative in found:
        assert float(relative) < 1e-6  # Llama: transformers' float32 softmax and RMSNorm in a float64 model
