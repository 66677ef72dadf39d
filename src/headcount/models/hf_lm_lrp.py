"""The LRP forward passes of the language-model adapters (hf_lm.py): seq2seq.LRPForward for GPT-2,
GPT-NeoX, OPT, Llama/Qwen2/Qwen3 (decoder_only) and BERT/RoBERTa (encoder_only), one per
`LMFamily.layout`.

Two ways, both with the rule object's `linear`, `add`, `layer_norm` and `attention` (lrp.DingRules /
lrp.AttnLRPRules) and the model's own weights (evaluation mode, no cache); every forward value is
the model's:

- Module-level rules (Llama, Qwen2, Qwen3), as lxt applies AttnLRP: transformers' own forward runs,
  its modules given the rule for the duration of the pass (_llama_rules: the norms' forward, an
  attention function registered with transformers' AttentionInterface, forward hooks and
  pre-hooks; all put back afterwards). The head contexts are read at the gates' `head_context`
  hook, the streams at the embedding's and each layer's output. Measured against the hand-written
  forward it replaced (tests/test_lm_lrp.py's tiny Llama, Qwen2, Qwen3, step_relevance, both rules,
  eps 1e-6 and 1e-2, kept and recomputed layers, pruned GQA heads): head relevance equal to 3e-16
  relative, cuts to 4e-16; lxt's cross-check unchanged (Llama 1.0e-7 relative at eps 1e-12).
- Hand-written forwards (GPT-2, GPT-NeoX, OPT, BERT/RoBERTa): each re-runs its architecture. The
  same module-level rules would serve them (their norms, activations, W^O and sums are the same
  kinds of module and sum); they were not converted yet, not for a reason a measurement showed.

What the module-level rules cannot reach and do otherwise: transformers' decoder layer adds its
residual sums in its forward (`residual + hidden_states`), so the epsilon rule on them (AttnLRP) is
put where hooks reach: on z1 = x + attn where the post-attention norm reads it (a pre-hook), on the
layer's output y = z1 + mlp as a whole, and z1's own factor on the gradient z1 gets through y's sum
(a term of value zero added to the output). Without that term, head relevance on the tiny Llama
moves by 8e-4 relative at eps 1e-6 and by 0.5 at eps 1e-2 (the explicit reference's test). The
attention is the rule's own function, not transformers' eager one (which computes its softmax in
float32 even in a float64 model; the rule's runs in the model's dtype, as the hand-written forwards do).

What is particular here:

- GPT-2: Q, K, V come from one fused Conv1D (weight (in, out): the linear map with its transpose,
  the stabiliser element-wise, so fusing changes nothing); learned positions are constants added
  to the token embeddings; the feed-forward activation (gelu_new) passes relevance through neuron
  by neuron under both rules (lrp.pass_through: the paper's rule ignores non-linearities; AttnLRP's
  identity rule for element-wise non-linearities is the same map, as lxt's identity_rule_implicit).
- GPT-NeoX (Pythia): pre-LN; Q, K, V from one fused nn.Linear whose output holds each head's q, k,
  v in turn; rotary positions on the first `rotary_ndims` features of each head's q and k (the rest
  pass unrotated; a fixed linear map of q and k, as for Llama below); attention and feed-forward
  read the same stream and are added to it in one sum (`use_parallel_residual`; one epsilon-rule
  sum of three terms under AttnLRP), or one after the other as GPT-2's where it is False; GELU
  passed through.
- OPT: pre-LN blocks (post-LN where `do_layer_norm_before` is False, as OPT-350m), separate q/k/v
  with biases, ReLU passed through; learned positions offset by 2, counted over the real tokens as
  transformers counts them from the attention mask (constants added to the token embeddings); the
  bias-free project_in/project_out of a model whose embedding size differs from its hidden size
  are linear maps like any other.
- Llama, Qwen2, Qwen3 (module-level): RMSNorm as hf_lrp.T5LRPForward treats it (ding:
  pass-through; attnlrp: the root mean square held constant, a linear map, epsilon rule), computed
  in float32 as transformers does, Qwen3's per-head q/k norms included; rotary positions are
  transformers' own, a fixed linear map of q and k given the position (no bias, so both rules pass
  it plainly: the z-rule of a bias-free linear map conserves exactly); SwiGLU down(act(gate) * up)
  is a product of two neurons: half of its relevance to each factor under both rules (AttnLRP's
  uniform rule; the paper's rule has no case for it), the activation passed through; grouped-query
  attention gathers each query head's KV head (`LMHeadGates.kv_of`), so a shared KV head receives
  the sum of its query heads' relevance and a head's relevance is its query head's context's.
- BERT, RoBERTa: post-LN blocks LN(x + f(x)); the embedding sum (token + position + token type 0)
  then its LayerNorm; the MLM head dense -> GELU (passed through) -> LayerNorm -> decoder + bias.
  RoBERTa counts positions from padding_idx + 1 over the real tokens, as transformers does.

Attention scores are scaled by the module's own `scaling` (the rules divide by sqrt(Dh), so q is
pre-multiplied by the constant ratio where it differs, a linear map both rules pass exactly).

How the kinds meet lrp.py's driver (lrp.step_relevance): a causal LM's `encode` is empty (no
contexts, no streams; src is (B, 0)) and its `decode` runs the language model over tgt_in, its
Trace holding "dec_self" contexts only, so step_relevance's prefix chunks apply as for a decoder.
A masked LM has no decoder: `encode` runs the encoder and `predict_masked(encoded, src, rules,
target)` the MLM head at every source position (a Trace whose steps are source positions);
lrp.masked_step_relevance seeds the masked positions.

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
# Building blocks


def _heads(z: Tensor, Dh: int) -> Tensor:
    """(B, T, n*Dh) -> (B, n, T, Dh)."""
    B, T, _ = z.shape
    return z.view(B, T, -1, Dh).transpose(1, 2)


def _attend(rules, slot, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scaling: float):
    """q (B, H, Tq, Dh), k and v (B, KV, Tk, Dh) -> output (B, Tq, D) through the gated W^O, and the
    head contexts (B, H, Tq, Dh) before the gates."""
    B, H, Tq, Dh = q.shape
    ctx = _attend_heads(rules, slot, q, k, v, allowed, scaling)  # (B, H, Tq, Dh)
    # Gates are constants: folded into W^O's columns (as hf_lrp.py and transformer_lrp.py do).
    w_out = slot.proj.weight * slot.gates().to(ctx.dtype).repeat_interleave(Dh)  # (D, H*Dh)
    return rules.linear(ctx.transpose(1, 2).reshape(B, Tq, H * Dh), slot.proj, w_out), ctx


def _attend_heads(rules, slot, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scaling: float):
    """The rule's attention (the module's `scaling`): the head contexts (B, H, Tq, Dh)."""
    kv_of = getattr(slot, "kv_of", None)
    if kv_of is not None:  # grouped-query attention: each query head reads its KV head
        index = torch.tensor(kv_of, dtype=torch.long, device=k.device)
        k, v = k.index_select(1, index), v.index_select(1, index)  # (B, H, Tk, Dh)
    ratio = scaling * math.sqrt(q.shape[-1])  # the rules divide the scores by sqrt(Dh)
    if not math.isclose(ratio, 1.0, rel_tol=1e-12):  # (Dh^-0.5 * sqrt(Dh) may round off 1)
        q = q * ratio
    return rules.attention(q, k, v, allowed)


def _top_logit(rules, hidden: Tensor, weight: Tensor, bias: Tensor | None, steps: Tensor, target, special):
    """(stabilised top-1 logit (B, T), target (B, T)) of the output layer (weight (V, D), bias)."""
    target = top1_targets(lambda h: F.linear(h, weight, bias), hidden, steps, target, special)
    top = (hidden * weight[target]).sum(dim=-1)  # (B, T): one row of the output layer
    if bias is not None:
        top = top + bias[target]
    return rules.stabilise(top), target


def _rms_norm(rules, x: Tensor, norm: nn.Module) -> Tensor:
    """transformers' RMSNorm (Llama, Qwen): w * (x / rms(x)), the normalisation in float32."""
    inverse_rms = torch.rsqrt(x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True) + norm.variance_epsilon)
    if rules.name == "ding":
        return pass_through(x, norm.weight * (x.to(torch.float32) * inverse_rms).to(x.dtype))
    return rules.stabilise(norm.weight * (x.to(torch.float32) * inverse_rms.detach()).to(x.dtype))


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary positions, (B, n, T, Dh) with cos/sin (B or 1, 1, T, R): a linear map of x. R < Dh
    (GPT-NeoX's partial rotary): the first R features rotate, the others pass unchanged."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


# --------------------------------------------------------------------------------------------
# Decoder-only


class _CausalLRPForward:
    """What the causal LMs share: no encoder, the causal mask, the output layer."""

    def __init__(self, model):
        self.model, self.hf, self.base = model, model.hf, model.hf.base_model
        self.slots = model.attention_modules()["dec_self"]
        head = model.hf.get_submodule(model.family.head_path)
        self.out_weight, self.out_bias = head.weight, head.bias
        self.recompute = False  # each layer recomputed in the backward pass (lrp.step_relevance sets it)

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        """Nothing to encode: an empty memory (B, 0, D), no contexts, no streams."""
        B = src.shape[0]
        memory = self.out_weight.new_zeros(B, 0, self.out_weight.shape[1])
        return EncoderTrace(memory, torch.zeros(B, 1, 1, 0, dtype=torch.bool, device=src.device), [], [])

    def decode(self, encoded: EncoderTrace, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
        """The language model over tgt_in (B, T) with LRP rules; `encoded` is ignored (empty)."""
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()[None, None]  # (1, 1, T, T)
        # Padding is no key, as in HFCausalLM.decode (GPT-2 pads with a text token).
        allowed = causal & self.model.special.decoder_positions(tgt_in)[:, None, None, :]  # (B, 1, T, T)
        x = self._embed(rules, tgt_in)  # (B, T, D)
        streams, contexts = [x], []
        for i, layer in enumerate(self._layers()):
            # Rotary cos/sin (Llama, GPT-NeoX) go in as arguments: a recomputed layer reads this pass's, whatever
            # was decoded since.
            x, ctx = checkpointed(self._layer, rules, i, layer, x, allowed, getattr(self, "_cos_sin", None),
                                  layer=layer, recompute=self.recompute)
            contexts.append(ctx)
            streams.append(x)
        hidden = self._final_norm(rules, x)
        top, target = _top_logit(rules, hidden, self.out_weight, self.out_bias, tgt_in, target, self.model.special)
        return Trace(top, target, {"dec_self": contexts}, [], streams, [])


class GPT2LRPForward(_CausalLRPForward):
    """GPT-2: pre-LN blocks, fused QKV, learned positions, GELU."""

    def _layers(self):
        return self.base.h

    def _embed(self, rules, tokens: Tensor) -> Tensor:
        positions = self.base.wpe.weight[: tokens.shape[1]].detach()  # (T, D) a constant
        return F.embedding(tokens, self.base.wte.weight) + positions

    def _final_norm(self, rules, x: Tensor) -> Tensor:
        return rules.layer_norm(x, self.base.ln_f)

    def _layer(self, rules, i: int, block: nn.Module, x: Tensor, allowed: Tensor, rotary=None):
        slot, attention, mlp = self.slots[i], block.attn, block.mlp
        H, Dh = slot.n_heads, slot.head_dim
        qkv = rules.linear(rules.layer_norm(x, block.ln_1), attention.c_attn, attention.c_attn.weight.t())
        q, k, v = (_heads(z, Dh) for z in qkv.split(H * Dh, dim=2))  # (B, H, T, Dh) each
        out, ctx = _attend(rules, slot, q, k, v, allowed, attention.scaling)
        x = rules.add(x, out)
        pre = rules.linear(rules.layer_norm(x, block.ln_2), mlp.c_fc, mlp.c_fc.weight.t())  # (B, T, F)
        return rules.add(x, rules.linear(pass_through(pre, mlp.act(pre)), mlp.c_proj, mlp.c_proj.weight.t())), ctx


def _rotary(rotary_emb: nn.Module, x: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """The model's rotary cos/sin for positions 0..T-1, constants: (1, 1, T, R) each."""
    with torch.no_grad():
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None]
        cos, sin = rotary_emb(x, positions)  # (1, T, R)
    return cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)


class GPTNeoXLRPForward(_CausalLRPForward):
    """GPT-NeoX (Pythia): pre-LN, fused per-head QKV, partial rotary positions, attention and
    feed-forward in parallel (or in sequence), GELU."""

    def __init__(self, model):
        super().__init__(model)
        self._cos_sin = None

    def _layers(self):
        return self.base.layers

    def _embed(self, rules, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.base.embed_in.weight)
        self._cos_sin = _rotary(self.base.rotary_emb, x, tokens)
        return x

    def _final_norm(self, rules, x: Tensor) -> Tensor:
        return rules.layer_norm(x, self.base.final_layer_norm)

    def _mlp(self, rules, mlp: nn.Module, h: Tensor) -> Tensor:
        pre = rules.linear(h, mlp.dense_h_to_4h)  # (B, T, F)
        return rules.linear(pass_through(pre, mlp.act(pre)), mlp.dense_4h_to_h)

    def _layer(self, rules, i: int, layer: nn.Module, x: Tensor, allowed: Tensor, rotary: tuple[Tensor, Tensor]):
        slot, attention = self.slots[i], layer.attention
        Dh = slot.head_dim
        qkv = rules.linear(rules.layer_norm(x, layer.input_layernorm), attention.query_key_value)  # (B, T, H*3*Dh)
        B, T, _ = qkv.shape
        q, k, v = qkv.view(B, T, -1, 3 * Dh).transpose(1, 2).chunk(3, dim=-1)  # (B, H, T, Dh) each
        cos, sin = rotary
        out, ctx = _attend(rules, slot, _rotate(q, cos, sin), _rotate(k, cos, sin), v, allowed, attention.scaling)
        if layer.use_parallel_residual:  # x + attn(ln1(x)) + mlp(ln2(x)): one sum
            ffn = self._mlp(rules, layer.mlp, rules.layer_norm(x, layer.post_attention_layernorm))
            return rules.stabilise(ffn + out + x), ctx
        x = rules.add(out, x)
        return rules.add(self._mlp(rules, layer.mlp, rules.layer_norm(x, layer.post_attention_layernorm)), x), ctx


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

    def _embed(self, rules, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.decoder.embed_tokens.weight)
        if self.decoder.project_in is not None:
            x = rules.linear(x, self.decoder.project_in)
        # Positions as transformers counts them from the mask HFCausalLM.decode passes: 0, 1, ... over
        # the real tokens (padding -1), offset by the table's 2. Constants.
        real = self.model.special.decoder_positions(tokens).long()
        positions = torch.cumsum(real, dim=1) * real - 1
        table = self.decoder.embed_positions
        return x + table.weight[positions + table.offset].detach()

    def _final_norm(self, rules, x: Tensor) -> Tensor:
        if self.decoder.final_layer_norm is not None:
            x = rules.layer_norm(x, self.decoder.final_layer_norm)
        if self.decoder.project_out is not None:
            x = rules.linear(x, self.decoder.project_out)
        return x

    def _layer(self, rules, i: int, layer: nn.Module, x: Tensor, allowed: Tensor, rotary=None):
        slot, attention, before = self.slots[i], layer.self_attn, layer.do_layer_norm_before
        Dh = slot.head_dim
        h = rules.layer_norm(x, layer.self_attn_layer_norm) if before else x
        q, k, v = (_heads(rules.linear(h, getattr(attention, name)), Dh) for name in ("q_proj", "k_proj", "v_proj"))
        out, ctx = _attend(rules, slot, q, k, v, allowed, attention.scaling)  # OPT scales q: the same scores
        x = rules.add(x, out)
        if not before:  # OPT-350m: post-LN
            x = rules.layer_norm(x, layer.self_attn_layer_norm)
        h = rules.layer_norm(x, layer.final_layer_norm) if before else x
        pre = rules.linear(h, layer.fc1)  # (B, T, F)
        x = rules.add(x, rules.linear(pass_through(pre, layer.activation_fn(pre)), layer.fc2))
        if not before:
            x = rules.layer_norm(x, layer.final_layer_norm)
        return x, ctx


class LlamaLRPForward(_CausalLRPForward):
    """Llama, Qwen2, Qwen3: transformers' own forward, its modules given the rule for the pass
    (module_rules); not re-run by hand."""

    def __init__(self, model):
        super().__init__(model)
        config = model.config
        if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
            raise LRPNotImplemented(f"{model.family.name}: LRP does not reproduce sliding-window attention; "
                                   f"set use_sliding_window=False in the config or leave LRP out for this model")

    def decode(self, encoded: EncoderTrace, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
        """The language model over tgt_in (B, T) as HFCausalLM.decode runs it (padding no key), with
        LRP rules; `encoded` is ignored (empty)."""
        mask = self.model.special.decoder_positions(tgt_in).long()
        with _llama_rules(self, rules) as found:
            hidden = self.base(input_ids=tgt_in, attention_mask=mask, use_cache=False).last_hidden_state
        top, target = _top_logit(rules, hidden, self.out_weight, self.out_bias, tgt_in, target, self.model.special)
        return Trace(top, target, {"dec_self": found["contexts"]}, [], found["streams"], [])


# --------------------------------------------------------------------------------------------
# Module-level rules: transformers' own forward, its modules patched for the duration of a pass


LRP_ATTENTION = "headcount_lrp_attention"


def _lrp_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling: float,
                   **kwargs):
    """An AttentionInterface function (transformers' eager one's signature): the rule's attention
    (lrp.*Rules.attention, in the model's dtype) over the module's q (B, H, T, Dh) after rotary and
    k, v (B, KV, Tk, Dh); each query head reads its KV head by `kv_of`. -> ((B, T, H, Dh), None)."""
    rules, slot = module._headcount_lrp
    if attention_mask is None:  # transformers may skip a mask that masks nothing but the future
        Tq, Tk = query.shape[2], key.shape[2]
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device).tril(Tk - Tq)[None, None]
    else:
        allowed = attention_mask == 0  # eager's additive mask: 0 where the key is seen, min elsewhere
    out = _attend_heads(rules, slot, query, key, value, allowed, scaling)
    return out.transpose(1, 2).contiguous(), None


