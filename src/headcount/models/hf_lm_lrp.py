"""The LRP forward passes of the language-model adapters (hf_lm.py): seq2seq.LRPForward for GPT-2,
GPT-NeoX, OPT, Llama/Qwen2/Qwen3 (decoder_only) and BERT/RoBERTa (encoder_only), one per
`LMFamily.layout`.

Module-level rules, as lxt applies AttnLRP: every family runs transformers' own forward (evaluation
mode, no cache), its modules given the rule object's (lrp.DingRules / lrp.AttnLRPRules) for the
duration of the pass (_module_rules), and put back afterwards; the graph built needs none of it.
Every forward value is the model's. What each module gets:

- LayerNorm: `rules.layer_norm`; RMSNorm (Llama, Qwen; Qwen3's per-head q/k norms too) as
  hf_lrp.T5LRPForward treats it (ding: pass-through; attnlrp: the root mean square held constant,
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
  so AttnLRP's epsilon rule on them goes where hooks reach (_layer_with_rules): post-LN sums (OPT-350m,
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

import contextlib
import copy
import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.models.lrp import EncoderTrace, LRPNotImplemented, Trace, half_gradient, pass_through, top1_targets
from headcount.models.recompute import checkpointed
from headcount.models.seq2seq import NotAvailableForKind


def lrp_forward_of(model):
    """The LRPForward of an hf_lm adapter, by its family's layout."""
    forwards = {"gpt2": GPT2LRPForward, "gpt_neox": GPTNeoXLRPForward, "opt": OPTLRPForward,
                "llama": LlamaLRPForward, "bert": BertLRPForward}
    layout = model.family.layout
    if layout not in forwards:
        raise LRPNotImplemented(f"{model.family.name}: no LRP forward pass for its layout {layout!r}; leave LRP out "
                                f"for this model")
    return forwards[layout](model)


# --------------------------------------------------------------------------------------------
# The rules on a module


def _rms_norm(rules, x: Tensor, norm: nn.Module) -> Tensor:
    """transformers' RMSNorm (Llama, Qwen): w * (x / rms(x)), the normalisation in float32."""
    inverse_rms = torch.rsqrt(x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True) + norm.variance_epsilon)
    if rules.name == "ding":
        return pass_through(x, norm.weight * (x.to(torch.float32) * inverse_rms).to(x.dtype))
    return rules.stabilise(norm.weight * (x.to(torch.float32) * inverse_rms.detach()).to(x.dtype))


def _norm_rule(rules, norm: nn.Module):
    """The rule's forward for a LayerNorm or an RMSNorm (None for any other module)."""
    if isinstance(norm, nn.LayerNorm):
        return lambda x: rules.layer_norm(x, norm)
    if hasattr(norm, "variance_epsilon") and hasattr(norm, "weight"):
        return lambda x: _rms_norm(rules, x, norm)
    return None


