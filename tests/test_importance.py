"""Head confidence, Michel importance, single-head ablation and Spearman against independent computations."""

import math
import random

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from headcount.analysis.correlations import rank_correlations, spearman
from headcount.analysis.importance import (
    confidence_masks,
    confidence_sums,
    dev_batches,
    head_ablation,
    head_confidence,
    mean_nll,
    michel_importance,
)
from headcount.analysis.measures import ScoringInputs, score_table
from headcount.data.batching import source_tensor, target_tensors
from headcount.data.subwords import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS
from headcount.models.transformer import Transformer

torch.set_num_threads(1)

SRC = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [4]]
TGT = [[4, 5, 6, 7], [8], [9, 10, 11], [12, 13]]


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    settings = dict(d_model=8, n_heads=2, d_ff=16, enc_layers=2, dec_layers=2)
    settings.update(overrides)
    model = Transformer(tiny_config(**settings)).double().eval()
    with torch.no_grad():  # non-zero biases, so nothing is special about zero
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def padded_batches():
    """Two padded batches of the toy set (src, tgt_in, tgt_out)."""
    out = []
    for rows in ([0, 1], [2, 3]):
        tgt_in, tgt_out = target_tensors([TGT[i] for i in rows], SPECIAL_IDS)
        out.append((source_tensor([SRC[i] for i in rows], SPECIAL_IDS), tgt_in, tgt_out))
    return out


# --------------------------------------------------------------------------------------------
# Confidence


def test_confidence_on_hand_made_maps():
    # One sentence "a b EOS PAD": queries a, b count; the EOS row and the PAD row do not.
    src = torch.tensor([[5, 6, EOS_ID, PAD_ID]])
    probs = torch.zeros(1, 2, 4, 4)
    probs[0, 0, 0] = torch.tensor([0.2, 0.1, 0.7, 0.0])  # max excluding EOS: 0.2 (EOS's 0.7 ignored)
    probs[0, 0, 1] = torch.tensor([0.5, 0.3, 0.2, 0.0])  # 0.5
    probs[0, 0, 2] = torch.tensor([0.0, 0.0, 1.0, 0.0])  # EOS query: not counted
    probs[0, 0, 3] = torch.tensor([0.9, 0.1, 0.0, 0.0])  # padding query: not counted
    probs[0, 1, 0] = torch.tensor([0.0, 0.0, 1.0, 0.0])  # everything on EOS: max over the rest is 0
    probs[0, 1, 1] = torch.tensor([0.1, 0.8, 0.1, 0.0])  # 0.8
    probs[0, 1, 2:] = 0.25
    query_keep, key_keep = confidence_masks(src, torch.tensor([[BOS_ID]]), SPECIAL_IDS)["enc_self"]
    sums, n = confidence_sums(probs, query_keep, key_keep)
    assert n == 2
    torch.testing.assert_close(sums / n, torch.tensor([(0.2 + 0.5) / 2, (0.0 + 0.8) / 2]))


def test_confidence_pools_tokens_not_sentences():
    # Sentence 1 has 1 query (max 1.0), sentence 2 has 3 queries (max 0.4 each):
    # pooled (1 + 3 * 0.4) / 4 = 0.55, whereas averaging sentences first would give 0.7.
    src = torch.tensor([[5, EOS_ID, PAD_ID, PAD_ID], [5, 6, 7, EOS_ID]])
    probs = torch.zeros(2, 1, 4, 4)
    probs[0, 0, 0, 0] = 1.0
    probs[1, 0, :3, :3] = torch.tensor([0.4, 0.3, 0.3])
    q, k = confidence_masks(src, torch.tensor([[BOS_ID], [BOS_ID]]), SPECIAL_IDS)["enc_self"]
    sums, n = confidence_sums(probs, q, k)
    assert n == 4
    assert float(sums[0] / n) == pytest.approx(0.55)