def _epsilon_factor(z: Tensor, eps: float) -> Tensor:
    """The epsilon rule's z / (z + eps sign z), a constant."""
    sign = torch.where(z >= 0, 1.0, -1.0).to(z.dtype)
    return (z / (z + eps * sign)).detach()


def _set_forward(module: nn.Module, forward, undo: list) -> None:
    own = module.__dict__.get("forward")
    module.forward = forward
    undo.append(lambda: module.__dict__.pop("forward") if own is None else setattr(module, "forward", own))


@contextlib.contextmanager
def _llama_rules(lrp_forward: LlamaLRPForward, rules):
    """The Llama-family model of `lrp_forward` with the rule on its modules, inside the block; yields
    {"streams": [embedding, each layer's output], "contexts": [each layer's head contexts]}, filled
    by the forward pass. Everything is put back on leaving; the graph built needs nothing of it.

    The norms' forward: _rms_norm. Each layer's forward is wrapped (and recomputed in the backward
    pass where lrp_forward.recompute is set): within it, its norms, an attention function naming
    `_lrp_attention` (a config copy, as hf_lm._group_explicitly gives one), the activation passed
    through, the SwiGLU product's relevance halved (a pre-hook on down_proj: gradient halved at the
    product is half to each factor), the epsilon rule on every nn.Linear's output (a forward hook;
    W^O's included, behind the gates), and on the two residual sums: z1 = x + attn is stabilised
    where the post-attention norm reads it (a pre-hook) and the layer's output y = z1 + mlp as a
    whole, with z1's own factor added to the gradient z1 gets through y's sum (a term whose value
    is zero), since transformers' layer adds them in its forward, out of a hook's reach."""
    from transformers import AttentionInterface

    if LRP_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(LRP_ATTENTION, _lrp_attention)
    base, found, undo = lrp_forward.base, {"streams": [], "contexts": []}, []
    recording = [True]  # False while a layer is recomputed in the backward pass: nothing new to record
    try:
        handle = base.embed_tokens.register_forward_hook(lambda m, args, out: found["streams"].append(out))
        undo.append(handle.remove)
        _set_forward(base.norm, lambda x: _rms_norm(rules, x, base.norm), undo)
        for layer, slot in zip(base.layers, lrp_forward.slots):
            _set_forward(layer, _layer_with_rules(layer, slot, layer.forward, rules, found, recording,
                                                  lrp_forward.recompute), undo)
        yield found
    finally:
        recording[0] = False
        for fn in reversed(undo):
            fn()


