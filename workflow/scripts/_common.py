"""What every script shares: the library on sys.path, a log file, clean errors.

Scripts are thin: they take paths and settings from the `snakemake` object and call
src/headcount. A HeadcountError (bad data, bad config) is written to the job's log as one clear
message and fails the job without a traceback; anything else keeps its traceback.
"""

import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from headcount.io import HeadcountError  # noqa: E402


class Log:
    """Timestamped lines to the job's log file and to stderr (the terminal or the cluster log)."""

    def __init__(self, path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", buffering=1, encoding="utf-8")

    def __call__(self, message: str) -> None:
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}"
        self.file.write(line + "\n")
        print(line, file=sys.stderr, flush=True)


@contextmanager
def job(snakemake):
    """with job(snakemake) as log: ... -- threads set, errors reported."""
    log = Log(snakemake.log[0])
    try:
        import torch

        torch.set_num_threads(max(1, snakemake.threads))
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    log(f"rule {snakemake.rule}, wildcards {dict(snakemake.wildcards)}")
    try:
        yield log
    except HeadcountError as error:
        log(f"ERROR: {error}")
        sys.exit(1)
    except Exception:
        import traceback

        log("ERROR: unexpected failure\n" + traceback.format_exc())
        raise
    log("done")
