"""benchmarks/stage_times.py: a resumed training job counts every attempt's CPU time, and several
experiments' folders add up to one DAG."""

import json
from pathlib import Path

import pytest
from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "stage_times.py"
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


@pytest.fixture(scope="module")
def stage_times():
    return load_script(SCRIPT)


def bench(exp: Path, job: str, wall: float, cpu: float) -> None:
    path = exp / "benchmarks" / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{wall}\t0:00:00\t100\t0\t0\t0\t0\t0\t90\t{cpu}\n")


def record(exp: Path, path: str, record: dict) -> None:
    (exp / path).parent.mkdir(parents=True, exist_ok=True)
    (exp / path).write_text(json.dumps(record))


def summary(cpu_all: float | None, last: float = 10.0) -> dict:
    return {"steps": 100, "train_seconds": last, **({} if cpu_all is None else
            {"attempts": 3, "train_seconds_all": cpu_all, "train_cpu_seconds_all": cpu_all})}


def test_a_resumed_training_job_counts_every_attempt_and_folders_add_up(stage_times, tmp_path):
    exp, seed = tmp_path / "exp", tmp_path / "exp_seed2"
    bench(exp, "train_baseline", 130, 120)  # the last of three attempts
    record(exp, "baseline/training.json", summary(400))
    bench(exp, "prune/all/lambda_0.1/prune_heads", 60, 50)
    record(exp, "prune/all/lambda_0.1/gates.json", {"summary": summary(70), "heal_summary": summary(20)})
    bench(exp, "prune/all/lambda_0.1/train_from_scratch", 30, 30)  # records older than the all-attempts fields
    record(exp, "prune/all/lambda_0.1/scratch/training.json", summary(None))
    bench(exp, "baseline/translate_test_2016_flickr", 12, 6)
    bench(seed, "train_baseline", 100, 90)  # one attempt: the benchmark holds it all
    record(seed, "baseline/training.json", summary(80))

    jobs = stage_times.job_times(exp).set_index("job")["cpu_seconds"].to_dict()
    assert jobs == {"train_baseline": 400, "prune/all/lambda_0.1/prune_heads": 90,
                    "prune/all/lambda_0.1/train_from_scratch": 30, "baseline/translate_test_2016_flickr": 6}
    both = stage_times.pd.concat([stage_times.job_times(exp), stage_times.job_times(seed)])
    table = stage_times.stage_table(both)
    assert "| baseline training | 2 | 3.8 | 8.2 | 100 |" in table  # (400 + 90) s of CPU; 230 s of wall
    assert table.splitlines()[-1] == f"| **all benchmarked jobs** | 5 | 5.5 | {(400 + 90 + 30 + 6 + 90) / 60:.1f} | |"
    by_experiment = stage_times.experiment_table(both).splitlines()
    assert f"| exp | baseline training | 1 | {400 / 60:.1f} | {400 / 60:.1f} |" in by_experiment
    assert f"| exp_seed2 | baseline training | 1 | {90 / 60:.1f} | {90 / 60:.1f} |" in by_experiment
    assert f"| exp | **all** | 4 | {(400 + 90 + 30 + 6) / 60:.1f} | |" in by_experiment
    third = tmp_path / "exp_seed3"  # two jobs of one stage: a job's CPU time is their mean
    bench(third, "baseline/translate_test_2016_flickr", 700, 600)
    bench(third, "baseline/translate_test_2017_flickr", 400, 300)
    assert "| exp_seed3 | translation (beam search) | 2 | 15.0 | 7.5 |" in stage_times.experiment_table(
        stage_times.job_times(third))
