"""benchmarks/time_to_quality.py's arithmetic: threshold crossings and paired differences over seeds."""

import json
from pathlib import Path

import pytest
from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "time_to_quality.py"


@pytest.fixture(scope="module")
def ttq():
    return load_script(SCRIPT)


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


def test_a_run_stopped_early_is_compared_on_the_checkpoints_every_run_has(ttq, tmp_path):
    """Seed 2 of the default stopped at 1,200 updates: the mean from 800 compares both arms at 800 and
    1,200 only, not seed 2's early checkpoints against the other's later, higher ones."""
    write_scores(tmp_path / "headcount" / "seed_1", {800: 20.0, 1200: 30.0, 1600: 34.0})
    write_scores(tmp_path / "headcount" / "seed_2", {800: 22.0, 1200: 28.0})
    write_scores(tmp_path / "fairseq" / "seed_1", {800: 21.0, 1200: 29.0, 1600: 40.0})
    write_scores(tmp_path / "fairseq" / "seed_2", {800: 23.0, 1200: 31.0, 1600: 40.0})
    row = next(line for line in ttq.against_fairseq(tmp_path).splitlines() if line.startswith("| headcount ("))
    # headcount 25 and 25, fairseq 25 and 27 over 800 and 1,200: difference -1.00
    assert row.split(" | ")[1].startswith("-1.00 ["), row


def test_fairseq_trains_where_it_is_told_and_with_the_environment_it_is_given(ttq, monkeypatch):
    """A lent GPU: fairseq-train without --cpu, through a stand-in environment (gpu_time_to_quality.sh)."""
    calls = []
    monkeypatch.setattr(ttq.subprocess, "run", lambda cmd, **kw: calls.append([str(c) for c in cmd]))
    ttq.train_fairseq(Path("out"), 2, 2400, 400, 1, device="cuda", venv="/tmp/fairseq-env")
    ttq.train_fairseq(Path("out"), 2, 2400, 400, 1, device="cpu")
    on_gpu, on_cpu = calls
    assert on_gpu[on_gpu.index("--device") + 1] == "cuda" and on_cpu[on_cpu.index("--device") + 1] == "cpu"
    assert on_gpu[on_gpu.index("--fairseq-venv") + 1] == "/tmp/fairseq-env" and "--fairseq-venv" not in on_cpu

    tools = SCRIPT.parents[1] / "tools"
    tool = load_script(tools / "fairseq_reference.py")
    commands = []
    monkeypatch.setattr(tool, "run", lambda cmd, **kw: commands.append([str(c) for c in cmd]))
    for device in ("cpu", "cuda"):
        args = tool.argparse.Namespace(arch_preset="multi30k", max_update=10, seed=1, save_every=5,
                                       keep_checkpoints=-1, threads=1, device=device)
        tool.train(Path("/env/bin/python"), args, Path("out"), Path("bin"))
    assert "--cpu" in commands[0] and "--cpu" not in commands[1]


@pytest.mark.slow
def test_the_deadline_stops_a_queued_run_with_the_processes_it_started(ttq, tmp_path, monkeypatch):
    """fairseq-train is the run's grandchild: stopping only the child left it training (found when a
    stopped benchmark kept a core busy for half an hour)."""
    import os
    import time
    from types import SimpleNamespace

    fake = tmp_path / "fake_one.py"  # stands in for `time_to_quality.py one`: starts a "fairseq-train"
    pid_file = tmp_path / "grandchild.pid"
    fake.write_text("import subprocess, sys, time\n"
                    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                    f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
                    "time.sleep(120)\n")
    monkeypatch.setattr(ttq, "__file__", str(fake))
    args = SimpleNamespace(max_updates=10, every=5, threads=1, beam=1, alpha=0.6, device="cpu", settings=None,
                           fairseq_venv=None, sentences=None, jobs=2, deadline=2.5)
    started = time.monotonic()
    ttq.queue_in_parallel(["fairseq:default:1"], tmp_path / "runs", args)
    assert time.monotonic() - started < 60
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once killed; gone from the process table soon after
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        raise AssertionError("the run's grandchild outlived the deadline")
