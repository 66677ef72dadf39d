"""LRP on transformers' encoder-decoder models: their own forward pass with lrp.py's rules on its modules.

`HFLRPForward` is the `LRPForward` (seq2seq.py) of an `HFSeq2Seq` (hf.py), for every family
(MarianMT, BART, mBART, M2M100/NLLB, T5/mT5, FSMT). As hf_lm_lrp.py does for the language models,
and as lxt applies AttnLRP, it runs transformers' own encoder and decoder (evaluation mode, no
cache) with the rule object's (lrp.DingRules / lrp.AttnLRPRules) forward given to their modules
for the duration of the pass and put back afterwards (module_rules._module_rules); every forward
value is the model's. What each module gets:

- LayerNorm (BART's and mBART's `layernorm_embedding`, each block's, the stacks' final ones):
  `rules.layer_norm`; T5's RMSNorm passes relevance through (ding) or has its root mean square
  held constant (attnlrp: a linear map, epsilon rule), the mean square in float32 as T5LayerNorm.
- Linear maps (q/k/v, feed-forward, W^O behind the head gates, which fold into it as constants):
  transformers' own, the epsilon rule on their output under AttnLRP; plain (z-rule) under ding.
- Attention, self and cross (dec_enc) alike: transformers' AttentionInterface function
  (module_rules._lrp_attention: `rules.attention` over the module's q, k, v, scaled by Dh^-0.5 as
  these families are); T5's relative position bias (computed by each stack's first layer, pruned
  heads' sliced off by hf.py) is added to the scores as a constant, with no scaling. FSMT's
  attention calls no attention function and is time-major: its forward is replaced for the pass
  (`_fsmt_attention`: its own projections, `rules.attention`, its gated W^O).
- Activations (opus-mt: SiLU; BART: GELU; FSMT and T5: ReLU): relevance passed through neuron by
  neuron (lrp.pass_through) under both rules. T5 v1.1's gated feed-forward act(W0 x) * (W1 x)
  gives each factor half of the product's relevance (a pre-hook halves the gradient at `wo`'s
  input), AttnLRP's uniform rule, under both rules.
- Embeddings: the family's own (token embedding times its scale, positions as constants).
- Residual sums, added inline by transformers: AttnLRP's epsilon rule by hooks
  (module_rules._layer_with_rules): post-LN (Marian, BART, FSMT) at the norms that read them;
  pre-LN (mBART, M2M100, T5) where the next norm reads each sum, the layer's output as a whole,
  and each sum's own factor on the gradient it gets through the later sums by terms of value zero.
- The head contexts are read at the gates' `head_context` hook; the streams at each stack's first
  layer input and each layer's output, the memory at each decoder layer's input (a view of its
  own), all batch-major (FSMT's time-major ones as transposed views).

What stays hand-written: the output layer (_top_logit: the one row of the vocabulary projection
each step explains, plus final_logits_bias, after T5's output scale
families.EncoderDecoderFamily.output_scale), for the cost of all V logits, not for the numbers.

Measured against the hand-written forward each family had before (the tiny float64 models of
tests/test_hf_models.py: 1+1 layers with gates 0, 0.3, 0.6, and 2+2 layers without biases;
step_relevance; ding, attnlrp at eps 1e-6 and 1e-2): head relevance equal to 4e-16 relative for
Marian, BART, mBART, M2M100 and FSMT, 2e-15 for T5, gated T5 and mT5; every cut's total to 9e-16;
the paper's rule without biases conserves to 9e-16; the same with every head pruned to one and
with recomputed layers. No family needed its hand-written forward kept.

The traces returned are lrp.py's `EncoderTrace` / `Trace`, so lrp.step_relevance and
relevance.head_relevance drive the backward passes unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.models.lrp import EncoderTrace, Trace
from headcount.models.module_rules import _allowed, _module_rules


def lrp_forward_of(model):
    """The LRPForward of an HFSeq2Seq."""
    return HFLRPForward(model)


def _top_logit(model, hidden: Tensor, tgt_in: Tensor, rules, target: Tensor | None, scale: float = 1.0):
    """(stabilised top-1 logit (B, T), target (B, T)): output layer(hidden * scale) + final_logits_bias."""
    weight = model.family.output_layer(model.hf).weight  # (V, D)
    bias = getattr(model.hf, "final_logits_bias", None)
    bias = None if bias is None else bias[0].to(hidden.dtype)  # (V,)
    target = torch.full_like(tgt_in, -1) if target is None else target
    missing = target < 0  # (B, T) steps whose top-1 token is not known yet
    if missing.any():
        with torch.no_grad():
            logits = F.linear(hidden[missing] * scale, weight, bias)  # (M, V)
            logits[:, list(model.special.never_generated())] = float("-inf")
            target = target.masked_scatter(missing, logits.argmax(dim=-1))
    top = (hidden * scale * weight[target]).sum(dim=-1)  # (B, T)
    if bias is not None:
        top = top + bias[target]
    return rules.stabilise(top), target


class HFLRPForward:
    """transformers' encoder and decoder under module_rules._module_rules (see the module docstring)."""

    def __init__(self, model):
        family = model.family
        self.model, self.family, self.hf = model, family, model.hf
        self.encoder, self.decoder = family.stacks(model.hf)
        self.slots = model.attention_modules()
        self.scale = family.output_scale(model.config)
        self.time_major = family.time_major
        self.recompute = False  # each layer recomputed in the backward pass (lrp.step_relevance sets it)
        self._decoder_layers = {id(layer) for layer in self._stack_layers(self.decoder)}
        if family.time_major:
            self._attention_forward = _fsmt_attention

    def _stack_layers(self, stack: nn.Module):
        return stack.block if self.family.t5_layout else stack.layers

    # ------------------------------------------------------------------ what module_rules asks

    def _outside(self):
        names = ("layernorm_embedding", "layer_norm", "final_layer_norm")
        return [getattr(stack, n) for stack in (self.encoder, self.decoder) for n in names
                if isinstance(getattr(stack, n, None), nn.Module)]

    def _activations(self, layer):
        if self.family.t5_layout:
            return [(layer.layer[-1].DenseReluDense, "act")]
        return [(layer, "activation_fn")]

    def _product(self, layer):
        dense = layer.layer[-1].DenseReluDense if self.family.t5_layout else None
        return dense.wo if dense is not None and hasattr(dense, "wi_0") else None  # its input: act(W0 x) * (W1 x)

    def _residual(self, layer):
        if self.family.t5_layout:  # each sublayer after the first reads the previous sum through its norm
            return ("pre", *(sub.layer_norm for sub in layer.layer[1:]))
        cross = getattr(layer, "encoder_attn_layer_norm", None)
        if self.family.pre_norm:
            return ("pre", *(n for n in (cross, layer.final_layer_norm) if n is not None))
        return ("post", *(n for n in (layer.self_attn_layer_norm, cross, layer.final_layer_norm) if n is not None))

    def _memory_index(self, layer):
        """Where a decoder layer takes the encoder memory among its positional arguments after the
        hidden states (None: an encoder layer)."""
        if id(layer) not in self._decoder_layers:
            return None
        return 2 if self.family.t5_layout else 0 if self.time_major else 1

    # ------------------------------------------------------------------ LRPForward

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        """The encoder over src (B, S) as HFSeq2Seq.encode runs it, with LRP rules."""
        real = ~src.eq(self.model.special.pad)
        layers = [(layer, [(slot, "enc_self", False)])
                  for layer, slot in zip(self._stack_layers(self.encoder), self.slots["enc_self"])]
        with _module_rules(self, rules, layers) as found:
            memory = self.encoder(input_ids=src, attention_mask=real.long()).last_hidden_state
        return EncoderTrace(memory, real[:, None, None, :], found["contexts"], found["streams"])

    def decode(self, encoded: EncoderTrace, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
        """The decoder over tgt_in (B, T) as HFSeq2Seq.decode runs it (no cache), with LRP rules."""
        layers = [(layer, [(self_slot, "dec_self", True), (cross_slot, "dec_enc", False)])
                  for layer, self_slot, cross_slot in zip(self._stack_layers(self.decoder), self.slots["dec_self"],
                                                          self.slots["dec_enc"])]
        real = encoded.allowed[:, 0, 0, :]  # (B, S)
        with _module_rules(self, rules, layers) as found:
            if self.time_major:
                hidden = _fsmt_decoder(self.decoder, tgt_in, encoded.memory, real)
            else:
                hidden = self.decoder(input_ids=tgt_in, encoder_hidden_states=encoded.memory,
                                      encoder_attention_mask=real.long(), use_cache=False).last_hidden_state
        contexts = {"enc_self": encoded.contexts, "dec_self": found["kinds"].get("dec_self", []),
                    "dec_enc": found["kinds"].get("dec_enc", [])}
        top, target = _top_logit(self.model, hidden, tgt_in, rules, target, self.scale)
        return Trace(top, target, contexts, encoded.inputs, found["streams"], found["memories"])


def _fsmt_decoder(decoder: nn.Module, tgt_in: Tensor, memory: Tensor, real: Tensor) -> Tensor:
    """FSMT's decoder over tgt_in (B, T) as hf._fsmt_decoder runs it without a cache (its masks as
    positional arguments: the source's 1 at real tokens, no target padding mask, the causal mask
    (T, T) 0 where allowed and the dtype's minimum elsewhere), its output layer bypassed: the hidden
    state (B, T, D)."""
    T, dtype = tgt_in.shape[1], decoder.embed_tokens.weight.dtype
    future = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1)
    causal = torch.zeros(T, T, dtype=dtype, device=tgt_in.device).masked_fill(future, torch.finfo(dtype).min)
    projection = decoder.output_projection
    decoder.output_projection = nn.Identity()
    try:
        return decoder(tgt_in, memory, real.long(), None, causal, use_cache=False).last_hidden_state
    finally:
        decoder.output_projection = projection