def test_decoder_self_attention_bos_option():
    tgt_in = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, PAD_ID]])
    src = torch.tensor([[5, EOS_ID], [6, EOS_ID]])
    q, k = confidence_masks(src, tgt_in, SPECIAL_IDS)["dec_self"]
    assert q.tolist() == [[True, True, True], [True, True, False]] and k.tolist() == q.tolist()
    q, k = confidence_masks(src, tgt_in, SPECIAL_IDS, exclude_bos_in_dec_self=True)["dec_self"]
    assert q.tolist() == [[False, True, True], [False, True, False]]
    assert k.tolist() == [[False, True, True], [False, True, False]]
    q, k = confidence_masks(src, tgt_in, SPECIAL_IDS)["dec_enc"]
    assert q.tolist() == [[True, True, True], [True, True, False]] and k.tolist() == [[True, False], [True, False]]


def brute_force_confidence(model, kind, layer, head):
    """One sentence at a time, no padding, plain Python max over the allowed keys."""
    total, count = 0.0, 0
    for s, t in zip(SRC, TGT):
        src, (tgt_in, _) = source_tensor([s], SPECIAL_IDS), target_tensors([t], SPECIAL_IDS)
        with torch.no_grad():
            _, att = model(src, tgt_in, need_weights=True)
        p = att[kind][layer][0, head]
        queries = src[0].tolist() if kind == "enc_self" else tgt_in[0].tolist()
        keys = src[0].tolist() if kind != "dec_self" else tgt_in[0].tolist()
        for qi, q_tok in enumerate(queries):
            if kind == "enc_self" and q_tok == EOS_ID:
                continue
            kept = [kj for kj, k_tok in enumerate(keys) if kind == "dec_self" or k_tok != EOS_ID]
            weights = [float(p[qi, kj]) for kj in kept]
            total, count = total + max(weights), count + 1
    return total / count


def test_head_confidence_matches_brute_force():
    model = tiny_model()
    table = head_confidence(model, padded_batches()).set_index(["type", "layer", "head"])
    assert len(table) == 3 * 2 * 2
    for kind in ("enc_self", "dec_self", "dec_enc"):
        for layer in range(2):
            for head in range(2):
                expected = brute_force_confidence(model, kind, layer, head)
                assert table.loc[(kind, layer, head), "confidence"] == pytest.approx(expected, rel=1e-9)


# --------------------------------------------------------------------------------------------
# Michel et al. importance


def scaled_head_loss(model, batch, kind, layer, head, row, pos, factor):
    """Summed NLL with one head's context at one token multiplied by `factor` (a forward hook)."""
    module = model.attention_modules()[kind][layer]

    def hook(mod, inputs, output):
        output = output.clone()
        output[row, head, pos] *= factor
        return output

    handle = module.head_context.register_forward_hook(hook)
    try:
        src, tgt_in, tgt_out = batch
        with torch.no_grad():
            logits, _ = model(src, tgt_in)
        real = tgt_out.ne(PAD_ID)
        return float(F.cross_entropy(logits[real], tgt_out[real], reduction="sum"))
    finally:
        handle.remove()


@pytest.mark.slow
def test_michel_importance_matches_finite_differences():
    """<ctx, dL/dctx> at a token is the derivative of L when that context is scaled by (1 + d)."""
    model = tiny_model(seed=1)
    batches = padded_batches()
    table = michel_importance(model, batches).set_index(["type", "layer", "head"])
    delta = 1e-5
    for kind in ("enc_self", "dec_self", "dec_enc"):
        raw = np.zeros((2, 2))
        tokens = 0
        for batch in batches:
            queries = batch[0] if kind == "enc_self" else batch[1]
            for row, pos in queries.ne(PAD_ID).nonzero().tolist():
                tokens += 1
                for layer in range(2):
                    for head in range(2):
                        up = scaled_head_loss(model, batch, kind, layer, head, row, pos, 1 + delta)
                        down = scaled_head_loss(model, batch, kind, layer, head, row, pos, 1 - delta)
                        raw[layer, head] += abs((up - down) / (2 * delta))
        raw /= tokens
        for layer in range(2):
            for head in range(2):
                assert table.loc[(kind, layer, head), "michel_raw"] == pytest.approx(raw[layer, head], rel=1e-6)
                normed = raw[layer, head] / np.linalg.norm(raw[layer])
                assert table.loc[(kind, layer, head), "michel"] == pytest.approx(normed, rel=1e-6)


