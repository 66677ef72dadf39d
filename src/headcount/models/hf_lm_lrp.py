"""The LRP forward passes of the language-model adapters (hf_lm.py): seq2seq.LRPForward for GPT-2,
GPT-NeoX, OPT, Llama/Qwen2/Qwen3 (decoder_only: CausalLMLRPForward) and BERT/RoBERTa
(encoder_only: MaskedLMLRPForward), one per kind. Where the rules go in a family's forward (the
modules outside the layers, each layer's activation, product and residual sums) is data of its
entry in families.FAMILIES, so a new family is an entry, not a class.

Module-level rules, as lxt applies AttnLRP: every family runs transformers' own forward (evaluation
mode, no cache), its modules given the rule object's (lrp.DingRules / lrp.AttnLRPRules) for the
duration of the pass (module_rules._module_rules, shared with hf_lrp.py), and put back afterwards;
the graph built needs none of it. Every forward value is the model's. What each module gets:

- LayerNorm: `rules.layer_norm`; RMSNorm (Llama, Qwen; Qwen3's per-head q/k norms too) as
  T5's in hf_lrp.py (ding: pass-through; attnlrp: the root mean square held constant,
  a linear map, epsilon rule), computed in float32 as transformers does: their forward replaced.
- Linear maps (nn.Linear, GPT-2's Conv1D: fused QKV, feed-forward, OPT's project_in/out, W^O
  behind the head gates): transformers' own, the epsilon rule on the output under AttnLRP (a
  forward hook); the z-rule (plain) under ding.
- Attention: a function registered with transformers' AttentionInterface, named by a config copy
  of each attention module (as hf_lm._group_explicitly gives one): `rules.attention` over the
  module's q, k, v, after transformers' own rotary positions (Llama, GPT-NeoX's partial rotary:
  fixed linear maps of q and k, passed plainly) and OPT's scaling of q; the scores scaled by the
  module's `scaling` (the rules divide by sqrt(Dh): q times the constant ratio where it differs);
  grouped-query heads read their KV head by `LMHeadGates.kv_of`, so a shared KV head receives the
  sum of its query heads' relevance. It runs in the model's dtype: transformers' eager attention
  computes its softmax in float32 even in a float64 model (the forward differs from the model's by
  that rounding, up to 2e-8 on the tiny float64 models).
- Element-wise activations (GELU, ReLU, SiLU): relevance passed through neuron by neuron under both
  rules (lrp.pass_through: the paper's rule ignores non-linearities; AttnLRP's identity rule is the
  same map, as lxt's identity_rule_implicit). SwiGLU's down(act(gate) * up) is a product of two
  neurons: half of its relevance to each factor (a pre-hook halves the gradient at down_proj's
  input), AttnLRP's uniform rule, under both rules (the paper's rule has no case for it).
- The head contexts are read at the gates' `head_context` hook (before the gates, which fold into
  W^O's input as constants), the streams at layer 0's input and each layer's output.

What a module patch cannot reach, and what stays hand-written:

- The residual sums: transformers' layers add them in their forward (`residual + hidden_states`),
  so AttnLRP's epsilon rule on them goes where hooks reach (module_rules._layer_with_rules): post-LN sums (OPT-350m,
  BERT, RoBERTa) at the norm that reads them; GPT-NeoX's parallel sum x + attn + mlp at the layer's
  output; a pre-LN layer's first sum z1 = x + attn where the post-attention norm reads it, the
  output y = z1 + mlp as a whole, and z1's own factor on the gradient z1 gets through y's sum by a
  term of value zero added to the output. Without that term, head relevance on the tiny Llama
  moves by 8e-4 relative at eps 1e-6 and by 0.5 at eps 1e-2 (the explicit reference's test).
- The output layer (_top_logit) and BERT/RoBERTa's MLM head (predict_masked: dense -> GELU ->
  LayerNorm -> decoder) stay hand-written: they compute the one row of the vocabulary projection
  each step explains, not all V logits that transformers' head would; rules as above.

Measured against the hand-written forward of each layout that this replaced (tiny GPT-2, GPT-NeoX
parallel and sequential, OPT pre- and post-LN, Llama, Qwen2, Qwen3, BERT, RoBERTa in float64;
step_relevance, both rules, eps 1e-6 and 1e-2, with and without biases, kept and recomputed layers):
head relevance equal to 6e-16 relative, every cut's total to 6e-16; lxt's cross-check unchanged
(tools/crosscheck_lxt.py, eps 1e-12: GPT-2 2.0e-9, Llama 1.0e-7 relative).

How the kinds meet lrp.py's driver (lrp.step_relevance): a causal LM's `encode` is empty (no
contexts, no streams; src is (B, 0)) and its `decode` runs the language model over tgt_in, its
Trace holding "dec_self" contexts only, so step_relevance's prefix chunks apply as for a decoder.
A masked LM has no decoder: `encode` runs the encoder and `predict_masked(encoded, src, rules,
target)` the MLM head at every source position (a Trace whose steps are source positions);
lrp.masked_step_relevance seeds the masked positions. Positions are transformers' own (GPT-2's and
OPT's learned ones counted from the attention mask, RoBERTa's from padding_idx + 1).

Shapes: B batch, T length, D hidden size, H query heads, KV key/value heads, Dh head size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.models.lrp import EncoderTrace, LRPNotImplemented, Trace, pass_through, top1_targets
from headcount.models.module_rules import _module_rules
from headcount.models.seq2seq import NotAvailableForKind


def lrp_forward_of(model):
    """The LRPForward of an hf_lm adapter: its kind's, reading where the rules go from its family's
    entry (families.LMFamily: outside, activation, product, residual)."""
    if not model.family.residual:
        raise LRPNotImplemented(f"{model.family.name}: its family entry names no residual layout for LRP; leave "
                                f"LRP out for this model")
    return (CausalLMLRPForward if model.family.model_kind == "decoder_only" else MaskedLMLRPForward)(model)


def _path(module: nn.Module, path: str):
    """The attribute at a dotted path, or None where a step is missing or None (OPT's project_in)."""
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module


class _FamilyModules:
    """Where _module_rules puts the rules, read from the family's entry: the layers, the modules
    outside them, each layer's activation, product and residual sums."""

    def _layers(self):
        return _path(self.base, self.model.family.layers)

    def _outside(self):
        return [m for m in (_path(self.base, p) for p in self.model.family.outside) if m is not None]

    def _activations(self, layer):
        module, _, attribute = self.model.family.activation.rpartition(".")
        return [(_path(layer, module) if module else layer, attribute)]

    def _product(self, layer):
        product = self.model.family.product
        return _path(layer, product) if product else None

    def _residual(self, layer):
        family = self.model.family
        spec = family.residual[0] if family.residual_if is None or getattr(layer, family.residual_if) \
            else family.residual[1]
        kind, *norms = spec.split()
        return (kind, *(_path(layer, norm) for norm in norms))


def _top_logit(rules, hidden: Tensor, weight: Tensor, bias: Tensor | None, steps: Tensor, target, special):
    """(stabilised top-1 logit (B, T), target (B, T)) of the output layer (weight (V, D), bias)."""
    target = top1_targets(lambda h: F.linear(h, weight, bias), hidden, steps, target, special)
    top = (hidden * weight[target]).sum(dim=-1)  # (B, T): one row of the output layer
    if bias is not None:
        top = top + bias[target]
    return rules.stabilise(top), target


# --------------------------------------------------------------------------------------------
# Decoder-only


class CausalLMLRPForward(_FamilyModules):
    """A causal LM: no encoder, transformers' own forward under _module_rules, the output layer."""

    causal = True

    def __init__(self, model):
        self.model, self.hf, self.base = model, model.hf, model.hf.base_model
        self.slots = model.attention_modules()["dec_self"]
        head = model.hf.get_submodule(model.family.head_path)
        self.out_weight, self.out_bias = head.weight, head.bias
        self.recompute = False  # each layer recomputed in the backward pass (lrp.step_relevance sets it)
        config, name = model.config, model.family.name
        if not getattr(config, "layer_norm_elementwise_affine", True):  # OPT's option
            raise LRPNotImplemented(f"{name}: LRP reproduces LayerNorms with a gain and bias; this model's have none "
                                    f"(layer_norm_elementwise_affine=False)")
        if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):  # Qwen2's
            raise LRPNotImplemented(f"{name}: LRP does not reproduce sliding-window attention; set "
                                    f"use_sliding_window=False in the config or leave LRP out for this model")

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        """Nothing to encode: an empty memory (B, 0, D), no contexts, no streams."""
        B = src.shape[0]
        memory = self.out_weight.new_zeros(B, 0, self.out_weight.shape[1])
        return EncoderTrace(memory, torch.zeros(B, 1, 1, 0, dtype=torch.bool, device=src.device), [], [])

    def decode(self, encoded: EncoderTrace, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
        """The language model over tgt_in (B, T) as HFCausalLM.decode runs it (padding no key), with
        LRP rules; `encoded` is ignored (empty)."""
        mask = self.model.special.decoder_positions(tgt_in).long()
        with _module_rules(self, rules) as found:
            hidden = self.base(input_ids=tgt_in, attention_mask=mask, use_cache=False).last_hidden_state
        top, target = _top_logit(rules, hidden, self.out_weight, self.out_bias, tgt_in, target, self.model.special)
        return Trace(top, target, {"dec_self": found["contexts"]}, [], found["streams"], [])


# --------------------------------------------------------------------------------------------
# Encoder-only


class MaskedLMLRPForward(_FamilyModules):
    """BERT and RoBERTa masked LMs: post-LN encoder (transformers' own, under _module_rules), MLM head."""

    causal = False

    def __init__(self, model):
        self.model, self.hf, self.base = model, model.hf, model.hf.base_model
        self.slots = model.attention_modules()["enc_self"]
        self.recompute = False  # each layer recomputed in the backward pass (lrp.masked_step_relevance sets it)
        if getattr(self.base.embeddings, "position_embedding_type", "absolute") != "absolute":
            raise LRPNotImplemented(f"{model.family.name}: LRP reproduces absolute position embeddings only; this "
                                   f"model's are {self.base.embeddings.position_embedding_type!r}")
        if model.family.name == "bert":
            head = model.hf.cls.predictions
            self.head_dense, self.head_norm = head.transform.dense, head.transform.LayerNorm
            self.head_act, self.decoder = head.transform.transform_act_fn, head.decoder
        else:
            from transformers.activations import gelu

            head = model.hf.lm_head
            self.head_dense, self.head_norm, self.head_act = head.dense, head.layer_norm, gelu
            self.decoder = head.decoder

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        """The encoder over src (B, S) as HFMaskedLM.encode runs it, with LRP rules; memory: its last
        hidden state (B, S, D)."""
        real = ~src.eq(self.model.special.pad)
        with _module_rules(self, rules) as found:
            memory = self.base(input_ids=src, attention_mask=real.long()).last_hidden_state
        return EncoderTrace(memory, real[:, None, None, :], found["contexts"], found["streams"])

    def decode(self, *args, **kwargs):
        raise NotAvailableForKind(f"a {self.model.family.name} model is encoder-only: its LRP pass has no decoder; "
                                  f"use predict_masked (lrp.masked_step_relevance drives it)")

    def predict_masked(self, encoded: EncoderTrace, src: Tensor, rules, target: Tensor | None = None) -> Trace:
        """The MLM head at every source position: a Trace whose steps are the S source positions.
        target (B, S): the token explained at each position, -1 where the top-1 one (the default
        everywhere; lrp.masked_step_relevance asks only at the masked positions)."""
        pre = rules.linear(encoded.memory, self.head_dense)
        hidden = rules.layer_norm(pass_through(pre, self.head_act(pre)), self.head_norm)  # (B, S, D)
        top, target = _top_logit(rules, hidden, self.decoder.weight, self.decoder.bias, src, target,
                                 self.model.special)
        return Trace(top, target, {"enc_self": encoded.contexts}, encoded.inputs, [], [])
