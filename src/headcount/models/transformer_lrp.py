"""The LRP forward pass of headcount's own Transformer (transformer.py): a seq2seq.LRPForward.

It re-implements the forward pass (evaluation mode) from the model's own weights
with the rules of lrp.py, leaving model.py untouched: each operation's backward pass is its LRP
rule, every forward value is the model's. lrp.py's docstring says which rule does what.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.models.lrp import (
    EncoderTrace,
    StepRelevance,
    Trace,
    cut_totals,
    pass_through,
    step_relevance,
    top1_targets,
)
from headcount.models.recompute import checkpointed
from headcount.models.seq2seq import ATTENTION_TYPES

if TYPE_CHECKING:  # annotations only: the Transformer builds this pass (Transformer.lrp_forward)
    from headcount.models.transformer import MultiHeadAttention, Transformer


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
    """The feed-forward branch, W_out act(W_in x), on its (normalised) input x."""
    pre = rules.linear(x, layer.ffn.w_in)  # (B, T, F)
    if layer.ffn.activation == "relu":
        # ReLU, relevance passing plain, written as a product with its constant 0/1 mask: the same
        # value and gradient as F.relu, but the vmapped backward is a broadcast multiply, 2.5x
        # faster on CPU than relu's threshold_backward with a seed dimension.
        hidden = pre * (pre > 0).to(pre.dtype)
    else:  # GELU (fairseq's option): relevance passes element-wise, under both rules
        hidden = pass_through(pre, F.gelu(pre))
    return rules.linear(hidden, layer.ffn.w_out)


# The most memory one tensor of the hand-written "ding" backward may take (see ding_relevance).
HAND_WRITTEN_MAX_BYTES = 2**30


class TransformerLRPForward:
    """headcount's Transformer with LRP backward rules (Transformer.lrp_forward()), every variant
    of its configuration: pre- or post-LayerNorm blocks, an embedding LayerNorm, ReLU or GELU."""

    def __init__(self, model: Transformer):
        self.model = model
        cfg = model.cfg
        self.pre_norm = cfg.norm == "pre"
        # The hand-written "ding" backward below covers headcount's own architecture.
        self.hand_written = self.pre_norm and cfg.activation == "relu" and not cfg.layernorm_embedding
        self.recompute = False  # each layer recomputed in the backward pass (lrp.step_relevance sets it)

    def ding_relevance(self, src: Tensor, tgt_in: Tensor, target: Tensor | None = None) -> StepRelevance:
        """lrp.step_relevance(rule="ding"), faster: ding_step_relevance below, which holds every
        step of the batch at once; where its largest tensor would pass HAND_WRITTEN_MAX_BYTES (a
        sentence of hundreds of subwords), or for an architecture it does not cover (post-LN,
        GELU, an embedding LayerNorm), autograd's step_relevance, whose memory is bounded by its
        chunks of steps."""
        cfg = self.model.cfg
        (B, S), T = src.shape, tgt_in.shape[1]
        elements = B * T * max(cfg.n_heads * T * max(T, S), S * cfg.d_ff)  # seeds x (attention or FFN) per seed
        too_big = elements * self.model.generator.weight.element_size() > HAND_WRITTEN_MAX_BYTES
        if too_big or not self.hand_written:
            return step_relevance(self.model, src, tgt_in, "ding", target=target)
        return ding_step_relevance(self.model, src, tgt_in, target)

    def _embed(self, side: str, tokens: Tensor, rules=None) -> Tensor:
        """The embedding layer's output (B, T, D): token embedding times the scale plus positions
        (constants), then the embedding LayerNorm if the model has one."""
        model = self.model
        T = tokens.shape[1]
        weight = (model.src_embed if side == "src" else model.tgt_embed).weight
        first = model.cfg.position_offset
        positions = model.position_table(side)[first : first + T].detach().to(weight.dtype)
        x = F.embedding(tokens, weight) * model.embed_scale() + positions
        norm = model.embedding_norm(side)
        return x if norm is None else rules.layer_norm(x, norm)

    def _block(self, rules, x: Tensor, norm: nn.Module, branch) -> Tensor:
        """One residual block, pre-LN x + f(LN(x)) or post-LN LN(x + f(x))."""
        if self.pre_norm:
            return rules.add(x, branch(rules.layer_norm(x, norm)))
        return rules.layer_norm(rules.add(x, branch(x)), norm)

    def _final(self, rules, x: Tensor, norm: nn.Module) -> Tensor:
        return rules.layer_norm(x, norm) if self.pre_norm else x  # post-LN stacks have no final norm

    def _encoder_layer(self, rules, layer, x: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
        """One encoder layer: -> its output (B, S, D) and its head contexts (B, H, S, Dh). A function
        of its inputs alone (no side effects), so that it can be recomputed (models.recompute)."""
        contexts = []

        def attend(h):
            out, ctx = _attention_block(rules, layer.self_attn, h, h, allowed)
            contexts.append(ctx)
            return out

        x = self._block(rules, x, layer.self_attn_norm, attend)
        x = self._block(rules, x, layer.ffn_norm, lambda h: _feed_forward(rules, layer, h))
        return x, contexts[0]

    def _decoder_layer(self, rules, layer, y: Tensor, causal: Tensor, mem: Tensor, allowed: Tensor):
        """One decoder layer over y (B, T, D), reading the encoder output through `mem`, this
        layer's own view of it: -> its output and its self and cross head contexts."""
        contexts = []

        def attend(h, attention, kv, mask):
            out, ctx = _attention_block(rules, attention, h, kv, mask)
            contexts.append(ctx)
            return out

        y = self._block(rules, y, layer.self_attn_norm, lambda h: attend(h, layer.self_attn, h, causal))
        y = self._block(rules, y, layer.cross_attn_norm, lambda h: attend(h, layer.cross_attn, mem, allowed))
        y = self._block(rules, y, layer.ffn_norm, lambda h: _feed_forward(rules, layer, h))
        return y, contexts[0], contexts[1]

    def encode(self, src: Tensor, rules) -> EncoderTrace:
        """The encoder's forward pass with LRP backward rules; each layer recomputed in the backward
        pass when `self.recompute` (models.recompute)."""
        model = self.model
        allowed = ~src.eq(model.special.pad)[:, None, None, :]  # (B, 1, 1, S)
        x = self._embed("src", src, rules)  # (B, S, D)
        inputs, contexts = [x], []
        for layer in model.encoder_layers:
            x, ctx = checkpointed(self._encoder_layer, rules, layer, x, allowed, layer=layer,
                                  recompute=self.recompute)
            contexts.append(ctx)
            inputs.append(x)
        memory = self._final(rules, x, model.encoder_norm)  # (B, S, D)
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
        y = self._embed("tgt", tgt_in, rules)  # (B, T, D)
        dec_inputs, memories = [y], []
        for layer in model.decoder_layers:
            mem = encoded.memory.view_as(encoded.memory)  # a node of its own: what this layer sends to the encoder
            memories.append(mem)
            y, ctx_self, ctx_cross = checkpointed(self._decoder_layer, rules, layer, y, causal, mem, encoded.allowed,
                                                  layer=layer, recompute=self.recompute)
            contexts["dec_self"].append(ctx_self)
            contexts["dec_enc"].append(ctx_cross)
            dec_inputs.append(y)
        hidden = self._final(rules, y, model.decoder_norm)  # (B, T, D)

        weight = model.generator.weight  # (V, D)
        target = top1_targets(lambda h: F.linear(h, weight), hidden, tgt_in, target, model.special)
        top_logit = rules.stabilise((hidden * weight[target]).sum(dim=-1))  # (B, T): one row of W
        return Trace(top_logit, target, contexts, encoded.inputs, dec_inputs, memories)


