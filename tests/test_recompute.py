"""Per-layer recomputation (models.recompute) for Michel importance and LRP on long inputs (issue 62,
item 3): the same scores and relevances as keeping every layer's activations, LRP's conservation
unchanged, the maps really not kept, evaluation mode required, and on by default only for rows
longer than RECOMPUTE_ABOVE positions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import randomise_norms_and_biases, tiny_config

from headcount.analysis.importance import dev_batches, michel_importance
from headcount.analysis.relevance import head_relevance
from headcount.data.special import SpecialIds
from headcount.models.lrp import step_relevance
from headcount.models.recompute import (
    RECOMPUTE_ABOVE,
    RecomputeInTraining,
    checkpointed,
    layers_of,
    recomputed_layers,
    wants_recompute,
)
from headcount.models.transformer import Transformer

SPECIAL = SpecialIds(pad=0, bos=1, eos=2, unk=3, mask=4)
VOCAB = 70


def tiny_lm(family: str, layers: int = 3, positions: int = 64):
    """A small random transformers model of the family, wrapped as headcount wraps a loaded one, in
    evaluation mode; GPT-2's and BERT's dropout (0.1 by default) is there, off in evaluation."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    from headcount.models.hf_lm import HFCausalLM, HFMaskedLM

    torch.manual_seed(0)
    if family == "llama":
        hf = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=positions))
    elif family == "gpt2":
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=layers, n_head=4, n_positions=positions))
    else:
        hf = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=layers, num_attention_heads=4,
                                        max_position_embeddings=positions, pad_token_id=0))
        return HFMaskedLM(hf, special=SPECIAL).double().eval()
    return HFCausalLM(hf, special=SPECIAL).double().eval()


def headcount_model(biases: bool = True, **overrides) -> Transformer:
    torch.manual_seed(0)
    return randomise_norms_and_biases(Transformer(tiny_config(**overrides)).double().eval(), biases)


def michel_batches(model, family: str):
    rng = np.random.default_rng(0)
    if family in ("headcount", "marian", "t5"):
        src = [list(rng.integers(4, 19, rng.integers(2, 12))) for _ in range(7)]
        tgt = [list(rng.integers(4, 19, rng.integers(2, 12))) for _ in range(7)]
        return dev_batches(src, tgt, max_tokens=40, special=model.special)
    ids = [list(rng.integers(5, VOCAB, rng.integers(2, 30))) for _ in range(7)]
    return dev_batches(ids, ids, max_tokens=40, special=model.special, objective="causal_lm")


def model_of(family: str):
    if family in ("marian", "t5"):  # transformers' encoder-decoders (hf.py)
        from test_hf_models import tiny

        return tiny(family).double()
    return headcount_model() if family == "headcount" else tiny_lm(family)


class Calls:
    """How often each attention runs its heads (the head_context hook point fires): twice per
    layer when the backward pass recomputes it."""

    def __init__(self, model):
        self.count = 0
        self.handles = [slot.head_context.register_forward_hook(self._hook)
                        for slots in model.attention_modules().values() for slot in slots]

    def _hook(self, *_):
        self.count += 1

    def remove(self):
        for handle in self.handles:
            handle.remove()


class SavedMaps:
    """Square (.., T, T) floating tensors (attention maps, scores) that autograd saves for the
    backward pass outside any recomputed layer: a recomputed layer saves its inputs only (a mask
    among them, which every layer shares: bool, or additive, 0 and the dtype's lowest value, as
    transformers builds GPT-2's), and its own tensors under torch.utils.checkpoint's hooks when
    the backward pass runs it again."""

    def __init__(self, sizes):
        self.sizes, self.count = set(sizes), 0

    def __enter__(self):
        def pack(x):
            if x.is_floating_point() and x.dim() >= 2 and x.shape[-1] == x.shape[-2] and x.shape[-1] in self.sizes:
                lowest = torch.tensor([0.0, torch.finfo(x.dtype).min, float("-inf")], dtype=x.dtype)
                if not torch.isin(x.detach(), lowest).all():  # an additive mask is no map
                    self.count += 1
            return x

        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


# --------------------------------------------------------------------------------------------
# The rule