def _layer_with_rules(layer: nn.Module, slot, forward, rules, found: dict, recording: list, recompute: bool):
    """The layer's own `forward` with the rule on its modules (_llama_rules), recomputed or not."""
    attention, mlp = layer.self_attn, layer.mlp
    attnlrp = rules.name != "ding"

    def run(hidden_states, **kwargs):
        undo, state = [], {}
        try:
            for norm in (m for m in layer.modules() if hasattr(m, "variance_epsilon")):  # RMSNorms
                _set_forward(norm, lambda x, norm=norm: _rms_norm(rules, x, norm), undo)
            config = attention.config
            attention.config = copy.copy(config)
            attention.config._attn_implementation = LRP_ATTENTION
            undo.append(lambda: setattr(attention, "config", config))
            object.__setattr__(attention, "_headcount_lrp", (rules, slot))
            undo.append(lambda: attention.__dict__.pop("_headcount_lrp"))
            act = mlp.act_fn.forward
            _set_forward(mlp.act_fn, lambda x: pass_through(x, act(x)), undo)
            hooks = [mlp.down_proj.register_forward_pre_hook(lambda m, args: (half_gradient(args[0]),))]
            if recording[0]:
                hooks.append(slot.head_context.register_forward_hook(
                    lambda m, args, out: found["contexts"].append(out)))
            if attnlrp:
                hooks += [m.register_forward_hook(lambda m, args, out: rules.stabilise(out))
                          for m in layer.modules() if isinstance(m, nn.Linear)]

                def before_norm(m, args):
                    state["z1"] = args[0]
                    return (rules.stabilise(args[0]),)

                hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(before_norm))
            undo += [h.remove for h in hooks]
            y = forward(hidden_states, **kwargs)
        finally:
            for fn in reversed(undo):
                fn()
        if attnlrp:
            z1, eps = state["z1"], rules.eps
            f1, f2 = _epsilon_factor(z1, eps), _epsilon_factor(y, eps)
            y = y.detach() + (y - y.detach()) * f2 + (z1 - z1.detach()) * ((f1 - 1) * f2)
        return y

    def with_rules(hidden_states, **kwargs):
        out = checkpointed(functools.partial(run, **kwargs), hidden_states, layer=layer, recompute=recompute)
        if recording[0]:
            found["streams"].append(out)
        return out

    return with_rules


