"""LRP on transformers' encoder-decoder models: their forward pass re-run with lrp.py's rules.

`HFLRPForward` is the `LRPForward` (seq2seq.py) of an `HFSeq2Seq` (hf.py). It re-creates the
architecture as it is, from the model's own modules, in evaluation mode:

- embeddings: token embedding times the family's scale (Marian and FSMT with scale_embedding:
  sqrt(d_model)) plus the family's own positions (Marian's sinusoids, BART's learned table, M2M100's
  and FSMT's padding-aware sinusoids), taken from the model's position module as constants; BART
  and mBART then apply `layernorm_embedding`;
- blocks: post-LayerNorm, x = LN(x + f(x)) (Marian, BART, FSMT), or pre-LayerNorm, x = x + f(LN(x)),
  with a final LayerNorm on each stack (mBART, M2M100);
- attention re-computed here from the module's q/k/v projections and its `HeadGates`' W^O, so
  FSMT's time-major layout (its modules take (T, B, D)) plays no part: every tensor here is
  batch-major;
- the feed-forward activation from the config (opus-mt: swish/SiLU; BART: GELU; FSMT: ReLU): relevance passes
  through an element-wise non-linearity unchanged, neuron by neuron (lrp.pass_through), under
  both rules: the paper's rule ignores non-linearities, as lrp.py does for ReLU, and AttnLRP's
  identity rule for element-wise non-linearities is the same map;
- logits: the output layer (lm_head; FSMT: its decoder's output_projection) plus final_logits_bias
  (Marian, BART), so the top-1 logit is what the model scores; its bias absorbs its share of the
  relevance (z-rule).

Linear maps, residual sums, LayerNorm and attention use the rule object's `linear`, `add`,
`layer_norm` and `attention` (lrp.DingRules / lrp.AttnLRPRules), and the traces returned are lrp.py's
`EncoderTrace` / `Trace`, so lrp.step_relevance and relevance.head_relevance drive the backward passes
unchanged.

T5 (`T5LRPForward`) differs: no biases, no positions at the input but a relative position bias
added to every layer's attention scores (computed by the first layer, a constant here, as biases
are), no score scaling, RMSNorm (the paper's rule passes relevance through it; AttnLRP holds the
root mean square constant, which makes it a linear map, epsilon rule), pre-LayerNorm blocks, and
the hidden state scaled as transformers scales it before the output layer
(families.EncoderDecoderFamily.output_scale: d_model^-0.5 for a T5 saved with tied embeddings, 1
for mT5). Its gated feed-forward variant (T5 v1.1, Flan-T5: act(W0 x) * (W1 x)) multiplies two
neurons: both rules give each factor half of the product's relevance (AttnLRP's uniform rule; the
paper's rule has no case for it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.models.lrp import EncoderTrace, Trace, half_gradient, pass_through


def lrp_forward_of(model):
    """The LRPForward of an HFSeq2Seq, by family."""
    if model.family.t5_layout:
        return T5LRPForward(model)
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
    def __init__(self, model):
        family = model.family
        self.model, self.family, self.hf = model, family, model.hf
        self.encoder, self.decoder = family.stacks(model.hf)
        self.slots = model.attention_modules()
        from transformers.activations import ACT2FN

        self.activation = ACT2FN[model.config.activation_function]

    # ------------------------------------------------------------------ building blocks

    def _positions(self, stack: nn.Module, tokens: Tensor, embeds: Tensor) -> Tensor:
        """The family's position encodings for `tokens` (B, T), a constant (B or 1, T, D)."""
        with torch.no_grad():
            name = self.family.name
            if name == "marian":
                positions = stack.embed_positions(tokens.shape)
            elif name == "m2m_100":
                positions = stack.embed_positions(tokens, embeds)
            else:  # BART, mBART: a learned table, offset by 2; FSMT: sinusoids from the pad id + 1 on
                positions = stack.embed_positions(tokens)
        return positions if positions.dim() == 3 else positions[None]

    def _embed(self, stack: nn.Module, tokens: Tensor, rules) -> Tensor:
        embed = stack.embed_tokens
        x = F.embedding(tokens, embed.weight) * float(getattr(embed, "embed_scale", 1.0) or 1.0)
        x = x * float(getattr(stack, "embed_scale", 1.0))  # Marian and FSMT scale outside the embedding module
        x = x + self._positions(stack, tokens, x).to(x.dtype)
        norm = getattr(stack, "layernorm_embedding", None)
        return x if norm is None else rules.layer_norm(x, norm)

    def _attention(self, rules, slot, attention: nn.Module, x: Tensor, kv: Tensor, allowed: Tensor):
        """-> output (B, Tq, D) and the head contexts (B, H, Tq, Dh) before the gates."""
        B, Tq, _ = x.shape
        H, Dh = slot.n_heads, slot.head_dim
        q_name, k_name, v_name = self.family.qkv_names

        def split(z: Tensor) -> Tensor:
            return z.view(z.shape[0], z.shape[1], H, Dh).transpose(1, 2)

        q = split(rules.linear(x, getattr(attention, q_name)))  # (B, H, Tq, Dh)
        k = split(rules.linear(kv, getattr(attention, k_name)))  # (B, H, Tk, Dh)
        v = split(rules.linear(kv, getattr(attention, v_name)))
        ctx = rules.attention(q, k, v, allowed)  # (B, H, Tq, Dh); scaled by Dh^-0.5, as these families do
        # Gates are constants: folded into W^O's columns (as lrp.py does for headcount's model).
        w_out = slot.proj.weight * slot.gates().to(ctx.dtype).repeat_interleave(Dh)  # (D, H*Dh)
        out = rules.linear(ctx.transpose(1, 2).reshape(B, Tq, H * Dh), slot.proj, w_out)
        return out, ctx

    def _feed_forward(self, rules, layer: nn.Module, x: Tensor) -> Tensor:
        pre = rules.linear(x, layer.fc1)  # (B, T, F)
        return rules.linear(pass_through(pre, self.activation(pre)), layer.fc2)

    def _block(self, rules, x: Tensor, norm: nn.LayerNorm, branch) -> Tensor:
        """One residual block, pre-LN x + f(LN(x)) or post-LN LN(x + f(x))."""
        if self.family.pre_norm:
            return rules.add(x, branch(rules.layer_norm(x, norm)))
        return rules.layer_norm(rules.add(x, branch(x)), norm)

    # ------------------------------------------------------------------ LRPForward

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        allowed = ~src.eq(self.model.special.pad)[:, None, None, :]  # (B, 1, 1, S)
        x = self._embed(self.encoder, src, rules)  # (B, S, D)
        inputs, contexts = [x], []
        for layer, slot in zip(self.encoder.layers, self.slots["enc_self"]):

            def attend(h, layer=layer, slot=slot):
                out, ctx = self._attention(rules, slot, layer.self_attn, h, h, allowed)
                contexts.append(ctx)
                return out

            x = self._block(rules, x, layer.self_attn_layer_norm, attend)
            x = self._block(rules, x, layer.final_layer_norm, lambda h, lay=layer: self._feed_forward(rules, lay, h))
            inputs.append(x)
        final = getattr(self.encoder, "layer_norm", None)
        memory = x if final is None else rules.layer_norm(x, final)
        return EncoderTrace(memory, allowed, contexts, inputs)

    def decode(self, encoded: EncoderTrace, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()[None, None]  # (1, 1, T, T)
        contexts = {"enc_self": encoded.contexts, "dec_self": [], "dec_enc": []}
        y = self._embed(self.decoder, tgt_in, rules)  # (B, T, D)
        dec_inputs, memories = [y], []
        for i, layer in enumerate(self.decoder.layers):

            def attend_self(h, layer=layer, i=i):
                out, ctx = self._attention(rules, self.slots["dec_self"][i], layer.self_attn, h, h, causal)
                contexts["dec_self"].append(ctx)
                return out

            def attend_source(h, layer=layer, i=i):
                mem = encoded.memory.view_as(encoded.memory)  # a node of its own, as in lrp.py
                memories.append(mem)
                out, ctx = self._attention(rules, self.slots["dec_enc"][i], layer.encoder_attn, h, mem,
                                           encoded.allowed)
                contexts["dec_enc"].append(ctx)
                return out

            y = self._block(rules, y, layer.self_attn_layer_norm, attend_self)
            y = self._block(rules, y, layer.encoder_attn_layer_norm, attend_source)
            y = self._block(rules, y, layer.final_layer_norm, lambda h, lay=layer: self._feed_forward(rules, lay, h))
            dec_inputs.append(y)
        final = getattr(self.decoder, "layer_norm", None)
        hidden = y if final is None else rules.layer_norm(y, final)  # (B, T, D)

        top, target = _top_logit(self.model, hidden, tgt_in, rules, target)
        return Trace(top, target, contexts, encoded.inputs, dec_inputs, memories)


class T5LRPForward:
    """T5 with LRP backward rules (see the module docstring)."""

    def __init__(self, model):
        self.model, self.hf = model, model.hf
        self.encoder, self.decoder = model.family.stacks(model.hf)
        self.slots = model.attention_modules()
        self.scale = model.family.output_scale(model.config)

    @staticmethod
    def _rms_norm(rules, x: Tensor, norm: nn.Module) -> Tensor:
        # The mean square in float32 whatever the dtype, as transformers' T5LayerNorm computes it.
        inverse_rms = torch.rsqrt(x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True) + norm.variance_epsilon)
        if rules.name == "ding":
            return pass_through(x, norm.weight * (x * inverse_rms))
        return rules.stabilise(norm.weight * (x * inverse_rms.detach()))  # a linear map once rms is constant

    @staticmethod
    def _attention(rules, slot, attention: nn.Module, x: Tensor, kv: Tensor, allowed: Tensor, bias: Tensor):
        """lrp.py's attention rules with T5's relative position bias added to the scores (no scaling)."""
        B, Tq, _ = x.shape
        H, Dh = slot.n_heads, slot.head_dim

        def split(z: Tensor) -> Tensor:
            return z.view(z.shape[0], z.shape[1], H, Dh).transpose(1, 2)

        q = split(rules.linear(x, attention.q))  # (B, H, Tq, Dh)
        k, v = split(rules.linear(kv, attention.k)), split(rules.linear(kv, attention.v))  # (B, H, Tk, Dh)
        raw = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
        if rules.name == "attnlrp":
            raw = rules.stabilise(half_gradient(raw))
        probs = (raw * attention.scaling + bias).masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        ctx = probs.detach() @ v if rules.name == "ding" else rules.stabilise(half_gradient(probs @ v))
        w_out = slot.proj.weight * slot.gates().to(ctx.dtype).repeat_interleave(Dh)  # (D, H*Dh)
        return rules.linear(ctx.transpose(1, 2).reshape(B, Tq, H * Dh), slot.proj, w_out), ctx

    def _feed_forward(self, rules, ff: nn.Module, x: Tensor) -> Tensor:
        dense = ff.DenseReluDense
        if hasattr(dense, "wi_0"):  # gated: act(W0 x) * (W1 x), half the relevance to each factor
            gate = rules.linear(x, dense.wi_0)
            hidden = half_gradient(pass_through(gate, dense.act(gate)) * rules.linear(x, dense.wi_1))
        else:
            pre = rules.linear(x, dense.wi)
            hidden = pass_through(pre, dense.act(pre))
        return rules.linear(hidden, dense.wo)

    @staticmethod
    def _kept(bias: Tensor, slot) -> Tensor:
        """The position bias (1, H, Tq, Tk) of the layer's remaining heads (keep_heads)."""
        return bias.index_select(1, torch.tensor(slot.kept, dtype=torch.long, device=bias.device))

    @staticmethod
    def _bias(stack: nn.Module, Tq: int, Tk: int) -> Tensor:
        with torch.no_grad():
            return stack.block[0].layer[0].SelfAttention.compute_bias(Tq, Tk)  # (1, H, Tq, Tk)

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        allowed = ~src.eq(self.model.special.pad)[:, None, None, :]  # (B, 1, 1, S)
        S = src.shape[1]
        x = F.embedding(src, self.encoder.embed_tokens.weight)  # (B, S, D)
        bias = self._bias(self.encoder, S, S).to(x.dtype)
        inputs, contexts = [x], []
        for block, slot in zip(self.encoder.block, self.slots["enc_self"]):
            attn, ff = block.layer[0], block.layer[-1]
            h, ctx = self._attention(rules, slot, attn.SelfAttention, self._rms_norm(rules, x, attn.layer_norm),
                                     self._rms_norm(rules, x, attn.layer_norm), allowed, self._kept(bias, slot))
            contexts.append(ctx)
            x = rules.add(x, h)
            x = rules.add(x, self._feed_forward(rules, ff, self._rms_norm(rules, x, ff.layer_norm)))
            inputs.append(x)
        memory = self._rms_norm(rules, x, self.encoder.final_layer_norm)
        return EncoderTrace(memory, allowed, contexts, inputs)

    def decode(self, encoded: EncoderTrace, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
        T, S = tgt_in.shape[1], encoded.memory.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()[None, None]  # (1, 1, T, T)
        contexts = {"enc_self": encoded.contexts, "dec_self": [], "dec_enc": []}
        y = F.embedding(tgt_in, self.decoder.embed_tokens.weight)  # (B, T, D)
        self_bias = self._bias(self.decoder, T, T).to(y.dtype)
        cross_bias = y.new_zeros(1, 1, T, S)  # T5's cross-attention has no position bias
        dec_inputs, memories = [y], []
        for i, block in enumerate(self.decoder.block):
            attn, cross, ff = block.layer[0], block.layer[1], block.layer[2]
            normed = self._rms_norm(rules, y, attn.layer_norm)
            h, ctx = self._attention(rules, self.slots["dec_self"][i], attn.SelfAttention, normed, normed, causal,
                                     self._kept(self_bias, self.slots["dec_self"][i]))
            contexts["dec_self"].append(ctx)
            y = rules.add(y, h)
            mem = encoded.memory.view_as(encoded.memory)
            memories.append(mem)
            h, ctx = self._attention(rules, self.slots["dec_enc"][i], cross.EncDecAttention,
                                     self._rms_norm(rules, y, cross.layer_norm), mem, encoded.allowed, cross_bias)
            contexts["dec_enc"].append(ctx)
            y = rules.add(y, h)
            y = rules.add(y, self._feed_forward(rules, ff, self._rms_norm(rules, y, ff.layer_norm)))
            dec_inputs.append(y)
        hidden = self._rms_norm(rules, y, self.decoder.final_layer_norm)
        top, target = _top_logit(self.model, hidden, tgt_in, rules, target, self.scale)
        return Trace(top, target, contexts, encoded.inputs, dec_inputs, memories)