def test_recomputation_is_on_by_default_only_above_the_threshold():
    assert not wants_recompute(None, 12, RECOMPUTE_ABOVE)
    assert wants_recompute(None, 0, RECOMPUTE_ABOVE + 1)
    assert wants_recompute(True, 3) and not wants_recompute(False, 10_000)
    assert not wants_recompute(None)


def test_the_layers_forward_is_restored_afterwards():
    model = headcount_model()
    layer = model.encoder_layers[0]
    own = layer.forward
    model.decoder_layers[0].forward = planted = model.decoder_layers[0].forward  # one set on the instance
    with recomputed_layers(model):
        assert "forward" in vars(layer)
    assert "forward" not in vars(layer) and layer.forward == own
    assert vars(model.decoder_layers[0])["forward"] is planted


def test_the_layers_are_the_stacks_elements():
    model = headcount_model()
    assert layers_of(model) == [*model.encoder_layers, *model.decoder_layers]
    llama = tiny_lm("llama")
    assert layers_of(llama) == list(llama.hf.base_model.layers)
    t5 = model_of("t5")  # its blocks, not the sublayer lists inside them
    assert [type(layer).__name__ for layer in layers_of(t5)] == ["T5Block"] * 4


# --------------------------------------------------------------------------------------------
# Michel importance


@pytest.mark.parametrize("family", ["headcount", "llama", "gpt2", "marian", "t5"])
def test_michel_importance_recomputed_equals_kept(family):
    model = model_of(family)
    batches = michel_batches(model, family)
    kept = michel_importance(model, batches, recompute=False)
    calls = Calls(model)
    try:
        recomputed = michel_importance(model, batches, recompute=True)
    finally:
        calls.remove()
    n_layers = sum(len(slots) for slots in model.attention_modules().values())
    assert calls.count == 2 * n_layers * len(batches)  # each layer ran again in the backward pass
    assert kept["michel_raw"].abs().max() > 0
    pd.testing.assert_frame_equal(recomputed, kept, rtol=1e-12, atol=0)


@pytest.mark.parametrize("family", ["headcount", "llama"])
def test_michel_recomputed_keeps_no_attention_map_for_the_backward_pass(family):
    model = model_of(family)
    batches = michel_batches(model, family)
    sizes = {b[1].shape[1] for b in batches} | {b[0].shape[1] for b in batches}
    with SavedMaps(sizes) as kept:
        michel_importance(model, batches, recompute=False)
    with SavedMaps(sizes) as recomputed:
        michel_importance(model, batches, recompute=True)
    assert kept.count > 0 and recomputed.count == 0


def test_michel_recomputes_a_long_row_by_default_and_a_short_one_not():
    model = tiny_lm("llama", layers=2, positions=RECOMPUTE_ABOVE + 8)
    rng = np.random.default_rng(1)
    for length, runs in ((RECOMPUTE_ABOVE - 1, 1), (RECOMPUTE_ABOVE + 1, 2)):  # + BOS: 512, 513 positions
        ids = [list(rng.integers(5, VOCAB, length))]
        batches = dev_batches(ids, ids, max_tokens=4000, special=model.special, objective="causal_lm")
        calls = Calls(model)
        try:
            automatic = michel_importance(model, batches)
        finally:
            calls.remove()
        assert calls.count == runs * 2
        pd.testing.assert_frame_equal(automatic, michel_importance(model, batches, recompute=runs == 1),
                                      rtol=1e-12, atol=0)


