"""Pruning to a head count you name: a Lagrangian controller over the Hard Concrete gates (Wang,
Wohlwend and Lei 2020, as CoFi and Sheared-LLaMA use it).

With s the expected number of open gates (the sum of P(open) over the gated heads) and t the
target, the penalty added to the loss is

    lambda_1 (s - t) + lambda_2 (s - t)^2,

minimised over the model and its gates (gradient descent) and maximised over the multipliers
(gradient ascent: lambda_1 += lr (s - t), lambda_2 += lr (s - t)^2 each step). Too many gates open
(s > t) raises lambda_1 and so the pressure on every gate; too few lowers it, down to pressure
that opens gates. lambda_2 only grows, damping the oscillation of lambda_1. The target starts at
the expected count before the first step (not the full count: the authors' initialisation opens
68% of the gates in expectation, and a target above that would first push every gate open) and falls
linearly to t over the first `warmup` share of the gated steps, so the gates close gradually and
the remaining steps let them decide.

The expected count says nothing of how decided the gates are: a gate the loss barely tells apart
from its neighbours can hover at P(open) 0.5 while the sum stays on target. With `settle` > 0 the
last `settle` share of the gated steps adds a pull toward the count's deterministic mask (the
`target` gates of highest log alpha open, the rest closed), w * sum_i |mask_i - P_i(open)|, its
weight w rising linearly from 0 to SETTLE_WEIGHT (`settling_weight`). The mask is taken anew each
step, so the loss can still reorder the gates while the pull grows, and the count is the mask's.
This is headcount's addition: CoFi and Sheared-LLaMA take such a mask after training, so their
gates need not decide while they train; a pull that is blind to the count (w sum P (1 - P))
overshoots it once it outweighs the multipliers.

The controller is a module whose multipliers and step count are buffers: attached to the model
while it trains, they are in the training loop's checkpoints, and a resumed run continues them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# The multipliers' learning rate and the target's ramp (a share of the gated steps): the defaults
# of prune.controller (config/README.md).
DEFAULT_CONTROLLER = {"lr": 0.01, "warmup": 0.3}
# prune.controller.settle: the share of the gated steps at the end with the pull toward the count's
# mask (optional; absent or 0, none). SETTLE_WEIGHT: the pull's weight at the last step, in the loss's
# units per gate; its gradient in a log alpha, w P (1 - P), is then at most w / 4 a gate. On the small
# GPT-2 of the tests, 0.1 decided none of its hovering gates in 60 steps at 0.1 a step, 1 all but 2 of
# 8, 10 and 100 all of them, on the count.
SETTLE_WEIGHT = 10.0


def ascent_step(multipliers: Tensor, gap: float, lr: float) -> Tensor:
    """One gradient-ascent step of (lambda_1, lambda_2) on lambda_1 gap + lambda_2 gap^2, whose
    gradient in them is (gap, gap^2)."""
    return multipliers + lr * torch.tensor([gap, gap * gap], dtype=multipliers.dtype, device=multipliers.device)


def ramped_target(step: int, start: float, target: int, warmup_steps: int) -> float:
    """The target at a 1-based step: `start` falling linearly to `target` by `warmup_steps`."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return float(target)
    return start - (start - target) * step / warmup_steps


def settling_weight(step: int, steps: int, settle_steps: int, top: float = SETTLE_WEIGHT) -> float:
    """The pull's weight at a 1-based step: 0 before the last `settle_steps` of `steps`, then rising
    linearly to `top` at the last step."""
    first = steps - settle_steps  # the last step without the pull
    if settle_steps <= 0 or step <= first:
        return 0.0
    return top * min(step - first, settle_steps) / settle_steps


class LagrangianController(nn.Module):
    """The penalty toward `target` open gates of `gates` (HardConcreteGates), one ascent step of
    its multipliers per call (one call per training step)."""

    def __init__(self, gates: list, target: int, steps: int, lr: float = DEFAULT_CONTROLLER["lr"],
                 warmup: float = DEFAULT_CONTROLLER["warmup"], settle: float = 0.0):
        super().__init__()
        self.gates = list(gates)  # a plain list: the gates belong to the attention modules
        self.total = sum(g.log_alpha.numel() for g in self.gates)
        if not 0 <= target <= self.total:
            raise ValueError(f"target of {target} open heads, of {self.total} gated heads")
        self.target, self.lr = int(target), float(lr)
        self.warmup_steps = int(round(warmup * steps))
        self.steps, self.settle_steps = int(steps), int(round(settle * steps))
        self.register_buffer("multipliers", torch.zeros(2))  # lambda_1, lambda_2
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        # where the ramp starts: the expected open count before the first step (the full count for
        # gates that start open; 0.68 of it in expectation for the authors' U(-0.61, 0.61) initialisation)
        self.register_buffer("start", self.expected_open().detach().clone())

    def expected_open(self) -> Tensor:
        """s: the expected number of open gates, differentiable in the log alphas."""
        return torch.stack([g.p_open().sum() for g in self.gates]).sum()

    def distance_to_mask(self) -> Tensor:
        """sum over the gates of |mask - P(open)|, the mask opening the `target` gates of highest log
        alpha (the count's deterministic mask): what the settling steps pull toward."""
        p = torch.cat([g.p_open().reshape(-1) for g in self.gates])
        log_alpha = torch.cat([g.log_alpha.detach().reshape(-1) for g in self.gates])
        mask = torch.zeros_like(p)
        mask[torch.topk(log_alpha, self.target).indices] = 1.0
        return (mask * (1 - p) + (1 - mask) * p).sum()

    def target_now(self) -> float:
        return ramped_target(int(self.step), float(self.start), self.target, self.warmup_steps)

    def forward(self, model=None) -> Tensor:
        """The penalty at this step (the training loop's `extra_loss`); then the multipliers' ascent."""
        self.step += 1
        s = self.expected_open()
        gap = s - self.target_now()
        lambda_1, lambda_2 = (float(x) for x in self.multipliers)  # constants to the descent
        penalty = lambda_1 * gap + lambda_2 * gap * gap
        pull = settling_weight(int(self.step), self.steps, self.settle_steps)
        if pull:
            penalty = penalty + pull * self.distance_to_mask()
        with torch.no_grad():
            self.multipliers.copy_(ascent_step(self.multipliers, float(gap), self.lr))
        return penalty

    def state(self) -> dict:
        """What a run's record keeps: the target, the multipliers and the expected count at the end."""
        lambda_1, lambda_2 = (float(x) for x in self.multipliers)
        return {"target_heads": self.target, "gated_heads": self.total, "lr": self.lr,
                "warmup_steps": self.warmup_steps, "settle_steps": self.settle_steps, "steps": int(self.step),
                "lambda_1": lambda_1, "lambda_2": lambda_2,
                "expected_open": round(float(self.expected_open().detach()), 4)}
