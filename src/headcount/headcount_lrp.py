"""The LRP forward pass of headcount's own Transformer (model.py): a seq2seq.LRPForward.

It re-implements the pre-LayerNorm forward pass (evaluation mode) from the model's own weights
with the rules of lrp.py, leaving model.py untouched: each operation's backward pass is its LRP
rule, every forward value is the model's. lrp.py's docstring says which rule does what.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .lrp import EncoderTrace, Trace, top1_targets
from .model import MultiHeadAttention, Transformer


def _attention_block(rules, m: MultiHeadAttention, x: Tensor, kv: Tensor, allowed: Tensor):
    """-> output (B, Tq, D) and the head contexts (B, H, Tq, Dh) before the gates."""
    B, Tq, D = x.shape
    q = m._split_heads(rules.linear(x, m.q_proj))  # (B, H, Tq, Dh)
    k = m._split_heads(rules.linear(kv, m.k_proj))  # (B, H, Tk, Dh)
    v = m._split_heads(rules.linear(kv, m.v_proj))
    ctx = rules.attention(q, k, v, allowed)  # (B, H, Tq, Dh)
    # The head gates are constant factors, so gating a head's context is the same linear map as
    # scaling its columns of W^O; folded into the weight, the backward pass needs no element-wise
    # product over the seed-batched gradients.
    w_out = m.out_proj.weight * m.gates().to(ctx.dtype).repeat_interleave(m.head_dim)  # (D, H*Dh)
    out = rules.linear(ctx.transpose(1, 2).reshape(B, Tq, D), m.out_proj, w_out)
    return out, ctx


def _feed_forward(rules, layer, x: Tensor) -> Tensor:
    pre = rules.linear(rules.layer_norm(x, layer.ffn_norm), layer.ffn.w_in)  # (B, T, F)
    # ReLU, relevance passing plain, written as a product with its constant 0/1 mask: the same value
    # and gradient as F.relu, but the vmapped backward is a broadcast multiply, 2.5x faster on CPU
    # than relu's threshold_backward with a seed dimension.
    hidden = pre * (pre > 0).to(pre.dtype)
    return rules.add(x, rules.linear(hidden, layer.ffn.w_out))


class PreNormLRPForward:
    """headcount's Transformer with LRP backward rules (Transformer.lrp_forward())."""

    def __init__(self, model: Transformer):
        self.model = model

    def _embed(self, embed: nn.Embedding, tokens: Tensor) -> Tensor:
        T = tokens.shape[1]
        return F.embedding(tokens, embed.weight) * math.sqrt(self.model.cfg.d_model) + self.model.positions[:T].to(
            embed.weight.dtype
        )

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        """The encoder's forward pass with LRP backward rules."""
        model = self.model
        allowed = ~src.eq(model.special.pad)[:, None, None, :]  # (B, 1, 1, S)
        x = self._embed(model.src_embed, src)  # (B, S, D)
        inputs, contexts = [x], []
        for layer in model.encoder_layers:
            normed = rules.layer_norm(x, layer.self_attn_norm)
            h, ctx = _attention_block(rules, layer.self_attn, normed, normed, allowed)
            contexts.append(ctx)
            x = _feed_forward(rules, layer, rules.add(x, h))
            inputs.append(x)
        memory = rules.layer_norm(x, model.encoder_norm)  # (B, S, D)
        return EncoderTrace(memory, allowed, contexts, inputs)

    def decode(self, encoded: EncoderTrace, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
        """The decoder's teacher-forced forward pass with LRP backward rules, on top of `encoded`.

        The decoder is causal, so running it on a prefix tgt_in[:, :t] gives the same values at
        those steps as running it on the whole target; a step's relevance never reaches later
        positions. target (B, T): the token whose logit is explained at each step; where it is -1
        (everywhere by default) the top-1 token (lrp.top1_targets).
        """
        model = self.model
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()[None, None]  # (1, 1, T, T)
        contexts = {"enc_self": encoded.contexts, "dec_self": [], "dec_enc": []}
        y = self._embed(model.tgt_embed, tgt_in)  # (B, T, D)
        dec_inputs, memories = [y], []
        for layer in model.decoder_layers:
            normed = rules.layer_norm(y, layer.self_attn_norm)
            h, ctx = _attention_block(rules, layer.self_attn, normed, normed, causal)
            contexts["dec_self"].append(ctx)
            y = rules.add(y, h)
            mem = encoded.memory.view_as(encoded.memory)  # a node of its own: what this layer sends to the encoder
            memories.append(mem)
            h, ctx = _attention_block(rules, layer.cross_attn, rules.layer_norm(y, layer.cross_attn_norm), mem,
                                      encoded.allowed)
            contexts["dec_enc"].append(ctx)
            y = _feed_forward(rules, layer, rules.add(y, h))
            dec_inputs.append(y)
        hidden = rules.layer_norm(y, model.decoder_norm)  # (B, T, D)

        weight = model.generator.weight  # (V, D)
        target = top1_targets(lambda h: F.linear(h, weight), hidden, tgt_in, target, model.special)
        top_logit = rules.stabilise((hidden * weight[target]).sum(dim=-1))  # (B, T): one row of W
        return Trace(top_logit, target, contexts, encoded.inputs, dec_inputs, memories)