def test_recomputation_refuses_training_mode_and_michel_runs_in_evaluation_mode():
    """Dropout would draw new masks when a layer runs again: recomputation needs evaluation mode."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.3, attn_dropout=0.3, relu_dropout=0.3)).double()
    batches = michel_batches(model, "headcount")
    model.train()
    with pytest.raises(RecomputeInTraining, match="evaluation mode"):
        with recomputed_layers(model):
            pass
    layer = model.encoder_layers[0]
    with pytest.raises(RecomputeInTraining, match="dropout"):
        checkpointed(layer, torch.zeros(1, 3, 16, dtype=torch.double, requires_grad=True),
                     torch.zeros(1, 3, dtype=torch.bool), layer=layer, recompute=True)
    model.train()
    recomputed = michel_importance(model, batches, recompute=True)  # it sets evaluation mode itself
    assert not any(m.training for m in model.modules())
    pd.testing.assert_frame_equal(recomputed, michel_importance(model, batches, recompute=False), rtol=1e-12, atol=0)


# --------------------------------------------------------------------------------------------
# LRP


def lrp_batch(model, family: str):
    torch.manual_seed(1)
    if family == "headcount":
        src, tgt_in = torch.randint(4, 23, (3, 9)), torch.randint(4, 19, (3, 8))
        src[2, 6:], tgt_in[2, 5:] = 0, 0  # padding
        tgt_in[:, 0] = model.special.bos
        return src, tgt_in
    if family == "bert":
        src = torch.randint(5, VOCAB, (2, 12))
        src[:, 0], src[:, -1] = SPECIAL.bos, SPECIAL.eos
        src[0, 3] = src[0, 7] = src[1, 5] = SPECIAL.mask
        return src, torch.zeros(2, 0, dtype=torch.long)
    tgt_in = torch.randint(5, VOCAB, (2, 20))
    tgt_in[:, 0], tgt_in[1, 15:] = SPECIAL.bos, SPECIAL.pad
    return torch.zeros(2, 0, dtype=torch.long), tgt_in


@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
@pytest.mark.parametrize("family", ["headcount", "llama", "gpt2", "bert"])
@pytest.mark.slow
def test_lrp_recomputed_equals_kept(family, rule):
    """Several chunks of seeds (max_seeds 3), so a recomputed graph serves several backward passes
    (the encoder's, shared by the chunks; BERT's one forward pass)."""
    model = model_of(family)
    src, tgt_in = lrp_batch(model, family)
    kept = step_relevance(model, src, tgt_in, rule, max_seeds=3, recompute=False)
    sizes = {src.shape[1], tgt_in.shape[1]} - {0}
    with SavedMaps(sizes) as saved:
        recomputed = step_relevance(model, src, tgt_in, rule, max_seeds=3, recompute=True)
    assert saved.count == 0  # no layer kept its maps
    assert set(recomputed.heads) == set(kept.heads)
    assert torch.equal(recomputed.valid, kept.valid)
    for kind in kept.heads:
        assert kept.heads[kind].abs().max() > 0
        torch.testing.assert_close(recomputed.heads[kind], kept.heads[kind], rtol=1e-12, atol=1e-15)
    assert list(recomputed.cuts) == list(kept.cuts)
    for name in kept.cuts:
        torch.testing.assert_close(recomputed.cuts[name], kept.cuts[name], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("family", ["headcount", "llama"])
def test_lrp_recomputed_still_conserves_exactly_without_biases(family):
    """The conservation law of the "ding" rule (test_lrp, test_lm_lrp) holds through recomputed layers."""
    if family == "headcount":
        model = headcount_model(biases=False)
    else:
        model = tiny_lm("llama")  # no biases in Llama's projections, norms or output layer
        assert not [name for name, _ in model.named_parameters() if name.endswith("bias")]
    src, tgt_in = lrp_batch(model, family)
    result = step_relevance(model, src, tgt_in, "ding", max_seeds=3, recompute=True)
    assert len(result.cuts) == (6 if family == "headcount" else 4)  # L + 1 cuts per stack
    for name, total in result.cuts.items():
        torch.testing.assert_close(total[result.valid], torch.ones_like(total[result.valid]), rtol=0, atol=1e-9,
                                   msg=name)


def test_head_relevance_passes_the_switch_on():
    model = tiny_lm("llama")
    src, tgt_in = lrp_batch(model, "llama")
    kept = head_relevance(model, [(src, tgt_in)], rule="attnlrp", recompute=False)
    with SavedMaps({tgt_in.shape[1]}) as saved:
        recomputed = head_relevance(model, [(src, tgt_in)], rule="attnlrp", recompute=True)
    assert saved.count == 0
    pd.testing.assert_frame_equal(recomputed.table, kept.table, rtol=1e-12, atol=0)
    pd.testing.assert_frame_equal(recomputed.conservation, kept.conservation, rtol=1e-9, atol=1e-15)
