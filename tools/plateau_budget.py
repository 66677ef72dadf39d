"""The baseline budget the plateau rule gives (docs/method.md, "The powered design: rules fixed before it ran"):
read a baseline's metrics.jsonl (seed 1 trained with a large training.max_steps), print every dev
loss evaluation and the step at which the rule fires, rounded up to the evaluation interval.

    .venv/bin/python tools/plateau_budget.py results/multi30k_en_de/baseline/metrics.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from headcount.report.preregistered import PLATEAU_MIN_DELTA, PLATEAU_PATIENCE  # noqa: E402
from headcount.training.convergence import dev_losses, plateau_step  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", help="a training run's metrics.jsonl")
    args = parser.parse_args()
    evaluations = dev_losses(args.metrics)
    if not evaluations:
        print(f"{args.metrics} holds no dev-loss evaluation: train with training.eval_interval set", file=sys.stderr)
        return 2
    for step, loss in evaluations:
        print(f"step {step:>6}  dev loss {loss:.4f}")
    step = plateau_step(evaluations, PLATEAU_PATIENCE, PLATEAU_MIN_DELTA)
    if step is None:
        print(f"no plateau yet (patience {PLATEAU_PATIENCE} evaluations, min delta {PLATEAU_MIN_DELTA} nats): "
              f"train on (raise training.max_steps; the run resumes from its checkpoint)")
        return 1
    print(f"plateau at step {step}: set training.max_steps: {step} for every seed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
