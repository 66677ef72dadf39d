"""Provenance: the software versions and headcount commit recorded with every result."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from headcount.version import __version__


def _torch_version() -> str:
    """torch's version without importing it: jobs that only score or plot skip its 1.5 s import."""
    torch = sys.modules.get("torch")
    return torch.__version__ if torch is not None else metadata.version("torch")


def provenance() -> dict:
    """Software versions and the headcount commit, recorded with every result."""
    import sacrebleu

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"headcount": __version__, "headcount_commit": commit, "torch": _torch_version(),
            "sacrebleu": sacrebleu.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