def _fsmt_attention(slot, rules, causal: bool):
    """FSMT's attention forward for the pass (its modules call no attention function): query
    (T, B, D), key (Tk, B, D), key_padding_mask (B, Tk) True at padding, attn_mask (T, Tk) added to
    the scores; its own q/k/v projections (hooked as any linear map), `rules.attention` (scaled by
    Dh^-0.5, as FSMT's q), its gated W^O on the time-major concatenation."""
    attention = slot.attention
    H, Dh = slot.n_heads, slot.head_dim

    def forward(query: Tensor, key: Tensor | None = None, key_padding_mask: Tensor | None = None,
                layer_state=None, attn_mask: Tensor | None = None, output_attentions: bool = False, **kwargs):
        T, B, _ = query.shape
        source = key if attention.encoder_decoder_attention else query

        def split(z: Tensor) -> Tensor:  # (L, B, H * Dh) -> (B, H, L, Dh)
            return z.view(z.shape[0], B, H, Dh).permute(1, 2, 0, 3)

        q, k, v = split(attention.q_proj(query)), split(attention.k_proj(source)), split(attention.v_proj(source))
        Tk = k.shape[2]
        allowed = _allowed(None if attn_mask is None else attn_mask[None, None], causal, T, Tk, query.device)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, :].bool()
        ctx = rules.attention(q, k, v, allowed)  # (B, H, T, Dh)
        return attention.out_proj(ctx.permute(2, 0, 1, 3).reshape(T, B, H * Dh)), None

    return forward
