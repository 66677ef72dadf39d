"""The powered design's training jobs on one GPU (issue 61, item 6): how many of the default
experiment's trainings share one GPU, and what the whole powered design costs there.

    python benchmarks/gpu_powered.py sweep --settings S.json --plan 1:auto 1:fp32 4:auto 4:fp32 8:best
    python benchmarks/gpu_powered.py one --settings S.json --seed 2 --steps 600 --precision fp32 --out DIR

Each plan item J:precision starts J trainings at once, each its own process (seeds 1..J, as the
seeds' baselines and the twins run), every one the default experiment's baseline job as
config/config.yaml sets it (real Multi30k data and subwords, headcount.pipeline.training_runs, its
evaluations with dev BLEU included) but `--steps` long with an evaluation every `--eval-every` steps.
"best" takes the precision with more steps/s in all at the most jobs measured before it. From each run's own
metrics.jsonl (elapsed_s every --log-every steps): its training steps/s (intervals without an evaluation)
and the seconds one evaluation adds (an interval with one, less the median interval); the item's
wall time includes start-up (imports, encoding the data, the first CUDA kernels).

The settings come from `time_to_quality.py settings` (the GPU image lacks the workflow's packages);
the data from results/multi30k_en_de/{data,subwords}, carried. Prints one JSON line per item and a
Markdown table; --out keeps both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))
EXP = REPO / "results" / "multi30k_en_de"


def one(args) -> None:
    """One training job: the baseline's settings, args.steps long, on the GPU."""
    from headcount.pipeline.training_runs import train_translation_model

    exp = json.loads(Path(args.settings).read_text())
    training = {**exp["training"], "seed": args.seed, "max_steps": args.steps, "eval_interval": args.eval_every,
                "snapshot_interval": args.steps, "log_interval": args.log_every, "threads": 1, "device": args.device,
                "precision": args.precision}
    out = Path(args.out)
    data, sub = EXP / "data", EXP / "subwords"
    train_translation_model(
        str(data / "train.src.txt"), str(data / "train.tgt.txt"), str(data / "dev.src.txt"), str(data / "dev.tgt.txt"),
        str(sub / "src.model"), str(sub / "tgt.model"), exp["model"], training, exp["subwords"]["lowercase"],
        str(out / "work"), str(out / "model.pt"), str(out / "summary.json"), log=lambda m: print(m, flush=True))


def run_rates(metrics: Path, eval_every: int) -> tuple[float, float]:
    """(training steps/s, seconds one evaluation adds) from a run's metrics.jsonl."""
    logs = [r for r in map(json.loads, metrics.read_text().splitlines()) if "elapsed_s" in r]
    plain, with_eval = [], []
    for a, b in zip(logs, logs[1:]):
        # the loop logs a step before it evaluates there: an evaluation at step a falls in (a, b]
        evaluated = a["step"] % eval_every == 0
        (with_eval if evaluated else plain).append((b["elapsed_s"] - a["elapsed_s"], b["step"] - a["step"]))
    rate = sum(n for _, n in plain) / sum(t for t, _ in plain)
    typical = statistics.median(t for t, _ in plain)
    eval_s = statistics.mean(t - typical for t, _ in with_eval) if with_eval else float("nan")
    return rate, eval_s


def sweep(args) -> None:
    rows, done = [], {}
    start = time.monotonic()
    for item in args.plan:
        jobs, precision = item.split(":")
        jobs = int(jobs)
        if precision == "best":
            most = max((j for j, _ in done), default=None)  # the precision that did better at the most jobs so far
            mine = {p: r["steps_per_s_all"] for (j, p), r in done.items() if j == most}
            precision = max(mine, key=mine.get) if mine else "auto"
        if time.monotonic() - start > args.deadline:
            print(f"skipped {item}: deadline", flush=True)
            continue
        base = Path(args.runs) / f"J{jobs}_{precision}"
        t0 = time.monotonic()
        children = []
        for seed in range(1, jobs + 1):
            out = base / f"seed_{seed}"
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "job.log", "w") as sink:
                children.append(subprocess.Popen(
                    [sys.executable, "-u", __file__, "one", "--settings", args.settings, "--seed", str(seed),
                     "--steps", str(args.steps), "--eval-every", str(args.eval_every),
                     "--log-every", str(args.log_every), "--device", args.device, "--precision", precision,
                     "--out", str(out)], stdout=sink, stderr=subprocess.STDOUT))
        codes = [c.wait() for c in children]
        wall = time.monotonic() - t0
        rates = []
        for seed in range(1, jobs + 1):
            try:
                rates.append(run_rates(base / f"seed_{seed}" / "work" / "metrics.jsonl", args.eval_every))
            except (OSError, ValueError, ZeroDivisionError) as err:
                print(f"{item} seed {seed}: no rates ({err}); rc {codes[seed - 1]}", flush=True)
        if not rates:
            continue
        log_head = (base / "seed_1" / "job.log").read_text().splitlines()
        row = {"jobs": jobs, "precision": precision, "codes": codes, "wall_s": wall,
               "steps_per_s_job": statistics.mean(r for r, _ in rates),
               "steps_per_s_all": sum(r for r, _ in rates), "eval_s": statistics.mean(e for _, e in rates),
               "device_line": next((line for line in log_head if "training on" in line), "")}
        done[(jobs, precision)] = row
        rows.append(row)
        print(json.dumps(row), flush=True)
    table = ["| jobs at once | precision | steps/s a job | steps/s in all | s an evaluation adds | wall s |",
             "|---|---|---|---|---|---|"]
    table += [f"| {r['jobs']} | {r['precision']} | {r['steps_per_s_job']:.1f} | {r['steps_per_s_all']:.1f} | "
              f"{r['eval_s']:.1f} | {r['wall_s']:.0f} |" for r in rows]
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n\n" + "\n".join(table) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["sweep", "one"])
    ap.add_argument("--settings", required=True, help="the experiment's settings (time_to_quality.py settings)")
    ap.add_argument("--plan", nargs="*", default=["1:auto", "1:fp32", "4:auto", "4:fp32", "8:best"])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--log-every", type=int, default=50, help="steps between the runs' timing records")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--runs", default="/tmp/gpu-powered")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="seconds; no item starts after it")
    ap.add_argument("--out", help="sweep: a file for the rows and the table; one: the run's folder")
    args = ap.parse_args()
    (one if args.command == "one" else sweep)(args)


if __name__ == "__main__":
    main()
