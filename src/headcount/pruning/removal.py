"""Physical pruning: a model whose attention modules compute only the heads their masks keep, and
the attention cost before and after."""

from __future__ import annotations

import torch

from headcount.models.seq2seq import Seq2SeqWithHeads


@torch.no_grad()
def remove_pruned_heads(model: Seq2SeqWithHeads) -> Seq2SeqWithHeads:
    """Physical pruning, in place: every attention module keeps only its unmasked heads
    (HeadSlots.keep_heads), so the model computes only them. Same outputs as the masked model."""
    for modules in model.attention_modules().values():
        for module in modules:
            keep = [h for h in range(module.n_heads) if module.head_mask[h] != 0]
            if len(keep) < module.n_heads:
                module.keep_heads(keep)
    return model


def attention_flops(model: Seq2SeqWithHeads, src_len: int, tgt_len: int) -> float:
    """Multiply-adds of all attention modules for one sentence pair (projections and the two
    attention products), counting only the heads each module computes."""
    d = model.d_model
    total = 0.0
    for kind, modules in model.attention_modules().items():
        tq = src_len if kind == "enc_self" else tgt_len
        tk = tgt_len if kind == "dec_self" else src_len
        for m in modules:
            width = m.n_heads * m.head_dim
            total += tq * d * width * 2 + tk * d * width * 2 + tq * tk * width * 2  # Q,O; K,V; QK^T, PV
    return total


def kv_cache_bytes_per_token(model: Seq2SeqWithHeads, bytes_per_value: int = 2) -> int:
    """Bytes a decoder's key/value cache holds per generated token (keys and values of every
    decoder self-attention layer, fp16/bf16 by default), counting the key/value heads each layer
    computes: where query heads share key/value heads (grouped-query attention, `n_kv_heads`), a
    key/value head goes only with the last query head that uses it."""
    total = 0
    for m in model.attention_modules().get("dec_self", []):
        total += 2 * int(getattr(m, "n_kv_heads", m.n_heads)) * m.head_dim * bytes_per_value
    return total
