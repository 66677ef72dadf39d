"""Training on a few fixed shapes, for CUDA graphs and torch.compile without dynamic shapes.

On a GPU the default model (d_model 256, 6+6 layers) is launch-bound: a step is some 1,500 small
kernels, each shorter than its launch. A CUDA graph replays them with one launch, but only for the
tensor shapes it was recorded with, and a training batch's shape (sentences x longest sentence)
changes from batch to batch. So each batch is padded up to a bucket: its rows to a multiple of
`rows_multiple`, its source and target lengths to multiples of `length_multiple`, which leaves a
handful of shapes for a whole run, each recorded once.

Padding changes nothing that is learned: an added row has a source of one EOS (so that its
attention has a key to look at) and a target of padding only, and the loss here
(`static_sequence_loss`) sums over the real target tokens exactly as loop.sequence_loss does, but
by multiplying with a 0/1 mask instead of selecting the real tokens (a selection has a shape that
depends on the data, which a graph cannot hold). The count of real tokens stays a tensor (no
synchronisation with the host inside the graph).

`padded_loss` is the forward half of training.loop's step on these shapes (`training.compile_step`
chooses it and its backend; benchmarks/gpu_training.sh times that step on a GPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from headcount.data.special import SpecialIds


@dataclass(frozen=True)
class Buckets:
    rows_multiple: int = 32
    length_multiple: int = 8

    def shape(self, rows: int, src_len: int, tgt_len: int) -> tuple[int, int, int]:
        """The padded (rows, source length, target length) of a batch of this shape."""
        def up(n: int, m: int) -> int:
            return max(m, math.ceil(n / m) * m)

        return up(rows, self.rows_multiple), up(src_len, self.length_multiple), up(tgt_len, self.length_multiple)


def pad_batch(batch: tuple[Tensor, Tensor, Tensor], shape: tuple[int, int, int], special: SpecialIds):
    """(src (B, S), tgt_in (B, T), tgt_out (B, T)) padded to `shape` = (rows, S', T'): padding ids on
    the right; each added row a source of one EOS and a target of padding (tgt_in starts with BOS)."""
    src, tgt_in, tgt_out = batch
    rows, s_len, t_len = shape
    B, S = src.shape
    T = tgt_in.shape[1]
    if rows < B or s_len < S or t_len < T:
        raise ValueError(f"pad_batch: a batch of {(B, S, T)} does not fit {shape}")
    out_src = src.new_full((rows, s_len), special.pad)
    out_src[:B, :S] = src
    out_src[B:, 0] = special.eos
    out_in = tgt_in.new_full((rows, t_len), special.pad)
    out_in[:B, :T] = tgt_in
    out_in[B:, 0] = special.bos
    out_out = tgt_out.new_full((rows, t_len), special.pad)
    out_out[:B, :T] = tgt_out
    return out_src, out_in, out_out


def static_sequence_loss(model, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, label_smoothing: float):
    """loop.sequence_loss on every target position, padding masked out: (summed label-smoothed loss,
    summed NLL, real target tokens), all tensors, with shapes that depend only on the input's."""
    memory, src_pad, _ = model.encode(src)
    hidden, _, _ = model.decode(tgt_in, memory, src_pad)
    real = tgt_out.ne(model.special.pad)
    log_probs = F.log_softmax(model.logits(hidden).float(), dim=-1)  # (B, T, V)
    target = tgt_out.masked_fill(~real, 0)
    token_nll = -log_probs.gather(-1, target[..., None]).squeeze(-1)  # (B, T)
    weight = real.to(log_probs.dtype)
    nll = (token_nll * weight).sum()
    loss = nll
    if label_smoothing:
        uniform = (-log_probs.sum(dim=-1) * weight).sum()
        loss = (1.0 - label_smoothing) * nll + uniform * (label_smoothing / log_probs.shape[-1])
    return loss, nll.detach(), real.sum()


# Bucket shapes a compiled step may record (a run with more falls back to eager for the rest).
MAX_SHAPES = 64

# The values of TrainConfig.compile_step besides "eager" (the loop's own step on each batch's shape).
BACKENDS = ("buckets", "cudagraphs", "inductor", "inductor-default", "aot_eager")


def padded_loss(model, label_smoothing: float, autocast_dtype: torch.dtype | None, backend: str = "buckets",
                buckets: Buckets | None = None) -> Callable:
    """The forward half of a training step on bucket shapes: loss(batch) -> (summed label-smoothed
    loss, summed NLL, real target tokens), each batch padded to its bucket and run through `backend`:

    - "buckets": no compilation, the padding alone (to see its cost);
    - "cudagraphs": torch.compile's cudagraphs backend, no code generation: the kernels of eager
      mode, recorded once per shape and replayed;
    - "inductor": torch.compile(mode="reduce-overhead"): fused kernels, replayed as CUDA graphs;
    - "inductor-default": torch.compile(mode="default"), fused kernels without graphs;
    - "aot_eager": torch.compile's tracing (dynamo and AOT autograd, as cudagraphs traces) without
      graphs or code generation: the compiled path's logic, checked on a CPU by the tests.

    Every shape is compiled once (dynamic=False). buckets None: the batch's own shape."""
    device_type = next(model.parameters()).device.type

    def loss_of(src, tgt_in, tgt_out):
        with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            return static_sequence_loss(model, src, tgt_in, tgt_out, label_smoothing)

    if backend != "buckets":
        # One compilation per bucket shape: Multi30k's batches fall into 17 (Buckets()), and dynamo
        # falls back to eager after 8 recompilations of a function by default.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MAX_SHAPES)
    if backend == "buckets":
        run = loss_of
    elif backend == "cudagraphs":
        run = torch.compile(loss_of, backend="cudagraphs", dynamic=False)
    elif backend == "inductor":
        run = torch.compile(loss_of, mode="reduce-overhead", dynamic=False)
    elif backend == "aot_eager":
        run = torch.compile(loss_of, backend="aot_eager", dynamic=False)
    elif backend == "inductor-default":
        run = torch.compile(loss_of, dynamic=False)
    else:
        raise ValueError(f"static_shapes: backend {backend!r}; expected one of {', '.join(BACKENDS)}")

    def loss(batch):
        if buckets is not None:
            src, tgt_in, _ = batch
            batch = pad_batch(batch, buckets.shape(src.shape[0], src.shape[1], tgt_in.shape[1]), model.special)
        if backend in ("cudagraphs", "inductor"):
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs may be overwritten
        return run(*batch)

    return loss
