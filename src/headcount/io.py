"""Atomic file output: a reader never sees a half-written file.

Everything headcount writes goes to a temporary file in the destination's directory and is then
renamed over the destination (atomic on POSIX within one file system), so a job killed mid-write
leaves either the old file or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)


class HeadcountError(Exception):
    """An error the user can fix: the message names the file, line or key, and the fix."""


class DataError(HeadcountError):
    pass


class CheckpointError(HeadcountError):
    pass


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; results should be as readable as any
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs):
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def write_lines(path: str | os.PathLike, lines) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def read_lines(path: str | os.PathLike) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def iter_lines(path: str | os.PathLike):
    """read_lines one line at a time, for files too large to hold (a last line without its
    newline is not one, as there)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                yield line[:-1]


def write_json(path: str | os.PathLike, obj) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def config_hash(obj) -> str:
    """A stable fingerprint of a JSON-able configuration."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
