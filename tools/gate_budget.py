"""The powered design's gate-training budget (docs/method.md, "The powered design: rules fixed
before it ran", gates that decide): read seed 1's pruning runs' gate trajectories, print each run's share of undecided
gates (P(open) strictly inside 0.1-0.9) over its steps, and the fewest steps, in 250s, by which every
run is at or below 5% and stays there, at most 2,000: runs still undecided at the cap leave the
budget there, and are named (their verdicts say they have not decided).

    .venv/bin/python tools/gate_budget.py results/multi30k_en_de/prune/*/lambda_*/trajectory.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pandas as pd  # noqa: E402

from headcount.report.preregistered import GATE_BUDGET_CAP, MAX_UNDECIDED_SHARE  # noqa: E402
from headcount.report.pruning_report import gate_budget, undecided_at_the_end, undecided_share_by_step  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trajectories", nargs="+", help="runs' trajectory.csv files (controls have none to decide)")
    args = parser.parse_args()
    tables, undecided = [], []
    for path in args.trajectories:
        table = pd.read_csv(path)
        if table.empty:
            continue
        tables.append(table)
        share = undecided_share_by_step(table)
        print(f"{path}: undecided share " + ", ".join(f"{step}: {s:.2f}" for step, s in share.items()))
        if undecided_at_the_end(share):
            undecided.append(path)
    budget = gate_budget(tables)
    if budget is None:
        print(f"some run still has more than {MAX_UNDECIDED_SHARE:.0%} of its gates undecided at its last step, short "
              f"of the cap: raise prune.training.max_steps (at most {GATE_BUDGET_CAP:,}) and rerun those runs")
        return 1
    if not undecided:
        print(f"every run at or below {MAX_UNDECIDED_SHARE:.0%} undecided by step {budget}")
    else:
        print(f"at the cap of {GATE_BUDGET_CAP:,} steps these runs are still above {MAX_UNDECIDED_SHARE:.0%} undecided "
              f"(their verdicts say they have not decided): {', '.join(undecided)}")
    print(f"set prune.training.max_steps: {budget}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
