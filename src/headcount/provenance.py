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


# The code a result depends on: a job run with changes to these (or files in them git does not know
# and does not ignore) not yet committed says so.
CODE = ("src", "tools", "workflow", "Snakefile")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def provenance() -> dict:
    """Software versions and the headcount commit, recorded with every result; headcount_modified:
    whether the code (CODE) had changes not yet committed (None outside a git checkout)."""
    import sacrebleu

    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    top = (_git("rev-parse", "--show-toplevel") or "").strip()
    # --no-optional-locks: status takes no index lock, so jobs side by side do not collide
    status = _git("--no-optional-locks", "-C", top, "status", "--porcelain", "--", *CODE) if top else None
    return {"headcount": __version__, "headcount_commit": commit,
            "headcount_modified": None if status is None else bool(status.strip()), "torch": _torch_version(),
            "sacrebleu": sacrebleu.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