# --------------------------------------------------------------------------------------------
# Encoder-only


class BertLRPForward:
    """BERT and RoBERTa masked LMs: post-LN encoder, MLM head."""

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

    def _positions(self, src: Tensor) -> Tensor:
        embeddings = self.base.embeddings
        if self.model.family.name == "roberta":  # from padding_idx + 1 over the real tokens
            return embeddings.create_position_ids_from_input_ids(src, embeddings.padding_idx)
        return torch.arange(src.shape[1], device=src.device)[None].expand_as(src)

    def _embed(self, rules, src: Tensor) -> Tensor:
        embeddings = self.base.embeddings
        with torch.no_grad():  # position and token-type (0) embeddings: constants
            constant = embeddings.position_embeddings(self._positions(src)) + embeddings.token_type_embeddings.weight[0]
        return rules.layer_norm(F.embedding(src, embeddings.word_embeddings.weight) + constant, embeddings.LayerNorm)

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        """The encoder over src (B, S) with LRP rules; memory: its last hidden state (B, S, D)."""
        allowed = ~src.eq(self.model.special.pad)[:, None, None, :]  # (B, 1, 1, S)
        x = self._embed(rules, src)  # (B, S, D)
        inputs, contexts = [x], []
        for layer, slot in zip(self.base.encoder.layer, self.slots):
            x, ctx = checkpointed(self._layer, rules, slot, layer, x, allowed, layer=layer, recompute=self.recompute)
            contexts.append(ctx)
            inputs.append(x)
        return EncoderTrace(x, allowed, contexts, inputs)

    def _layer(self, rules, slot, layer: nn.Module, x: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
        """One post-LN encoder layer: -> its output (B, S, D) and its head contexts (B, H, S, Dh)."""
        inner, Dh = layer.attention.self, slot.head_dim
        q, k, v = (_heads(rules.linear(x, getattr(inner, n)), Dh) for n in ("query", "key", "value"))
        out, ctx = _attend(rules, slot, q, k, v, allowed, inner.scaling)
        x = rules.layer_norm(rules.add(x, out), layer.attention.output.LayerNorm)  # post-LN
        pre = rules.linear(x, layer.intermediate.dense)  # (B, S, F)
        ffn = rules.linear(pass_through(pre, layer.intermediate.intermediate_act_fn(pre)), layer.output.dense)
        return rules.layer_norm(rules.add(x, ffn), layer.output.LayerNorm), ctx

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
