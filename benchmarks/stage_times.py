"""Wall time and peak memory of each stage of an experiment, from Snakemake's benchmark files.

    .venv/bin/python benchmarks/stage_times.py results/multi30k_en_de

Each job with a `benchmark:` directive leaves results/<exp>/benchmarks/<job>.tsv (one row: seconds,
max RSS, CPU time). A job that was interrupted and rerun keeps only its last attempt's time, so
training times also come from the run's own records (training.json, and gates.json for pruning),
printed after the table: since 2026-11-24 they add up every attempt up to the checkpoint each
resumed from (`attempts`, `train_seconds_all`, `train_cpu_seconds_all`); older records have only
the last attempt's `train_seconds`.

CPU time is printed beside wall time because wall time counts every pause (a job stopped with
SIGSTOP while the machine did other work) and every slice lost to jobs sharing the cores; for a
single-thread job its CPU time is close to the wall time it takes on an idle core.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd

STAGES = {  # benchmark file name (without split/lambda) -> stage
    "train_baseline": "baseline training", "translate": "translation (beam search)",
    "score_heads": "head importance (confidence, LRP, Michel, ablation)", "head_roles": "head roles",
    "prune_heads": "pruning fine-tuning (per lambda)", "train_from_scratch": "from-scratch training",
    "michel_curve": "Michel pruning curve",  # rule ranked_curve's file for michel (<method>_curve)
}


def stage_of(path: Path, root: Path) -> tuple[str, str]:
    name = path.stem.split("_test")[0].split("_dev")[0]
    name = re.sub(r"^translate_.*", "translate", name)
    name = re.sub(r"^(\w+)_curve$", lambda m: STAGES.get(m.group(0), f"{m.group(1)} pruning curve"), name)
    return STAGES.get(name, name), str(path.relative_to(root).with_suffix(""))


def main(exp_dir: str) -> None:
    root = Path(exp_dir) / "benchmarks"
    rows = []
    for path in sorted(root.rglob("*.tsv")):
        stage, job = stage_of(path, root)
        bench = pd.read_csv(path, sep="\t").iloc[-1]
        rows.append({"stage": stage, "job": job, "seconds": float(bench["s"]), "max_rss_mb": float(bench["max_rss"]),
                     "cpu_seconds": float(bench["cpu_time"])})
    if not rows:
        sys.exit(f"{root}: no benchmark files; run the workflow first")
    jobs = pd.DataFrame(rows)
    stages = jobs.groupby("stage").agg(jobs=("job", "count"), minutes=("seconds", lambda s: s.sum() / 60),
                                       cpu_minutes=("cpu_seconds", lambda s: s.sum() / 60),
                                       max_rss_mb=("max_rss_mb", "max")).sort_values("minutes", ascending=False)
    print("| stage | jobs | wall time (min) | CPU time (min) | peak RSS (MB) |\n|---|---|---|---|---|")
    for stage, r in stages.iterrows():
        print(f"| {stage} | {int(r.jobs)} | {r.minutes:.1f} | {r.cpu_minutes:.1f} | {r.max_rss_mb:.0f} |")
    print(f"| **all benchmarked jobs** | {len(jobs)} | {jobs['seconds'].sum() / 60:.1f} | "
          f"{jobs['cpu_seconds'].sum() / 60:.1f} | |")
    print()
    for path in sorted([*Path(exp_dir).rglob("training.json"), *Path(exp_dir).rglob("gates.json")]):
        record = json.loads(path.read_text())
        phases = (("", record), (" (gated)", record.get("summary")), (" (healing)", record.get("heal_summary")))
        for phase, summary in phases:
            if isinstance(summary, dict) and "train_seconds" in summary:
                print(f"{path}{phase}: {training_time(summary)}")


def training_time(summary: dict) -> str:
    """One training run's steps and time, every attempt counted where the record has them."""
    if "train_seconds_all" in summary:
        return (f"{summary['steps']} steps, {summary['attempts']} attempt(s), {summary['train_seconds_all'] / 60:.1f} "
                f"min wall, {summary['train_cpu_seconds_all'] / 60:.1f} min CPU")
    return f"{summary['steps']} steps, {summary['train_seconds'] / 60:.1f} min wall in its last attempt"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/multi30k_en_de")
