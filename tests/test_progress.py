"""Progress lines: a tqdm bar written as whole log lines, at the start, at most every `every_s`
seconds, and at the end."""

import torch
from conftest import tiny_config

from headcount.analysis.importance import head_ablation
from headcount.models.transformer import Transformer
from headcount.progress import Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_lines_at_the_start_every_interval_and_at_the_end():
    clock, lines = Clock(), []
    bar = Progress(100, "training", lines.append, unit="step", every_s=30, clock=clock)
    assert len(lines) == 1 and "0/100" in lines[0]  # the first line comes at once
    for _ in range(60):  # one step a second: a line every 30 steps, none in between
        clock.now += 1.0
        bar.update(1, loss="2.500")
    assert len(lines) == 3
    assert "60/100" in lines[-1] and "loss=2.500" in lines[-1] and "1.00step/s" in lines[-1]
    assert "00:40" in lines[-1]  # ETA: 40 steps left at one a second
    for _ in range(40):
        clock.now += 0.1
        bar.update(1)
    assert len(lines) == 4 and "100%" in lines[-1] and "100/100" in lines[-1]


def test_a_resumed_run_counts_its_rate_from_where_it_resumed():
    clock, lines = Clock(), []
    bar = Progress(100, "training", lines.append, unit="step", initial=50, every_s=10, clock=clock)
    clock.now = 10.0
    bar.update(5)  # 5 steps in 10 s since the resume: 2 s a step, 45 left
    assert "55/100" in lines[-1] and "2.00s/step" in lines[-1] and "01:30" in lines[-1]


def test_silent_without_a_log():
    bar = Progress(3, "x", None)
    bar.update(3)
    assert bar.n == 3


def test_ablation_reports_its_progress_over_heads():
    torch.manual_seed(0)
    model = Transformer(tiny_config(enc_layers=1, dec_layers=1, n_heads=2)).eval()
    src = torch.tensor([[5, 6, 7, 2]])
    tgt_in, tgt_out = torch.tensor([[1, 5, 6]]), torch.tensor([[5, 6, 2]])
    lines = []
    head_ablation(model, [(src, tgt_in, tgt_out)], None, log=lines.append)
    assert lines[0].startswith("ablation:") and "0/6" in lines[0]  # 3 attention types x 1 layer x 2 heads
    assert "6/6" in lines[-1]