# --------------------------------------------------------------------------------------------
# Ablation


def loss_with_head_zeroed(model, batches, kind=None, layer=None, head=None):
    """Mean per-token NLL with one head's output zeroed by hand (a hook, not the mask buffers)."""
    handle = None
    if kind is not None:
        def hook(mod, inputs, output):
            output = output.clone()
            output[:, head] = 0.0
            return output

        handle = model.attention_modules()[kind][layer].head_context.register_forward_hook(hook)
    total, n = 0.0, 0
    try:
        for src, tgt_in, tgt_out in batches:
            for b in range(src.shape[0]):  # one sentence at a time, token by token
                with torch.no_grad():
                    logits, _ = model(src[b : b + 1], tgt_in[b : b + 1])
                logp = logits[0].log_softmax(dim=-1)
                for t, tok in enumerate(tgt_out[b].tolist()):
                    if tok != PAD_ID:
                        total, n = total - float(logp[t, tok]), n + 1
    finally:
        if handle is not None:
            handle.remove()
    return total / n


def test_ablation_equals_loss_change_of_zeroing_the_head():
    model = tiny_model(seed=2)
    batches = padded_batches()
    model.set_head_mask({"dec_enc": torch.tensor([[1.0, 0.0], [1.0, 1.0]])})  # one head already pruned
    calls = []

    def fake_bleu(m):
        calls.append(m.head_mask()["enc_self"].clone())
        return 30.0 - float((m.head_mask()["enc_self"] == 0).sum()) * (1 + m.head_mask()["enc_self"][0, 0])

    table = head_ablation(model, batches, bleu_fn=fake_bleu).set_index(["type", "layer", "head"])
    base = loss_with_head_zeroed(model, batches)
    assert table.attrs["base_loss"] == pytest.approx(base, rel=1e-9)
    for kind in ("enc_self", "dec_self", "dec_enc"):
        for layer in range(2):
            for head in range(2):
                got = table.loc[(kind, layer, head), "delta_loss"]
                if (kind, layer, head) == ("dec_enc", 0, 1):
                    assert math.isnan(got)  # already masked: nothing to ablate
                    continue
                expected = loss_with_head_zeroed(model, batches, kind, layer, head) - base
                assert got == pytest.approx(expected, rel=1e-7, abs=1e-12)
    assert table.loc[("enc_self", 0, 0), "delta_bleu"] == pytest.approx(-1.0)  # 30 - 1*(1+0) - 30
    assert table.loc[("enc_self", 1, 1), "delta_bleu"] == pytest.approx(-2.0)
    assert table.loc[("dec_self", 0, 0), "delta_bleu"] != table.loc[("dec_self", 0, 0), "delta_bleu"]  # NaN
    assert len(calls) == 1 + 4
    assert model.head_mask()["dec_enc"].tolist() == [[1.0, 0.0], [1.0, 1.0]]  # masks restored
    assert model.head_mask()["enc_self"].eq(1).all()


def test_mean_nll_ignores_batching():
    model = tiny_model(seed=3)
    one_batch = dev_batches(SRC, TGT, max_tokens=10_000, special=SPECIAL_IDS)
    assert len(one_batch) == 1
    assert mean_nll(model, one_batch) == pytest.approx(mean_nll(model, padded_batches()), rel=1e-12)


# --------------------------------------------------------------------------------------------
# Spearman


