"""Wall time, CPU time and peak memory of each stage of one or more experiments, from Snakemake's
benchmark files and the runs' own training records.

    .venv/bin/python benchmarks/stage_times.py results/multi30k_en_de
    .venv/bin/python benchmarks/stage_times.py results/multi30k_en_de results/multi30k_en_de_seed2 \\
        results/multi30k_en_de_seed3 results/control          # the default DAG's jobs, all of them

Each job with a `benchmark:` directive leaves results/<exp>/benchmarks/<job>.tsv (one row: seconds,
max RSS, CPU time). A job that was interrupted and rerun keeps only its last attempt's row there,
which undercounts a run that was stopped and resumed. Training jobs also record every attempt up to
the checkpoint each resumed from (training.json, and gates.json's gated and healing phases for
pruning: `attempts`, `train_seconds_all`, `train_cpu_seconds_all`, since 2026-11-24), so a training
job's CPU time here is the larger of its benchmark's and its records' (the records leave out only
the start-up of the earlier attempts: loading data and model, a few seconds). Its wall time stays
the benchmark's, the last attempt's.

CPU time is the figure to compare: wall time counts every pause (a job stopped with SIGSTOP while
the machine did other work) and every slice lost to jobs sharing the cores; for a single-thread job
its CPU time is close to the wall time it takes on an idle core.
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
# a training job's benchmark file (relative to benchmarks/, without .tsv) -> its records (relative to
# the experiment's folder) and the phases that hold training summaries
RECORDS = (
    (re.compile(r"^train_baseline$"), "baseline/training.json"),
    (re.compile(r"^(prune/\w+/lambda_[\d.]+)/prune_heads$"), r"\1/gates.json"),
    (re.compile(r"^(prune/\w+/lambda_[\d.]+)/train_from_scratch$"), r"\1/scratch/training.json"),
)


def stage_of(path: Path, root: Path) -> tuple[str, str]:
    name = path.stem.split("_test")[0].split("_dev")[0]
    name = re.sub(r"^translate_.*", "translate", name)
    name = re.sub(r"^(\w+)_curve$", lambda m: STAGES.get(m.group(0), f"{m.group(1)} pruning curve"), name)
    return STAGES.get(name, name), str(path.relative_to(root).with_suffix(""))


def summaries(record: dict) -> list[dict]:
    """The training summaries of a record: a training.json is one; a gates.json has a gated phase
    (`summary`) and a healing phase (`heal_summary`)."""
    phases = [record, record.get("summary"), record.get("heal_summary")]
    return [s for s in phases if isinstance(s, dict) and "train_seconds" in s]


def recorded_cpu_seconds(exp_dir: Path, job: str) -> float | None:
    """A training job's CPU seconds over every attempt, from its records; None where the job is
    not training or its records predate the all-attempts fields."""
    for pattern, record in RECORDS:
        if pattern.match(job):
            path = exp_dir / pattern.sub(record, job)
            if not path.exists():
                return None
            phases = summaries(json.loads(path.read_text()))
            if not phases or any("train_cpu_seconds_all" not in s for s in phases):
                return None
            return sum(s["train_cpu_seconds_all"] for s in phases)
    return None


def job_times(exp_dir: Path) -> pd.DataFrame:
    """One row per benchmarked job of an experiment: stage, job, wall and CPU seconds, peak RSS."""
    root = exp_dir / "benchmarks"
    rows = []
    for path in sorted(root.rglob("*.tsv")):
        stage, job = stage_of(path, root)
        bench = pd.read_csv(path, sep="\t").iloc[-1]
        cpu = float(bench["cpu_time"])
        recorded = recorded_cpu_seconds(exp_dir, job)
        rows.append({"experiment": exp_dir.name, "stage": stage, "job": job, "seconds": float(bench["s"]),
                     "max_rss_mb": float(bench["max_rss"]), "benchmark_cpu_seconds": cpu,
                     "cpu_seconds": max(cpu, recorded) if recorded is not None else cpu})
    return pd.DataFrame(rows)


def stage_table(jobs: pd.DataFrame) -> str:
    """The markdown table of stages, the longest first, and the total."""
    stages = jobs.groupby("stage").agg(jobs=("job", "count"), minutes=("seconds", lambda s: s.sum() / 60),
                                       cpu_minutes=("cpu_seconds", lambda s: s.sum() / 60),
                                       max_rss_mb=("max_rss_mb", "max")).sort_values("cpu_minutes", ascending=False)
    lines = ["| stage | jobs | wall time (min) | CPU time (min) | peak RSS (MB) |", "|---|---|---|---|---|"]
    lines += [f"| {stage} | {int(r.jobs)} | {r.minutes:.1f} | {r.cpu_minutes:.1f} | {r.max_rss_mb:.0f} |"
              for stage, r in stages.iterrows()]
    lines.append(f"| **all benchmarked jobs** | {len(jobs)} | {jobs['seconds'].sum() / 60:.1f} | "
                 f"{jobs['cpu_seconds'].sum() / 60:.1f} | |")
    return "\n".join(lines)


def experiment_table(jobs: pd.DataFrame) -> str:
    """Each experiment's CPU time by stage with the CPU time a job, the figure to set against another
    run with other jobs in it (a DAG's total moves with its job list; a job's cost with the defaults)."""
    lines = ["| experiment | stage | jobs | CPU time (min) | CPU time a job (min) |", "|---|---|---|---|---|"]
    for name, group in jobs.groupby("experiment", sort=False):
        stages = group.groupby("stage")["cpu_seconds"].agg(["count", "sum"]).sort_values("sum", ascending=False)
        lines += [f"| {name} | {stage} | {int(r['count'])} | {r['sum'] / 60:.1f} | {r['sum'] / 60 / r['count']:.1f} |"
                  for stage, r in stages.iterrows()]
        lines.append(f"| {name} | **all** | {len(group)} | {group['cpu_seconds'].sum() / 60:.1f} | |")
    return "\n".join(lines)


def training_time(summary: dict) -> str:
    """One training run's steps and time, every attempt counted where the record has them."""
    if "train_seconds_all" in summary:
        return (f"{summary['steps']} steps, {summary['attempts']} attempt(s), {summary['train_seconds_all'] / 60:.1f} "
                f"min wall, {summary['train_cpu_seconds_all'] / 60:.1f} min CPU")
    return f"{summary['steps']} steps, {summary['train_seconds'] / 60:.1f} min wall in its last attempt"


def main(exp_dirs: list[str]) -> None:
    folders = [Path(d) for d in exp_dirs]
    jobs = pd.concat([job_times(d) for d in folders], ignore_index=True) if folders else pd.DataFrame()
    if jobs.empty:
        sys.exit(f"{', '.join(exp_dirs)}: no benchmark files; run the workflow first")
    print(stage_table(jobs))
    added = (jobs["cpu_seconds"] - jobs["benchmark_cpu_seconds"]).sum() / 60
    print(f"\nCPU time of earlier attempts, from the training records: {added:.1f} min of the total.")
    print("\n" + experiment_table(jobs))
    print()
    for folder in folders:
        for path in sorted([*folder.rglob("training.json"), *folder.rglob("gates.json")]):
            record = json.loads(path.read_text())
            phases = (("", record), (" (gated)", record.get("summary")), (" (healing)", record.get("heal_summary")))
            for phase, summary in phases:
                if isinstance(summary, dict) and "train_seconds" in summary:
                    print(f"{path}{phase}: {training_time(summary)}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["results/multi30k_en_de"])
