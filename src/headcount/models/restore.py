"""A caller's model left as it was: what wrapping a transformers model in a headcount adapter
changes in it (models.loading.adapt_model), undone when the work is over, whether it succeeded or
failed.

Wrapping works in place, so that a large model is not copied: the adapter puts a gated output
projection in each attention's place (head_gates.GatedProjection, its 0/1 `head_mask` buffer, and
Hard Concrete gates while pruning), makes the attention eager, and runs the model in eval mode on
the analysis's device. `restored` records, before anything changes, every module's submodules,
parameters, buffers, training flag and instance-level forward, every parameter's requires_grad,
each config's attention implementation, and the device; on leaving it puts each of them back.
Weights are not copied: what restores them is that the analyses do not train (pruning works on a
copy, headcount.api.prune).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def _configs(model: nn.Module) -> list:
    """Every transformers config the model's modules hold (an encoder-decoder's sub-configs too)."""
    seen, out = set(), []
    for module in model.modules():
        config = getattr(module, "config", None)
        stack = [config]
        while stack:
            c = stack.pop()
            if c is None or id(c) in seen or not hasattr(c, "_attn_implementation"):
                continue
            seen.add(id(c))
            out.append(c)
            stack += [getattr(c, key, None) for key in getattr(c, "sub_configs", {}) or {}]
    return out


@contextmanager
def restored(model: nn.Module) -> Iterator[nn.Module]:
    """While open, change `model` as you like (wrap it, move it, set eval mode); on leaving, its
    structure, flags, attention implementation and device are put back as they were (module
    docstring). Anything but a torch module is passed through (the API names it as no model)."""
    if not isinstance(model, nn.Module):
        yield model
        return
    modules = list(model.modules())
    saved = [(m, dict(m._modules), dict(m._parameters), dict(m._buffers), m.training, m.__dict__.get("forward"))
             for m in modules]
    grads = [(p, p.requires_grad) for p in model.parameters()]
    configs = [(c, c.__dict__.get("_attn_implementation_internal", None), c._attn_implementation)
               for c in _configs(model)]
    first = next(iter(model.parameters()), None)
    device = None if first is None else first.device
    try:
        yield model
    finally:
        for module, children, parameters, buffers, training, forward in saved:
            module._modules.clear()
            module._modules.update(children)
            module._parameters.clear()
            module._parameters.update(parameters)
            module._buffers.clear()
            module._buffers.update(buffers)
            module.training = training
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = forward
        for p, flag in grads:
            p.requires_grad_(flag)
        for config, internal, implementation in configs:
            if "_attn_implementation_internal" in config.__dict__:
                config._attn_implementation_internal = internal
            elif config._attn_implementation != implementation:
                config._attn_implementation = implementation
        if device is not None and first.device != device:
            model.to(device)


def fingerprint(model: nn.Module) -> tuple[list[str], float]:
    """The model's parameter and buffer names and a checksum of their values: what `restored`
    keeps (tests compare them before and after)."""
    state = model.state_dict()
    total = 0.0
    with torch.no_grad():
        for i, value in enumerate(state.values()):
            if value.is_floating_point() or value.is_complex():
                total += float(value.double().abs().sum()) * (1 + 1e-3 * (i % 97))
            else:
                total += float(value.double().sum())
    return list(state), total
