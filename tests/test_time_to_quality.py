"""benchmarks/time_to_quality.py's arithmetic: threshold crossings and paired differences over seeds."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "time_to_quality.py"


@pytest.fixture(scope="module")
def ttq():
    spec = importlib.util.spec_from_file_location("time_to_quality", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_scores(run: Path, test_bleu: dict[int, float]) -> None:
    run.mkdir(parents=True)
    (run / "scores.json").write_text(json.dumps({str(u): {"test_bleu_beam": b, "dev_bleu_greedy": b - 1}
                                                 for u, b in test_bleu.items()}))


def test_updates_to_reach_interpolates_between_the_checkpoints_around_the_threshold(ttq):
    curve = [(400, 10.0), (800, 20.0), (1200, 40.0)]
    assert ttq.updates_to_reach(curve, 30.0) == pytest.approx(1000.0)  # halfway from 20 to 40
    assert ttq.updates_to_reach(curve, 5.0) == pytest.approx(200.0)  # from (0, 0) to the first checkpoint
    assert ttq.updates_to_reach(curve, 41.0) is None


def test_the_paired_report_subtracts_each_seed_from_the_same_seed_of_the_default(ttq, tmp_path):
    base = {1: {400: 10.0, 800: 20.0, 1200: 40.0}, 2: {400: 12.0, 800: 22.0, 1200: 38.0}}
    shift = {1: 1.0, 2: 2.0}
    for seed, curve in base.items():
        write_scores(tmp_path / "headcount" / f"seed_{seed}", curve)
        write_scores(tmp_path / "headcount-better" / f"seed_{seed}", {u: b + shift[seed] for u, b in curve.items()})
    write_scores(tmp_path / "headcount-better" / "seed_3", {400: 99.0})  # no default to pair with: left out
    row = next(line for line in ttq.paired_report(tmp_path).splitlines() if line.startswith("| better |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # differences 1 and 2: mean 1.5, sd 1/sqrt(2), t(0.975, 1 df) 12.706, half-width 12.706 * 0.5 = 6.353
    assert cells[1:4] == ["+1.50 [-4.85, +7.85] (2)"] * 3
    assert cells[4] == "+1.50 [-4.85, +7.85] (2)"  # mean over the checkpoints from 800 updates
    # to 30 BLEU: seed 1 at 800 + 400 * 9/20 = 980 against 1000, seed 2 at 800 + 400 * 6/16 = 950 against
    # 800 + 400 * 8/16 = 1000; differences -20 and -50: mean -35, half-width 12.706 * 15 = 190.6
    assert cells[5] == "-35 [-226, +156] (2)"
