"""When a training run has converged, by the two rules of the rerun (docs/method.md, "Rules fixed
before the rerun"): the plateau rule, a pure function of the dev-loss evaluations a run writes to
metrics.jsonl, and the control's check, which reads the lambda = 0 control against the baseline."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path


def plateau_step(evaluations: Sequence[tuple[int, float]], patience: int, min_delta: float) -> int | None:
    """The step of the first evaluation at which the best dev loss of the last `patience` evaluations
    is less than `min_delta` below the best of every evaluation before them; None if none is.
    `evaluations`: (step, dev loss) in step order."""
    losses = [loss for _, loss in evaluations]
    for k in range(patience, len(losses)):
        if min(losses[:k - patience + 1]) - min(losses[k - patience + 1:k + 1]) < min_delta:
            return evaluations[k][0]
    return None


def dev_losses(metrics_path: str | Path) -> list[tuple[int, float]]:
    """(step, dev loss) of every evaluation a training run logged, in step order (a resumed run's
    metrics are truncated to its checkpoint, so each step appears once)."""
    rows = [json.loads(line) for line in Path(metrics_path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted((int(r["step"]), float(r["dev_loss"])) for r in rows if "dev_loss" in r)


def control_gains(bleu_low: float, nll_high: float) -> bool:
    """The control's check: a lambda = 0 control whose paired interval against its baseline excludes 0
    on the side of a gain, in BLEU (the interval's low end above 0) or in reference NLL (its high end
    below 0), means the baseline had not converged in the sense that matters. NaN: not measured."""
    return (not math.isnan(bleu_low) and bleu_low > 0) or (not math.isnan(nll_high) and nll_high < 0)