def brute_force_spearman(x, y):
    def ranks(v):  # 1-based, ties share the mean of the ranks they occupy
        return [1 + sum(w < a for w in v) + (sum(w == a for w in v) - 1) / 2 for a in v]

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


@pytest.mark.parametrize("seed", range(5))
def test_spearman_matches_brute_force(seed):
    rng = random.Random(seed)
    x = [rng.randint(0, 5) for _ in range(12)]  # with ties
    y = [rng.random() + 0.3 * a for a in x]
    assert spearman(x, y) == pytest.approx(brute_force_spearman(x, y), abs=1e-12)
    u = rng.sample(range(100), 10)  # no ties: the textbook formula holds
    v = rng.sample(range(100), 10)
    rank_u = {a: i + 1 for i, a in enumerate(sorted(u))}
    rank_v = {a: i + 1 for i, a in enumerate(sorted(v))}
    d2 = sum((rank_u[a] - rank_v[b]) ** 2 for a, b in zip(u, v))
    assert spearman(u, v) == pytest.approx(1 - 6 * d2 / (10 * (10**2 - 1)), abs=1e-12)


def test_spearman_edge_cases():
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert spearman([1, 2, np.nan, 3], [1, 2, 9, 3]) == pytest.approx(1.0)


def test_rank_correlations_per_layer_and_overall():
    model = tiny_model(seed=4)
    table = score_table(ScoringInputs(model, padded_batches(), [b[:2] for b in padded_batches()]))
    assert {"confidence", "michel", "lrp", "delta_loss", "delta_bleu"} <= set(table.columns)
    corr = rank_correlations(table)
    assert len(corr) == 3 * 3 * (2 + 1)  # scores x types x (layers + all)
    row = corr[(corr.type == "enc_self") & (corr.layer == "all") & (corr.score == "michel")].iloc[0]
    sub = table[table.type == "enc_self"]
    assert row.n == 4
    assert row.spearman == pytest.approx(brute_force_spearman(sub.michel.tolist(), sub.delta_loss.tolist()))


def test_a_measure_registered_once_reaches_the_score_table_correlations_and_figures(monkeypatch):
    """A new measure is one Measure in the registry: the score table gets its columns, the
    correlations rank it against ablation and the workflow draws its heatmaps."""
    from headcount.analysis import measures

    def head_norm(inputs):  # each head's share of W^O's norm
        rows = []
        for kind, modules in inputs.model.attention_modules().items():
            for layer, m in enumerate(modules):
                norms = m.out_proj.weight.detach().view(-1, m.n_heads, m.head_dim).norm(dim=(0, 2))
                rows += [{"type": kind, "layer": layer, "head": h, "w_o_norm": float(v)} for h, v in enumerate(norms)]
        return pd.DataFrame(rows)

    monkeypatch.setitem(measures.MEASURES, "w_o_norm", measures.Measure("w_o_norm", ("w_o_norm",), head_norm))
    model = tiny_model(seed=4)
    table = measures.score_table(ScoringInputs(model, padded_batches(), [b[:2] for b in padded_batches()]),
                                 ["confidence", "w_o_norm", "ablation"])
    assert list(table.columns) == ["type", "layer", "head", "confidence", "delta_loss", "delta_bleu", "delta_loss_low",
                                   "delta_loss_high", "w_o_norm"]
    assert measures.ranked_scores() == ("confidence", "lrp", "michel", "w_o_norm")
    assert set(rank_correlations(table)["score"]) == {"confidence", "w_o_norm"}
    assert measures.score_names(optional=False) == ["confidence", "michel", "lrp", "w_o_norm"]
    with pytest.raises(ValueError, match="unknown importance measures"):
        measures.score_table(ScoringInputs(model, padded_batches()), ["no_such_measure"])


