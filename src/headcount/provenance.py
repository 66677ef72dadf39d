"""Provenance: the software versions and headcount commit recorded with every result."""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

import torch

from . import __version__


def provenance() -> dict:
    """Software versions and the headcount commit, recorded with every result."""
    import sacrebleu

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"headcount": __version__, "headcount_commit": commit, "torch": torch.__version__,
            "sacrebleu": sacrebleu.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
