"""Checkpoint averaging: a model's weights as the mean of its last few snapshots.

Training at Noam's rate leaves the weights bouncing around the minimum they have found; the mean
of snapshots taken some hundreds of steps apart lies nearer its centre (Vaswani et al. 2017 average
their last checkpoints; docs/method.md measures what it does to the default's baseline). Written
here rather than taken from torch.optim.swa_utils, whose AveragedModel averages in memory while
training runs: which snapshots to average is known only once the run has selected its weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from headcount.io import HeadcountError


def averaging_window(available: Sequence[int], selected: int, count: int) -> list[int]:
    """The `count` snapshot steps ending at `selected`: the selected weights and the snapshots just
    before them. The selected step must have a snapshot, and there must be `count` of them."""
    window = [step for step in sorted(available) if step <= selected][-count:]
    if selected not in available or len(window) < count:
        raise HeadcountError(
            f"training.average_snapshots is {count}, but the snapshots up to the selected step {selected} are "
            f"{window or 'none'}: set training.snapshot_interval to a divisor of training.eval_interval (every "
            f"selectable step then has a snapshot) and keep at least {count} evaluations, or average_snapshots: 1. "
            f"A run that finished without those snapshots must train again: delete its train/checkpoint.pt")
    return window


def average_state_dicts(states: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The elementwise mean of state dicts with the same keys; tensors that are not floating point
    (counters, masks) must agree, and are kept as they are."""
    if not states:
        raise ValueError("no state dicts to average")
    keys = list(states[0])
    out = {}
    for key in keys:
        tensors = [state[key] for state in states]
        if tensors[0].is_floating_point():
            out[key] = torch.stack([t.double() for t in tensors]).mean(0).to(tensors[0].dtype)
        else:
            if any(not torch.equal(t, tensors[0]) for t in tensors[1:]):
                raise ValueError(f"{key}: a non-float tensor differs between the snapshots; they cannot be averaged")
            out[key] = tensors[0]
    return out
