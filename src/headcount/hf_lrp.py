"""LRP on transformers' encoder-decoder models: their forward pass re-run with lrp.py's rules.

`HFLRPForward` is the `LRPForward` (seq2seq.py) of an `HFSeq2Seq` (hf_models.py). It re-creates the
architecture as it is, from the model's own modules, in evaluation mode:

- embeddings: token embedding times the family's scale (Marian with scale_embedding: sqrt(d_model))
  plus the family's own positions (Marian's sinusoids, BART's learned table, M2M100's
  padding-aware sinusoids), taken from the model's position module as constants; BART and mBART
  then apply `layernorm_embedding`;
- blocks: post-LayerNorm, x = LN(x + f(x)) (Marian, BART), or pre-LayerNorm, x = x + f(LN(x)),
  with a final LayerNorm on each stack (mBART, M2M100);
- the feed-forward activation from the config (opus-mt: swish/SiLU; BART: GELU): relevance passes
  through an element-wise non-linearity unchanged, neuron by neuron (lrp.pass_through), under
  both rules: the paper's rule ignores non-linearities, as lrp.py does for ReLU, and AttnLRP's
  identity rule for element-wise non-linearities is the same map;
- logits: lm_head plus final_logits_bias (Marian, BART), so the top-1 logit is what the model
  scores; its bias absorbs its share of the relevance (z-rule).

Linear maps, residual sums, LayerNorm and attention use the rule object's `linear`, `add`,
`layer_norm` and `attention` (lrp.DingRules / lrp.AttnLRPRules), and the traces returned are lrp.py's
`EncoderTrace` / `Trace`, so lrp.step_relevance and lrp.head_relevance drive the backward passes
unchanged. T5 (relative position bias, RMSNorm, no biases) is not re-created here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .lrp import EncoderTrace, Trace, pass_through


class HFLRPForward:
    def __init__(self, model):
        family = model.family
        if not family.lrp:
            raise NotImplementedError(f"LRP is not implemented for the {family.name} family")
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
            else:  # BART, mBART: a learned table, offset by 2
                positions = stack.embed_positions(tokens)
        return positions if positions.dim() == 3 else positions[None]

    def _embed(self, stack: nn.Module, tokens: Tensor, rules) -> Tensor:
        embed = stack.embed_tokens
        x = F.embedding(tokens, embed.weight) * float(getattr(embed, "embed_scale", 1.0) or 1.0)
        x = x * float(getattr(stack, "embed_scale", 1.0))  # Marian scales outside its embedding module
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

        weight = self.hf.lm_head.weight  # (V, D)
        bias = getattr(self.hf, "final_logits_bias", None)
        bias = None if bias is None else bias[0].to(hidden.dtype)  # (V,)
        target = torch.full_like(tgt_in, -1) if target is None else target
        missing = target < 0  # (B, T) steps whose top-1 token is not known yet
        if missing.any():
            with torch.no_grad():
                logits = F.linear(hidden[missing], weight, bias)  # (M, V)
                logits[:, list(self.model.special.never_generated())] = float("-inf")
                target = target.masked_scatter(missing, logits.argmax(dim=-1))
        top = (hidden * weight[target]).sum(dim=-1)  # (B, T)
        if bias is not None:
            top = top + bias[target]
        return Trace(rules.stabilise(top), target, contexts, encoded.inputs, dec_inputs, memories)
