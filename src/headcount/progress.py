"""Progress of long loops (training, decoding, LRP, ablation) as tqdm bars written as log lines.

A job's console is often a file (a Snakemake log, a SLURM output file), where a live bar that
redraws itself becomes thousands of carriage returns. So the bar is drawn by tqdm's own formatter
and written as one whole line through the job's `log`: when the loop starts (so the first progress
shows within seconds of a job's start), at most once every `every_s` seconds after that, and when
it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tqdm import tqdm

EVERY_S = 30.0  # seconds between two progress lines of one loop: ~120 lines an hour


class Progress:
    """`update()` once per unit of work; lines go to `log` (None: silent)."""

    def __init__(self, total: int, desc: str, log: Callable[[str], None] | None, unit: str = "it",
                 initial: int = 0, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.total, self.desc, self.log, self.unit = total, desc, log, unit
        self.initial = self.n = initial
        self.every_s, self.clock = every_s, clock
        self.start = self.last_line = clock()
        self.postfix = ""
        self._write()

    def update(self, n: int = 1, **postfix) -> None:
        self.n += n
        if postfix:
            self.postfix = ", ".join(f"{k}={v}" for k, v in postfix.items())
        if self.n >= self.total or self.clock() - self.last_line >= self.every_s:
            self._write()

    def line(self) -> str:
        return tqdm.format_meter(self.n, self.total, self.clock() - self.start, ncols=100, prefix=self.desc,
                                 unit=self.unit, postfix=self.postfix or None, ascii=True, initial=self.initial)

    def _write(self) -> None:
        self.last_line = self.clock()
        if self.log is not None:
            self.log(self.line())
