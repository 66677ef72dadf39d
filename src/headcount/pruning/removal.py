"""Physical pruning: a model whose attention modules compute only the heads their masks keep, and
the attention cost before and after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def computing_kept_heads(model: Seq2SeqWithHeads) -> Iterator[Seq2SeqWithHeads]:
    """Within the block the model computes only the heads its fixed 0/1 mask keeps (physical
    pruning); on leaving, the trained weights go back into the full layout, mask included, so the
    model saves and loads as the masked model it stands for.

    For training a from-scratch twin: a masked head gets no gradient, and Adam (no weight decay)
    leaves a parameter without gradient unchanged, so masked training would leave those heads at
    their initial weights too. The same function is trained at less cost (a twin keeping 22 of 144
    heads took 36% less time a step, benchmarks/RESULTS.md); the attention dropout draws fewer
    random numbers, so the run is an equally valid one, not the masked run bit for bit.
    headcount's own Transformer only: it reads the modules' q/k/v/out projections."""
    saved = []  # (module, its mask, its full-size projections)
    for modules in model.attention_modules().values():
        for module in modules:
            mask = module.head_mask.detach().clone()
            if not bool(((mask == 0) | (mask == 1)).all()):
                raise ValueError("computing_kept_heads needs a 0/1 head mask")
            if bool((mask == 1).all()):
                continue  # nothing to remove
            projections = {name: getattr(module, name) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
            saved.append((module, mask, projections))
            module.keep_heads(mask.nonzero().flatten().tolist())
    try:
        yield model
    finally:
        with torch.no_grad():
            for module, mask, full in saved:
                kept = mask.nonzero().flatten()
                index = (kept[:, None] * module.head_dim + torch.arange(module.head_dim)).flatten()
                for name in ("q_proj", "k_proj", "v_proj"):
                    trained = getattr(module, name)
                    full[name].weight[index] = trained.weight.to(full[name].weight)
                    full[name].bias[index] = trained.bias.to(full[name].bias)
                trained = module.out_proj
                full["out_proj"].weight[:, index] = trained.weight.to(full["out_proj"].weight)
                full["out_proj"].bias.copy_(trained.bias)
                device = trained.bias.device
                for name, linear in full.items():
                    setattr(module, name, linear.to(device))
                module.n_heads = len(mask)
                module.head_mask = mask.to(device)


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


def attention_parameters(model: Seq2SeqWithHeads) -> int:
    """Parameters of the attention blocks, whose heads pruning removes: each attention module's own
    (W^Q, W^K, W^V, W^O with their biases, and any norm inside the block), counted once. Their
    share of all parameters bounds what removing heads can save."""
    owners = {}
    for modules in model.attention_modules().values():
        for m in modules:
            owner = getattr(m, "attention", None)
            owner = owner if isinstance(owner, torch.nn.Module) else m
            owners[id(owner)] = owner
    seen, total = set(), 0
    for owner in owners.values():
        for p in owner.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total
