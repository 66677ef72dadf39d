"""Per-layer recomputation (activation checkpointing) for the analyses that need a backward pass.

Michel importance and LRP differentiate through the whole model, so autograd keeps every layer's
saved activations until the backward pass reaches them, attention maps included: L x (B, H, T, T)
several times over (scores, softmax, the rules' factors). Recomputed, each layer keeps only its
inputs during the forward pass and runs again, alone, when the backward pass reaches it: memory
holds one layer's activations at a time, for about one more forward pass of time. For SmolLM2's
shape (30 layers, 9 heads) at 2,048 tokens on CPU: Michel 10.1 GB kept, 3.3 GB recomputed; LRP over
all 30 layers 9.3 GB recomputed, ~47-65 GB kept (estimated; docs/long_inputs.md).

The mechanism is torch's own, `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`: the
non-reentrant variant supports what the analyses do, `torch.autograd.grad` with respect to tensors
inside a layer (the head contexts), several backward passes over one graph (`retain_graph`, LRP's
chunks) and seed-batched backward passes (`is_grads_batched`, LRP's vmap). transformers' own
gradient checkpointing (`gradient_checkpointing_enable`) is not used: it checkpoints a layer only
in training mode (`GradientCheckpointingLayer`: `self.gradient_checkpointing and self.training`,
transformers 5.24), and the analyses run in evaluation mode, dropout off. What is written here by
hand is only which modules are layers and the switch around them.

Recomputation must give the first pass's values, so it runs only in evaluation mode: a layer with
a module in training mode (dropout, Hard Concrete gates sampling) is refused (`RecomputeInTraining`).

When it is on (`wants_recompute`): asked explicitly, or by default (`recompute=None`) for a pass
over rows longer than RECOMPUTE_ABOVE positions (its source or its target, padded). Sentences
(every published analysis) stay below it and run as before; documents are recomputed. The values
are the same either way (the same operations on the same inputs, tests/test_recompute.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from headcount.io import HeadcountError

# Rows (source or target, padded) longer than this are recomputed by default. At 512 tokens one
# document of SmolLM2's shape held 2.6 GB for Michel (1.0 GB of it the model) and every layer's
# maps grow with the square of the length (4.4 GB at 1,024, 10.1 GB at 2,048); a recomputed layer
# costs about one more forward pass.
RECOMPUTE_ABOVE = 512


class RecomputeInTraining(HeadcountError, RuntimeError):
    """Recomputation asked of a layer in training mode: dropout would draw other masks."""


def wants_recompute(recompute: bool | None, *lengths: int) -> bool:
    """Whether a pass over rows of these lengths (positions) is recomputed: `recompute` where given,
    else (None, automatic) when the longest is more than RECOMPUTE_ABOVE."""
    if recompute is None:
        return max(lengths, default=0) > RECOMPUTE_ABOVE
    return bool(recompute)


def _check_eval(layer: nn.Module) -> None:
    training = [name or type(layer).__name__ for name, m in layer.named_modules() if m.training]
    if training:
        raise RecomputeInTraining(
            f"recomputing a layer needs evaluation mode (dropout off, gates fixed) so that the second pass "
            f"gives the first one's values; in training mode: {', '.join(training[:3])}; call model.eval()")


def checkpointed(fn: Callable, *args, layer: nn.Module, recompute: bool):
    """fn(*args), recomputed in the backward pass when `recompute` (and gradients are on): what is
    saved for the backward pass is its inputs only. `layer`: the module whose weights fn reads,
    checked to be in evaluation mode."""
    if not recompute or not torch.is_grad_enabled():
        return fn(*args)
    _check_eval(layer)
    return checkpoint(fn, *args, use_reentrant=False)


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The model's layers: each element of an nn.ModuleList that holds one of its attention modules
    (`attention_modules()`), outermost only (T5's blocks, not their sublayer lists). headcount's
    Transformer: its encoder and decoder layers; the transformers adapters: their blocks."""
    slots = {id(slot) for slots in model.attention_modules().values() for slot in slots}
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or any(name.startswith(f + ".") for f, _ in found):
            continue
        for index, child in enumerate(module):
            if any(id(m) in slots for m in child.modules()):
                found.append((f"{name}.{index}", child))
    return [layer for _, layer in found]


@contextmanager
def recomputed_layers(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, every layer of `model` (layers_of) runs under checkpointed(): the model's
    own forward pass, recomputed layer by layer in the backward pass. Forward hooks on modules
    inside a layer run again when it is recomputed; remove them before the backward pass (Michel's
    HeadContexts does). Restores the layers' own forward afterwards."""
    if not enabled:
        yield
        return
    layers = layers_of(model)
    for layer in layers:
        _check_eval(layer)
    # A layer's forward as it is (the class's, bound, transformers' wrapper included; or one set on
    # the instance), put back afterwards.
    own = [layer.__dict__.get("forward") for layer in layers]
    for layer in layers:
        layer.forward = _recomputing(layer.forward, layer)
    try:
        yield
    finally:
        for layer, forward in zip(layers, own):
            if forward is None:
                del layer.forward  # the class's forward again
            else:
                layer.forward = forward


def _recomputing(forward: Callable, layer: nn.Module) -> Callable:
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        _check_eval(layer)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
