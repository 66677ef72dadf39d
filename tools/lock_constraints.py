"""Write constraints.txt from the packages installed in a virtual environment.

`make lock` runs this on .venv-latest after `make test-latest` passed. Every package is written as
`name==version`: `pip freeze` prints a package installed from a downloaded wheel or a checkout as
`name @ file:///...`, a path that exists on one machine only, and such a line made every fresh
install fail. The header (the leading comment block of the old file) is kept; torch is pinned in
pyproject.toml and left out here, as is headcount itself.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
SKIP = {"headcount", "torch", "pip", "setuptools", "wheel"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(installed: list[dict]) -> list[str]:
    """`name==version` lines, sorted by name, of `pip list --format=json` records (editable
    installs and SKIP left out). Raises ValueError on a version that is no plain version."""
    lines = []
    for package in installed:
        if normalise(package["name"]) in SKIP or package.get("editable_project_location"):
            continue
        line = f"{package['name']}=={package['version']}"
        if not PIN.match(line):
            raise ValueError(f"{package['name']}: version {package['version']!r} is not a registry version")
        lines.append(line)
    return sorted(lines, key=lambda line: normalise(line.split("==")[0]))


def header(text: str) -> list[str]:
    """The leading comment lines of a constraints file."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("python", help="the interpreter of the environment to lock, e.g. .venv-latest/bin/python")
    parser.add_argument("--out", default="constraints.txt")
    args = parser.parse_args(argv)
    listed = subprocess.run([args.python, "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True).stdout
    out = Path(args.out)
    lines = header(out.read_text()) if out.exists() else []
    lines += pins(json.loads(listed))
    tmp = out.with_suffix(out.suffix + ".new")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)  # all or nothing: a failed lock leaves the old file
    print(f"{out}: {len(lines)} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