# --------------------------------------------------------------------------------------------
# The "ding" rule with a hand-written backward pass


def _norm_with_factor(x: Tensor, norm: nn.LayerNorm, tiny: float = 1e-30) -> tuple[Tensor, Tensor]:
    """LayerNorm's value and the factor y / x by which the "ding" rule passes relevance through it."""
    y = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    x_safe = torch.where(x.abs() < tiny, torch.full_like(x, tiny), x)
    return y, y / x_safe  # as lrp.pass_through


def _attend(m: MultiHeadAttention, xq: Tensor, xkv: Tensor, allowed: Tensor):
    """-> output, probabilities (B, H, Tq, Tk), head contexts (B, Tq, H*Dh) before the gates, gated W^O."""
    B, Tq, D = xq.shape
    q = m._split_heads(F.linear(xq, m.q_proj.weight, m.q_proj.bias))
    k = m._split_heads(F.linear(xkv, m.k_proj.weight, m.k_proj.bias))
    v = m._split_heads(F.linear(xkv, m.v_proj.weight, m.v_proj.bias))
    probs = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf")).softmax(-1)
    ctx = probs @ v  # (B, H, Tq, Dh)
    w_out = m.out_proj.weight * m.gates().to(ctx.dtype).repeat_interleave(m.head_dim)  # (D, D)
    ctx_flat = ctx.transpose(1, 2).reshape(B, Tq, D)
    return F.linear(ctx_flat, w_out, m.out_proj.bias), probs, ctx_flat, w_out