def test_a_model_whose_layers_differ_in_head_count_is_refused_by_every_measure():
    """Physical removal numbers each layer's remaining heads afresh: every measure is refused with
    a message naming the layers' counts and the gated model to score instead, not a shape error."""
    from headcount.io import HeadcountError
    from headcount.pruning.removal import remove_pruned_heads

    model = tiny_model(seed=4, n_heads=4, d_model=16)
    model.set_head_mask({"enc_self": torch.tensor([[1.0, 0, 1, 0], [1, 1, 1, 1]])})
    remove_pruned_heads(model)
    for measure in ("confidence", "michel", "lrp", "ablation"):
        with pytest.raises(HeadcountError, match=r"enc_self: 2, 4 heads.*the pruning run's model\.pt"):
            score_table(ScoringInputs(model, padded_batches(), [b[:2] for b in padded_batches()]), [measure])
    even = tiny_model(seed=4, n_heads=4, d_model=16)  # every layer as wide: scored as before
    even.set_head_mask({"enc_self": torch.tensor([[1.0, 0, 1, 0], [0, 1, 1, 0]])})
    remove_pruned_heads(even)
    assert len(score_table(ScoringInputs(even, padded_batches()), ["confidence"])) == 2 * 2 + 2 * 4 + 2 * 4


@pytest.mark.slow
def test_spearman_interval_is_the_percentile_interval_of_resampled_heads():
    """Against a loop of the plain spearman over the same resamples of the heads."""
    from headcount.analysis.correlations import spearman_interval

    rng = np.random.default_rng(5)
    x = rng.normal(size=24)
    y = x + rng.normal(scale=1.0, size=24)
    y[3] = y[4]  # a tie
    low, high = spearman_interval(x, y, n_samples=300, seed=2)
    index = np.random.default_rng(2).integers(0, 24, size=(300, 24))
    loop = np.array([spearman(x[i], y[i]) for i in index])
    assert (low, high) == pytest.approx(tuple(np.nanpercentile(loop, [2.5, 97.5])), abs=1e-12)
    assert low < spearman(x, y) < high and low > 0  # a clear positive correlation
    assert all(np.isnan(spearman_interval([1.0, 2.0], [2.0, 1.0])))  # too few heads to resample


def test_rank_correlations_carry_intervals():
    import pandas as pd

    rows = [{"type": "enc_self", "layer": layer, "head": h, "michel": float(h + layer), "delta_loss": float(h)}
            for layer in range(2) for h in range(6)]
    corr = rank_correlations(pd.DataFrame(rows), scores=("michel",), n_samples=200)
    assert list(corr.columns) == ["type", "layer", "score", "spearman", "spearman_low", "spearman_high", "n"]
    per_layer = corr[corr["layer"] != "all"]
    assert (per_layer["spearman"] == 1.0).all() and (per_layer["spearman_low"] == 1.0).all()  # monotone
    overall = corr[corr["layer"] == "all"].iloc[0]
    assert overall["spearman_low"] <= overall["spearman"] <= overall["spearman_high"] <= 1.0


def test_correlations_count_the_reference_heads_their_intervals_resolve():
    """Issue 61: a reference whose heads sit within their noise ranks noise; each correlation says how
    many of its heads' ablation intervals exclude 0, and whether that reaches the rule's minimum."""
    import pandas as pd

    rows = [{"type": "enc_self", "layer": layer, "head": h, "michel": float(h), "delta_loss": float(h),
             # heads 0-1 of each layer straddle 0, heads 2-5 are clear of it
             "delta_loss_low": -0.1 if h < 2 else 0.5 * h, "delta_loss_high": 0.1 if h < 2 else 2.0 * h}
            for layer in range(2) for h in range(6)]
    corr = rank_correlations(pd.DataFrame(rows), scores=("michel",), n_samples=50, min_resolved=5)
    by_layer = corr.set_index("layer")
    assert by_layer.loc[0, "resolved"] == 4 and by_layer.loc["all", "resolved"] == 8
    assert not by_layer.loc[0, "reference_meaningful"] and by_layer.loc["all", "reference_meaningful"]