def _is_linear(module: nn.Module) -> bool:
    """An nn.Linear or transformers' Conv1D (GPT-2's fused QKV and feed-forward)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


LRP_ATTENTION = "headcount_lrp_attention"


def _lrp_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling: float,
                   **kwargs):
    """An AttentionInterface function (transformers' eager one's signature): the rule's attention
    (lrp.*Rules.attention, in the model's dtype) over the module's q (B, H, Tq, Dh) after any
    rotary and k, v (B, KV, Tk, Dh); each query head reads its KV head by `kv_of`. The scores are
    scaled by `scaling` (the rules divide by sqrt(Dh): q is multiplied by the constant ratio where
    it differs, a linear map both rules pass exactly). -> ((B, Tq, H, Dh), None)."""
    rules, slot, causal = module._headcount_lrp
    Tq, Tk = query.shape[2], key.shape[2]
    if attention_mask is not None:
        allowed = attention_mask == 0  # eager's additive mask: 0 where the key is seen, min elsewhere
    elif causal:  # transformers may leave out a mask that masks nothing but the future
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device).tril(Tk - Tq)[None, None]
    else:
        allowed = torch.ones(1, 1, 1, Tk, dtype=torch.bool, device=query.device)
    kv_of = getattr(slot, "kv_of", None)
    if kv_of is not None:  # grouped-query attention: each query head reads its KV head
        index = torch.tensor(kv_of, dtype=torch.long, device=key.device)
        key, value = key.index_select(1, index), value.index_select(1, index)  # (B, H, Tk, Dh)
    ratio = scaling * math.sqrt(query.shape[-1])
    if not math.isclose(ratio, 1.0, rel_tol=1e-12):  # (Dh^-0.5 * sqrt(Dh) may round off 1)
        query = query * ratio
    return rules.attention(query, key, value, allowed).transpose(1, 2).contiguous(), None


def _epsilon_factor(z: Tensor, eps: float) -> Tensor:
    """The epsilon rule's z / (z + eps sign z), a constant."""
    sign = torch.where(z >= 0, 1.0, -1.0).to(z.dtype)
    return (z / (z + eps * sign)).detach()


def _set_forward(module: nn.Module, forward, undo: list) -> None:
    own = module.__dict__.get("forward")
    module.forward = forward
    undo.append(lambda: module.__dict__.pop("forward") if own is None else setattr(module, "forward", own))


def _set_attribute(obj, name: str, value, undo: list) -> None:
    """obj.name = value (not a submodule) until undone."""
    had, old = name in obj.__dict__, obj.__dict__.get(name)
    object.__setattr__(obj, name, value)
    undo.append(lambda: object.__setattr__(obj, name, old) if had else obj.__dict__.pop(name))


def _give_rules(modules, rules, undo: list) -> None:
    """Norms their rule's forward; under AttnLRP the epsilon rule on each linear map's output."""
    for module in modules:
        forward = _norm_rule(rules, module)
        if forward is not None:
            _set_forward(module, forward, undo)
        elif _is_linear(module) and rules.name != "ding":
            undo.append(module.register_forward_hook(lambda m, args, out: rules.stabilise(out)).remove)


@contextlib.contextmanager
def _module_rules(lrp_forward, rules):
    """lrp_forward's model with the rule on its modules, inside the block (transformers' own forward
    is run in it); yields {"streams": [layer 0's input, each layer's output], "contexts": [each
    layer's head contexts]}, filled by the forward pass. Everything is put back on leaving; the
    graph built needs nothing of it.

    Outside the layers (lrp_forward._outside()): norms and linear maps (_give_rules). Each layer's
    forward is wrapped, and recomputed in the backward pass where lrp_forward.recompute is set
    (within it, everything of the layer's, again): _layer_with_rules."""
    from transformers import AttentionInterface

    if LRP_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(LRP_ATTENTION, _lrp_attention)
    found, undo = {"streams": [], "contexts": []}, []
    recording = [True]  # False once the pass is over: a layer recomputed in the backward pass records nothing
    try:
        _give_rules(lrp_forward._outside(), rules, undo)
        for layer, slot in zip(lrp_forward._layers(), lrp_forward.slots):
            run = _layer_with_rules(lrp_forward, layer, slot, layer.forward, rules, found, recording)
            _set_forward(layer, run, undo)
        yield found
    finally:
        recording[0] = False
        for fn in reversed(undo):
            fn()


def _layer_with_rules(lrp_forward, layer: nn.Module, slot, forward, rules, found: dict, recording: list):
    """The layer's own `forward` with the rule on its modules: its norms and linear maps
    (_give_rules); the modules that call an attention function, a config copy naming _lrp_attention
    (as hf_lm._group_explicitly gives one); the activations passed through (lrp.pass_through); the
    input of lrp_forward._product(layer) (SwiGLU's gated product) with its relevance halved, half
    to each factor; the head contexts read at the gates' `head_context` hook; and the residual sums
    (lrp_forward._residual(layer)), which transformers' layer adds in its forward, out of a hook's
    reach, under AttnLRP's epsilon rule:

    - "pre" (pre-LN, sequential): z1 = x + attn is stabilised where the norm named reads it (a
      pre-hook), the output y = z1 + mlp as a whole, and z1's own factor is put on the gradient z1
      gets through y's sum by a term of value zero added to the output;
    - "parallel" (GPT-NeoX): y = mlp + attn + x, one sum: the output stabilised;
    - "post" (post-LN): each sum is the input of the norms named, stabilised there (pre-hooks)."""
    attnlrp, residual = rules.name != "ding", lrp_forward._residual(layer)

    def run(hidden_states, *args, **kwargs):
        undo, state = [], {}
        try:
            _give_rules(layer.modules(), rules, undo)
            for module in layer.modules():
                config = getattr(module, "config", None)
                if config is not None and hasattr(config, "_attn_implementation"):
                    config = copy.copy(config)
                    config._attn_implementation = LRP_ATTENTION
                    _set_attribute(module, "config", config, undo)
                    _set_attribute(module, "_headcount_lrp", (rules, slot, lrp_forward.causal), undo)
                    if getattr(module, "reorder_and_upcast_attn", False):  # GPT-2's float32 path: eager's own
                        _set_attribute(module, "reorder_and_upcast_attn", False, undo)
            for owner, name in lrp_forward._activations(layer):
                act = getattr(owner, name)
                if isinstance(act, nn.Module):
                    _set_forward(act, lambda x, act=act.forward: pass_through(x, act(x)), undo)
                else:
                    _set_attribute(owner, name, lambda x, act=act: pass_through(x, act(x)), undo)
            product = lrp_forward._product(layer)
            if product is not None:
                undo.append(product.register_forward_pre_hook(lambda m, args: (half_gradient(args[0]),)).remove)
            if recording[0]:
                undo.append(slot.head_context.register_forward_hook(
                    lambda m, args, out: found["contexts"].append(out)).remove)
            if attnlrp and residual[0] != "parallel":
                def stabilised(m, args):
                    state.setdefault("sums", []).append(args[0])
                    return (rules.stabilise(args[0]), *args[1:])

                for norm in residual[1:]:
                    undo.append(norm.register_forward_pre_hook(stabilised).remove)
            y = forward(hidden_states, *args, **kwargs)
        finally:
            for fn in reversed(undo):
                fn()
        if attnlrp and residual[0] != "post":
            f2 = _epsilon_factor(y, rules.eps)
            stable = y.detach() + (y - y.detach()) * f2
            if residual[0] == "pre":
                z1 = state["sums"][0].reshape(y.shape)  # OPT's norm reads it flattened
                stable = stable + (z1 - z1.detach()) * ((_epsilon_factor(z1, rules.eps) - 1) * f2)
            y = stable
        return y

    def with_rules(hidden_states, *args, **kwargs):
        if recording[0] and not found["streams"]:
            found["streams"].append(hidden_states)  # layer 0's input: the embeddings
        out = checkpointed(functools.partial(run, **kwargs), hidden_states, *args, layer=layer,
                           recompute=lrp_forward.recompute)
        if recording[0]:
            found["streams"].append(out)
        return out

    return with_rules


def _top_logit(rules, hidden: Tensor, weight: Tensor, bias: Tensor | None, steps: Tensor, target, special):
    """(stabilised top-1 logit (B, T), target (B, T)) of the output layer (weight (V, D), bias)."""
    target = top1_targets(lambda h: F.linear(h, weight, bias), hidden, steps, target, special)
    top = (hidden * weight[target]).sum(dim=-1)  # (B, T): one row of the output layer
    if bias is not None:
        top = top + bias[target]
    return rules.stabilise(top), target


# --------------------------------------------------------------------------------------------
# Decoder-only


class _CausalLRPForward:
    """What the causal LMs share: no encoder, transformers' own forward under _module_rules, the
    output layer."""

    causal = True

    def __init__(self, model):
        self.model, self.hf, self.base = model, model.hf, model.hf.base_model
        self.slots = model.attention_modules()["dec_self"]
        head = model.hf.get_submodule(model.family.head_path)
        self.out_weight, self.out_bias = head.weight, head.bias
        self.recompute = False  # each layer recomputed in the backward pass (lrp.step_relevance sets it)

    def _product(self, layer: nn.Module) -> nn.Module | None:
        return None

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


class GPT2LRPForward(_CausalLRPForward):
    """GPT-2: pre-LN blocks, fused QKV (Conv1D), learned positions, GELU."""

    def _layers(self):
        return self.base.h

    def _outside(self):
        return [self.base.ln_f]

    def _activations(self, block):
        return [(block.mlp, "act")]

    def _residual(self, block):
        return ("pre", block.ln_2)


class GPTNeoXLRPForward(_CausalLRPForward):
    """GPT-NeoX (Pythia): pre-LN, fused per-head QKV, partial rotary positions, attention and
    feed-forward in parallel (or in sequence), GELU."""

    def _layers(self):
        return self.base.layers

    def _outside(self):
        return [self.base.final_layer_norm]

    def _activations(self, layer):
        return [(layer.mlp, "act")]

    def _residual(self, layer):
        return ("parallel",) if layer.use_parallel_residual else ("pre", layer.post_attention_layernorm)


class OPTLRPForward(_CausalLRPForward):
    """OPT: pre-LN (or post-LN) blocks, learned positions offset by 2, ReLU."""

    def __init__(self, model):
        super().__init__(model)
        if not getattr(model.config, "layer_norm_elementwise_affine", True):
            raise LRPNotImplemented(f"{model.family.name}: LRP reproduces LayerNorms with a gain and bias; this "
                                    f"model's have none (layer_norm_elementwise_affine=False)")
        self.decoder = self.base.decoder

    def _layers(self):
        return self.decoder.layers

    def _outside(self):
        return [m for m in (self.decoder.project_in, self.decoder.final_layer_norm, self.decoder.project_out)
                if m is not None]

    def _activations(self, layer):
        return [(layer, "activation_fn")]

    def _residual(self, layer):
        if layer.do_layer_norm_before:
            return ("pre", layer.final_layer_norm)
        return ("post", layer.self_attn_layer_norm, layer.final_layer_norm)


class LlamaLRPForward(_CausalLRPForward):
    """Llama, Qwen2, Qwen3: RMSNorm, rotary positions, grouped-query attention, SwiGLU."""

    def __init__(self, model):
        super().__init__(model)
        config = model.config
        if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
            raise LRPNotImplemented(f"{model.family.name}: LRP does not reproduce sliding-window attention; "
                                   f"set use_sliding_window=False in the config or leave LRP out for this model")

    def _layers(self):
        return self.base.layers

    def _outside(self):
        return [self.base.norm]

    def _activations(self, layer):
        return [(layer.mlp, "act_fn")]

    def _product(self, layer):
        return layer.mlp.down_proj  # its input: act(gate) * up

    def _residual(self, layer):
        return ("pre", layer.post_attention_layernorm)


# --------------------------------------------------------------------------------------------
# Encoder-only


class BertLRPForward:
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

    def _layers(self):
        return self.base.encoder.layer

    def _outside(self):
        return [self.base.embeddings.LayerNorm]

    def _activations(self, layer):
        return [(layer.intermediate, "intermediate_act_fn")]

    def _product(self, layer):
        return None

    def _residual(self, layer):
        return ("post", layer.attention.output.LayerNorm, layer.output.LayerNorm)

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
