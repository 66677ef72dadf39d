"""Hard Concrete gates on attention heads (Louizos et al. 2018), as Voita et al. (2019) use them.

Each gated attention module gets one log alpha per head. During training a gate is sampled once
per head per batch (shared by all sentences in it):

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log alpha) / beta),
    g = clip(s * (r - l) + l, 0, 1)

so g is exactly 0 or 1 with positive probability. At evaluation g = clip(sigmoid(log alpha)
(r - l) + l, 0, 1). The L0 penalty uses P(g != 0) = sigmoid(log alpha - beta log(-l / r)).
Constants as in the authors' code: beta 0.33, (l, r) = (-0.1, 1.1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from headcount.models.seq2seq import Seq2SeqWithHeads, kind_of

BETA, LOW, HIGH = 0.33, -0.1, 1.1


class HardConcreteGates(nn.Module):
    def __init__(self, n_heads: int, beta: float = BETA, low: float = LOW, high: float = HIGH,
                 init: float | None = None, init_range: float = 0.61):
        super().__init__()
        self.beta, self.low, self.high = beta, low, high
        log_alpha = torch.empty(n_heads)
        if init is None:
            nn.init.uniform_(log_alpha, -init_range, init_range)
        else:
            nn.init.constant_(log_alpha, init)
        self.log_alpha = nn.Parameter(log_alpha)

    def sample(self) -> Tensor:
        """One training-time gate per head, (H,): a reparameterised, differentiable sample."""
        u = torch.rand_like(self.log_alpha).clamp(1e-6, 1 - 1e-6)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + self.log_alpha) / self.beta)
        return (s * (self.high - self.low) + self.low).clamp(0.0, 1.0)

    def deterministic(self) -> Tensor:
        """The evaluation gate per head, (H,)."""
        return (torch.sigmoid(self.log_alpha) * (self.high - self.low) + self.low).clamp(0.0, 1.0)

    def forward(self) -> Tensor:
        return self.sample() if self.training else self.deterministic()

    def p_open(self) -> Tensor:
        """P(g != 0) per head, (H,): the expected number of open gates is its sum."""
        return torch.sigmoid(self.log_alpha - self.beta * math.log(-self.low / self.high))

    def p_one(self) -> Tensor:
        """P(g == 1) per head (closed form; used to test the sampler)."""
        return torch.sigmoid(self.log_alpha - self.beta * math.log((1 - self.low) / (self.high - 1)))


# A log alpha at which every sample is exactly 1: with u clamped to [1e-6, 1 - 1e-6], the logit
# of u is above -13.9, so sigmoid((logit u + 100) / beta) rounds to 1 and the stretched gate clips
# to 1; the evaluation gate and P(open) are 1 too.
OPEN_LOG_ALPHA = 100.0


def pin_open(gates: list[HardConcreteGates]) -> None:
    """Gates that cannot close (the lambda = 0 control): log alpha fixed at OPEN_LOG_ALPHA and
    not trained. Sampling still draws its noise, so the control's random stream (dropout) is the
    one a gated run draws."""
    with torch.no_grad():
        for g in gates:
            g.log_alpha.fill_(OPEN_LOG_ALPHA)
            g.log_alpha.requires_grad_(False)


def attach_gates(model: Seq2SeqWithHeads, types=None, init: float | None = None) -> list:
    """Give every attention module of the given types (default: all the model has) Hard Concrete
    gates; returns them.

    The module's fixed 0/1 mask still applies on top (a head masked out stays out).
    """
    types = kind_of(model).attention_types if types is None else types
    gates = []
    for kind in types:
        for module in model.attention_modules()[kind]:
            module.hard_concrete = HardConcreteGates(module.n_heads, init=init).to(module.head_mask.device)
            gates.append(module.hard_concrete)
    return gates


def l0_penalty(gates: list[HardConcreteGates]) -> Tensor:
    """L_C: the mean over gated layers of the expected number of open heads in the layer (the
    authors' scaling; the paper's plain sum is this times the number of gated layers)."""
    return torch.stack([g.p_open().sum() for g in gates]).mean()


@contextmanager
def row_head_masks(model: Seq2SeqWithHeads, masks: dict[str, Tensor]) -> Iterator[None]:
    """A 0/1 head mask per batch row, on top of the model's own gates, while the context is open
    (row_head_edits without replacement values)."""
    with row_head_edits(model, masks):
        yield


@contextmanager
def row_head_edits(model: Seq2SeqWithHeads, masks: dict[str, Tensor],
                   values: dict[tuple[str, int], Tensor] | None = None) -> Iterator[None]:
    """Per batch row, each head's context scaled and replaced, on top of the model's own gates,
    while the context is open: ctx[r, h] -> ctx[r, h] * masks[type][r, layer, h] + values[(type,
    layer)][r, h].

    masks[type]: (rows, layers, H) factors (0/1 for masking; any number scales), padded with zeros
    beyond a physically pruned layer's heads as `head_mask()` is; every forward pass inside must
    have exactly `rows` rows. values[(type, layer)]: (rows, H, T or 1, Dh), what is added after the
    factor (a mean context, or another input's context, where the factor is 0; zeros elsewhere).
    Single-head ablation uses it to run several differently masked copies of one batch in one
    forward pass, the per-head API (analysis.head_access) to ablate, scale or patch sets of heads.
    It goes through each attention module's `head_context` hook point, which every family calls on
    (B, H, Tq, Dh) before its gates (seq2seq.HeadSlots), so no family needs code of its own;
    masking a head's context before W^O is what its 0/1 gate does. A layer whose factors are all 1
    and that has no values is not hooked (it would change nothing), so it may run on fewer rows:
    the layers that copies share below their edited heads (models.shared_prefix).
    """
    handles = []
    values = values or {}

    def hook_for(mask: Tensor, value: Tensor | None):  # mask (rows, H) of one layer
        def hook(module, inputs, ctx):
            if ctx.shape[0] != mask.shape[0]:
                raise ValueError(f"row_head_masks: masks for {mask.shape[0]} rows, a batch of {ctx.shape[0]}")
            out = ctx * mask[:, : ctx.shape[1], None, None].to(device=ctx.device, dtype=ctx.dtype)
            if value is not None:
                if value.shape[2] not in (1, ctx.shape[2]):
                    raise ValueError(f"row head values for {value.shape[2]} positions, a batch of {ctx.shape[2]}")
                out = out + value[:, : ctx.shape[1]].to(device=ctx.device, dtype=ctx.dtype)
            return out

        return hook

    modules = model.attention_modules()
    try:
        for kind, layer in values:
            if kind not in masks:
                raise ValueError(f"row head values for {kind} layer {layer} come without its masks")
        for kind, mask in masks.items():
            if kind not in modules:
                raise ValueError(f"row head masks for {kind}: this model has {sorted(modules)} only")
            if mask.dim() != 3 or mask.shape[1] != len(modules[kind]):
                raise ValueError(f"row head masks for {kind} have shape {tuple(mask.shape)}, expected "
                                 f"(rows, {len(modules[kind])}, H)")
            for layer, module in enumerate(modules[kind]):
                value = values.get((kind, layer))
                if value is not None or not bool((mask[:, layer] == 1).all()):
                    handles.append(module.head_context.register_forward_hook(hook_for(mask[:, layer], value)))
        yield
    finally:
        for handle in handles:
            handle.remove()