def _feed_forward_with_constants(layer, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x + FFN(LayerNorm(x)), with the LayerNorm's pass-through factor and the ReLU's 0/1 mask."""
    normed, factor = _norm_with_factor(x, layer.ffn_norm)
    pre = F.linear(normed, layer.ffn.w_in.weight, layer.ffn.w_in.bias)
    mask = (pre > 0).to(pre.dtype)
    return x + F.linear(pre * mask, layer.ffn.w_out.weight, layer.ffn.w_out.bias), factor, mask


@torch.no_grad()
def ding_step_relevance(model: Transformer, src: Tensor, tgt_in: Tensor, target: Tensor | None = None) -> StepRelevance:
    """lrp.step_relevance for the "ding" rule, its backward pass written out by hand.

    Every "ding" rule is a linear map with constants from the forward pass (the LayerNorm
    pass-through factors, the ReLU's 0/1 masks, the attention probabilities, the gated W^O), so
    the backward pass can be written as plain matrix products. Unlike autograd's dense
    seed-batched backward it visits, for the seed of step t, only the decoder positions its
    relevance reaches: position t in the top layer, 1..t below it, kept as packed (seed,
    position) rows; in the encoder every source position of the seed's own sentence. The same
    numbers as step_relevance (to 5e-12 in float64 on the trained default model), with about
    2/3 of its matrix products. Shapes: M = B*T seeds (one per sentence and step; those past a
    sentence's end stay zero), R packed decoder rows.
    """
    was_training = model.training
    model.eval()  # the gates' evaluation values
    try:
        return _ding_in_eval_mode(model, src, tgt_in, target)
    finally:
        model.train(was_training)


def _ding_in_eval_mode(model: Transformer, src: Tensor, tgt_in: Tensor, target: Tensor | None) -> StepRelevance:
    special, cfg = model.special, model.cfg
    B, S = src.shape
    T = tgt_in.shape[1]
    D, H = cfg.d_model, cfg.n_heads
    Dh = D // H
    embed = TransformerLRPForward(model)._embed
    valid = special.decoder_positions(tgt_in)  # (B, T)
    src_allowed = src.ne(special.pad)[:, None, None, :]  # (B, 1, 1, S)

    # ---- forward, keeping what the backward pass needs
    x = embed("src", src)
    enc_inputs, enc = [x], []
    for layer in model.encoder_layers:
        n, f_attn = _norm_with_factor(x, layer.self_attn_norm)
        h, probs, ctx, w_out = _attend(layer.self_attn, n, n, src_allowed)
        x, f_ffn, mask = _feed_forward_with_constants(layer, x + h)
        enc.append((f_attn, probs, ctx, w_out, f_ffn, mask))
        enc_inputs.append(x)
    memory, f_mem = _norm_with_factor(x, model.encoder_norm)

    causal = torch.ones(T, T, dtype=torch.bool, device=src.device).tril()[None, None]
    y = embed("tgt", tgt_in)
    dec_inputs, dec = [y], []
    for layer in model.decoder_layers:
        n, f_self = _norm_with_factor(y, layer.self_attn_norm)
        h, p_self, ctx_self, w_self = _attend(layer.self_attn, n, n, causal)
        y = y + h
        n2, _ = _norm_with_factor(y, layer.cross_attn_norm)  # the query path: no relevance under the rule
        h, p_cross, ctx_cross, w_cross = _attend(layer.cross_attn, n2, memory, src_allowed)
        y, f_ffn, mask = _feed_forward_with_constants(layer, y + h)
        dec.append((f_self, p_self, ctx_self, w_self, p_cross, ctx_cross, w_cross, f_ffn, mask))
        dec_inputs.append(y)
    hidden, f_final = _norm_with_factor(y, model.decoder_norm)
    weight = model.generator.weight
    target = top1_targets(lambda z: F.linear(z, weight), hidden, tgt_in, target, special)
    top = (hidden * weight[target]).sum(-1)  # (B, T)

    # ---- seeds: one per (sentence, step), M = B*T of them (the invalid ones stay zero)
    M = B * T
    start = (1.0 / torch.where(top == 0, torch.ones_like(top), top)) * valid
    # packed decoder rows: (seed, position k <= t) for valid seeds
    seed_b = torch.arange(B, device=src.device).repeat_interleave(T)  # (M,)
    seed_t = torch.arange(T, device=src.device).repeat(B)
    counts = (seed_t + 1) * valid.reshape(-1)  # rows per seed
    r_seed = torch.arange(M, device=src.device).repeat_interleave(counts)  # (R,)
    offsets = torch.cumsum(counts, 0) - counts
    r_k = torch.arange(len(r_seed), device=src.device) - offsets[r_seed]
    r_b = seed_b[r_seed]
    r_pos = r_b * T + r_k  # index into (B*T, ...) position constants
    r_dense = r_seed * T + r_k  # index into (M*T, ...) per-seed dense tensors
    diag = (offsets + seed_t)[valid.reshape(-1)]  # rows (seed, t) of the valid seeds
    diag_seed = torch.arange(M, device=src.device)[valid.reshape(-1)]

    heads = {kind: torch.zeros(M, len(model.encoder_layers if kind == "enc_self" else model.decoder_layers), H,
                               dtype=top.dtype, device=top.device) for kind in ATTENTION_TYPES}
    n_enc, n_dec = len(enc_inputs), len(dec_inputs)
    totals = torch.zeros(M, n_enc + n_dec + len(dec), dtype=top.dtype, device=top.device)

    def stream_total(values_flat: Tensor, G: Tensor, rows_pos: Tensor, rows_seed: Tensor) -> Tensor:
        per_row = (values_flat[rows_pos] * G).sum(-1)
        return torch.zeros(M, dtype=G.dtype, device=G.device).index_add_(0, rows_seed, per_row)

    def head_rel(ctx_flat: Tensor, G_ctx: Tensor, rows_pos: Tensor, rows_seed: Tensor) -> Tensor:
        rel = (ctx_flat.reshape(B * T, D)[rows_pos] * G_ctx).abs().reshape(-1, H, Dh).sum(-1)  # (rows, H)
        return torch.zeros(M, H, dtype=rel.dtype, device=rel.device).index_add_(0, rows_seed, rel)

    def to_dense(G_rows: Tensor, rows_dense: Tensor) -> Tensor:  # -> (M, H, T, Dh)
        out = torch.zeros(M * T, D, dtype=G_rows.dtype, device=G_rows.device).index_copy_(0, rows_dense, G_rows)
        return out.reshape(M, T, H, Dh).transpose(1, 2)

    # top: the gradient at the last decoder stream, position t of each valid seed
    # (a seed's number b*T + t is also its position's row in (B*T, ...) tensors)
    G = weight[target.reshape(-1)[diag_seed]] * start.reshape(-1)[diag_seed, None]  # d top logit / d hidden
    G = G * f_final.reshape(B * T, D)[diag_seed]  # (valid seeds, D)
    rows = (diag_seed, diag_seed, diag_seed * T + seed_t[diag_seed], diag)  # position, seed, dense row, packed row
    g_memory = torch.zeros(M, S, D, dtype=top.dtype, device=top.device)
    y_flat = [d.reshape(B * T, D) for d in dec_inputs]
    totals[:, n_enc + n_dec - 1] = stream_total(y_flat[-1], G, rows[0], rows[1])
    for li in range(len(dec) - 1, -1, -1):
        layer = model.decoder_layers[li]
        f_self, p_self, ctx_self, w_self, p_cross, ctx_cross, w_cross, f_ffn, mask = dec[li]
        pos, sd, dense_idx, tri_idx = rows
        FF = mask.shape[-1]
        Gm = ((G @ layer.ffn.w_out.weight) * mask.reshape(B * T, FF)[pos]) @ layer.ffn.w_in.weight
        G = G + Gm * f_ffn.reshape(B * T, D)[pos]
        # cross-attention: relevance of its heads, and what it sends to the encoder memory
        G_ctx = G @ w_cross
        heads["dec_enc"][:, li] = head_rel(ctx_cross, G_ctx, pos, sd)
        g_v = p_cross[seed_b].transpose(-2, -1) @ to_dense(G_ctx, dense_idx)  # (M, H, S, Dh)
        g_mem_l = g_v.transpose(1, 2).reshape(M, S, D) @ layer.cross_attn.v_proj.weight
        totals[:, n_enc + n_dec + li] = (memory[seed_b] * g_mem_l).sum(dim=(1, 2))
        g_memory += g_mem_l
        # self-attention
        G_ctx = G @ w_self
        heads["dec_self"][:, li] = head_rel(ctx_self, G_ctx, pos, sd)
        g_v = p_self[seed_b].transpose(-2, -1) @ to_dense(G_ctx, dense_idx)  # (M, H, T, Dh), zero beyond t
        g_v = g_v.transpose(1, 2).reshape(M * T, D)[r_dense] @ layer.self_attn.v_proj.weight  # (R, D)
        G_tri = g_v * f_self.reshape(B * T, D)[r_pos]
        G_tri.index_add_(0, tri_idx, G)  # the residual
        G, rows = G_tri, (r_pos, r_seed, r_dense, torch.arange(len(r_seed), device=src.device))
        totals[:, n_enc + li] = stream_total(y_flat[li], G, r_pos, r_seed)

    # encoder: every seed's memory gradient, dense over the source, seeds as batch (M = B*T)
    Genc = g_memory * f_mem[seed_b]  # (M, S, D)
    totals[:, n_enc - 1] = (enc_inputs[-1][seed_b] * Genc).sum(dim=(1, 2))
    Gv = Genc.view(B, T, S, D)
    for li in range(len(enc) - 1, -1, -1):
        layer = model.encoder_layers[li]
        f_attn, probs, ctx, w_out, f_ffn, mask = enc[li]
        Gv = Gv + (((Gv @ layer.ffn.w_out.weight) * mask[:, None]) @ layer.ffn.w_in.weight) * f_ffn[:, None]
        G_ctx = Gv @ w_out  # (B, T, S, D)
        heads["enc_self"][:, li] = (ctx[:, None] * G_ctx).abs().reshape(B, T, S, H, Dh).sum(dim=(2, 4)).reshape(M, H)
        g_v = probs[:, None].transpose(-2, -1) @ G_ctx.reshape(B, T, S, H, Dh).permute(0, 1, 3, 2, 4)  # (B,T,H,S,Dh)
        g_n = g_v.permute(0, 1, 3, 2, 4).reshape(B, T, S, D) @ layer.self_attn.v_proj.weight
        Gv = Gv + g_n * f_attn[:, None]
        totals[:, li] = (enc_inputs[li][:, None] * Gv).sum(dim=(2, 3)).reshape(M)
    L_of = {kind: h.shape[1] for kind, h in heads.items()}
    heads_out = {kind: h.reshape(B, T, L_of[kind], H).transpose(0, 1) for kind, h in heads.items()}
    totals = totals.reshape(B, T, -1).transpose(0, 1)
    return StepRelevance(heads_out, valid.T, cut_totals(totals, n_enc, n_dec))
