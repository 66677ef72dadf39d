"""Per-head gates in front of a transformers attention's output projection, shared by the
encoder-decoder adapter (hf.py) and the language-model adapters (hf_lm.py).

`GatedProjection` takes the place of an attention's output projection W^O: it receives the
concatenated head contexts (B, T, H * Dh; time-major families: T, B, H * Dh) and applies, per head,
the `head_context` hook, the fixed 0/1 `head_mask` and the Hard Concrete gates before W^O:
MultiHead = Concat_i(g_i head_i) W^O (Voita et al. 2019, eq. 2). It satisfies seq2seq.HeadSlots
except for `keep_heads`, which each adapter writes for its attention's layout (its Q, K, V
projections); `_drop_heads` does the part they share (W^O's columns, the gates, the head indices).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headcount.models.seq2seq import heads_per_layer


class GatedProjection(nn.Module):
    """An attention's output projection `proj` (nn.Linear) with per-head gates in front."""

    def __init__(self, proj: nn.Linear, n_heads: int, head_dim: int, time_major: bool = False):
        super().__init__()
        self.proj = proj
        self.time_major = time_major
        self.n_heads = int(n_heads)
        self.head_dim = int(head_dim)
        # on W^O's device: a model already on a GPU, wrapped in memory (headcount.api), stays there
        self.register_buffer("head_mask", torch.ones(self.n_heads, device=proj.weight.device))
        self.kept = list(range(self.n_heads))  # the original index of each remaining head
        self.original_heads = self.n_heads
        self.hard_concrete = None  # HardConcreteGates while pruning (gates.attach_gates)
        self.head_context = nn.Identity()  # hook point: (B, H, T, Dh), before the gates

    @property
    def out_proj(self) -> nn.Linear:
        """The output projection, under the name headcount's own attention uses (hard_concrete.fold_gates)."""
        return self.proj

    def gates(self) -> Tensor:
        """(H,): the fixed 0/1 mask, times the Hard Concrete gates if any."""
        if self.hard_concrete is None:
            return self.head_mask
        return self.head_mask * self.hard_concrete()

    def forward(self, x: Tensor) -> Tensor:  # x (B, T, H * Dh); time-major: (T, B, H * Dh)
        if self.time_major:
            T, B, _ = x.shape
            ctx = x.view(T, B, self.n_heads, self.head_dim).permute(1, 2, 0, 3)
        else:
            B, T, _ = x.shape
            ctx = x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        ctx = self.head_context(ctx)  # (B, H, T, Dh)
        ctx = ctx * self.gates().to(ctx.dtype).view(1, -1, 1, 1)
        if self.time_major:
            return self.proj(ctx.permute(2, 0, 1, 3).reshape(T, B, self.n_heads * self.head_dim))
        return self.proj(ctx.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def _checked(self, heads: list[int]) -> list[int]:
        """keep_heads' argument, sorted, after checking that it names distinct current heads."""
        heads = sorted(int(h) for h in heads)
        if any(h < 0 or h >= self.n_heads for h in heads) or len(set(heads)) != len(heads):
            raise ValueError(f"keep_heads: {heads} are not distinct heads of 0..{self.n_heads - 1}")
        return heads

    def _drop_heads(self, heads: list[int]) -> Tensor:
        """Keep only `heads` (sorted, current indices) here: W^O's columns, the mask, the Hard
        Concrete gates, the original indices. -> the kept (H' * Dh,) feature indices, for the
        caller's Q, K, V rows."""
        Dh = self.head_dim
        idx = torch.tensor([h * Dh + d for h in heads for d in range(Dh)], dtype=torch.long,
                           device=self.proj.weight.device)
        self.proj = linear_columns(self.proj, idx)
        keep = torch.tensor(heads, dtype=torch.long, device=self.head_mask.device)
        self.head_mask = self.head_mask[keep].clone()
        if self.hard_concrete is not None:
            self.hard_concrete.log_alpha = nn.Parameter(self.hard_concrete.log_alpha.detach()[keep].clone(),
                                                        requires_grad=self.hard_concrete.log_alpha.requires_grad)
        self.n_heads = len(heads)
        self.kept = [self.kept[h] for h in heads]
        return idx

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, head_dim={self.head_dim}"


def linear_rows(layer: nn.Linear, idx: Tensor) -> nn.Linear:
    """A copy of `layer` with only the output features `idx`."""
    new = nn.Linear(layer.in_features, len(idx), bias=layer.bias is not None,
                    device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(layer.weight[idx])
        if layer.bias is not None:
            new.bias.copy_(layer.bias[idx])
    return new


def linear_columns(layer: nn.Linear, idx: Tensor) -> nn.Linear:
    """A copy of `layer` with only the input features `idx`."""
    new = nn.Linear(len(idx), layer.out_features, bias=layer.bias is not None,
                    device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(layer.weight[:, idx])
        if layer.bias is not None:
            new.bias.copy_(layer.bias)
    return new


class HeadMasks:
    """set_head_mask, head_mask and head_counts of seq2seq's contract, for a model whose
    `attention_modules()` are GatedProjections (both transformers adapters mix this in)."""

    def set_head_mask(self, masks: dict[str, Tensor]) -> None:
        """Fix the 0/1 gates, masks[type] of shape (layers, H); types left out stay as they are. After
        physical pruning H is the widest layer's head count and each layer reads its first heads."""
        modules = self.attention_modules()
        for kind, mask in masks.items():
            if kind not in modules:
                raise ValueError(f"head mask for {kind}: this model has {sorted(modules)} only")
            mask = torch.as_tensor(mask, dtype=torch.float32)
            width = max(m.n_heads for m in modules[kind])
            if mask.dim() != 2 or mask.shape != (len(modules[kind]), width) or any(
                    row[m.n_heads:].any() for m, row in zip(modules[kind], mask)):
                raise ValueError(f"head mask for {kind} has shape {tuple(mask.shape)}, expected "
                                 f"({len(modules[kind])}, {width}) (after physical pruning: zeros beyond a "
                                 f"layer's remaining heads, as head_mask() gives)")
            for module, row in zip(modules[kind], mask):
                module.head_mask.copy_(row[: module.n_heads])

    def head_mask(self) -> dict[str, Tensor]:
        """{type: (layers, H)}; after physical pruning, rows are padded with zeros to the widest layer."""
        out = {}
        for kind, modules in self.attention_modules().items():
            width = max(m.n_heads for m in modules)
            rows = [torch.cat([m.head_mask, m.head_mask.new_zeros(width - m.n_heads)]) for m in modules]
            out[kind] = torch.stack(rows)
        return out

    def head_counts(self) -> dict[str, list[int]]:
        return heads_per_layer(self)


def load_weights_with_heads(model: nn.Module, kept: dict[str, list[list[int]]], weights: dict) -> nn.Module:
    """Load a checkpoint's weights into a freshly built adapter: first remove the heads that were
    physically pruned (`kept`: {type: [original indices per layer]}) and give gates to the modules
    the weights have Hard Concrete gates for, then load them, in the weights' dtype. -> the model,
    in eval mode."""
    from headcount.models.gates import HardConcreteGates  # gates imports the model contract, not this

    names = {id(module): name for name, module in model.named_modules()}
    for kind, modules in model.attention_modules().items():
        for module, heads in zip(modules, kept[kind]):
            if len(heads) != module.n_heads:
                module.keep_heads(heads)
            if f"{names[id(module)]}.hard_concrete.log_alpha" in weights:
                module.hard_concrete = HardConcreteGates(module.n_heads)
    model.to(next(iter(v for v in weights.values() if v.is_floating_point())).dtype)
    model.load_state_dict(weights)
    return model.eval()
