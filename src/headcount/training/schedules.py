"""Learning-rate schedules, pure functions of the step: the baseline's Noam schedule and the
fine-tuning recipes of the pruning runs (config/README.md: prune.lr_schedule).

The training loop takes any of them as `lr_at` (a function of the 1-based step).
"""

from __future__ import annotations

from collections.abc import Callable

from headcount.io import HeadcountError

LR_SCHEDULES = ("noam", "constant", "continue")


def noam_lr(step: int, d_model: int, warmup_steps: int, scale: float) -> float:
    """lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al. 2017)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def baseline_last_lr(baseline_training: dict, d_model: int) -> float:
    """The Noam rate the baseline ended at (its step max_steps)."""
    return noam_lr(baseline_training["max_steps"], d_model, baseline_training["warmup_steps"],
                   baseline_training["lr_scale"])


def fine_tuning_lr(schedule: str, baseline_training: dict, fine_tuning: dict, d_model: int,
                   weight_scale: float = 1.0) -> Callable[[int], float]:
    """The weights' learning rate at each 1-based fine-tuning step, for every schedule, times
    `weight_scale` (prune.weight_lr_scale; the gates keep the schedule's own rate times theirs).

    noam: Noam restarted on the fine-tuning run's own `warmup_steps` and `lr_scale` (`fine_tuning`:
    prune.training over the baseline's training settings; the authors' restart); constant: the
    baseline's last rate throughout; continue: the baseline's Noam schedule carried on from its
    last step (decaying from that rate as step^-0.5).
    """
    if schedule == "noam":
        warmup, scale = fine_tuning["warmup_steps"], fine_tuning["lr_scale"]
        return lambda step: weight_scale * noam_lr(step, d_model, warmup, scale)
    last_step = baseline_training["max_steps"]
    if schedule == "constant":
        rate = weight_scale * baseline_last_lr(baseline_training, d_model)
        return lambda step: rate
    if schedule == "continue":
        warmup, scale = baseline_training["warmup_steps"], baseline_training["lr_scale"]
        return lambda step: weight_scale * noam_lr(last_step + step, d_model, warmup, scale)
    raise HeadcountError(f"config key 'prune.lr_schedule': unknown schedule {schedule!r}; use one of "
                         f"{', '.join(LR_SCHEDULES)}")


def healing_lr(start: float, steps: int) -> Callable[[int], float]:
    """A linear decay over `steps` steps from `start` (step 1) to start / steps (the last step)."""
    return lambda step: start * (steps - step + 1) / steps


SCRATCH_SCHEDULES = ("noam", "pruned")  # prune.scratch_schedule


def pruned_model_lr(baseline_training: dict, fine_tuning: dict, lr_schedule: str, fine_tuning_steps: int,
                    heal_steps: int, d_model: int, weight_scale: float = 1.0) -> Callable[[int], float]:
    """The learning rate a pruned model saw at each 1-based step of its whole life, for a from-scratch
    twin trained on the same schedule: the baseline's Noam schedule for its `max_steps`, then the
    fine-tuning's rate (fine_tuning_lr) for `fine_tuning_steps`, then the healing decay from the
    fine-tuning's last rate over `heal_steps`. A twin on plain Noam anneals as step^-0.5 only, while
    the pruned model ends on a constant rate decaying to 0, and that difference alone moves BLEU.
    The twin keeps one Adam throughout; the pruned model's fine-tuning starts a fresh one (unless
    prune.resume_optimizer), which this schedule does not copy."""
    baseline_steps = int(baseline_training["max_steps"])
    tuned = fine_tuning_lr(lr_schedule, baseline_training, fine_tuning, d_model, weight_scale)
    healed = healing_lr(tuned(fine_tuning_steps), heal_steps) if heal_steps else None

    def lr_at(step: int) -> float:
        if step <= baseline_steps:
            return noam_lr(step, d_model, baseline_training["warmup_steps"], baseline_training["lr_scale"])
        if step <= baseline_steps + fine_tuning_steps or healed is None:
            return tuned(step - baseline_steps)
        return healed(step - baseline_steps - fine_tuning_steps)
    return lr_at
