"""A fresh machine must install what CI tested: every requirement is a registry name and version,
never a file on one developer's disk or a URL (constraints.txt once held a wheel path under /tmp,
and every clean install failed)."""

import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import lock_constraints  # noqa: E402

# A direct reference (PEP 508 `name @ url`), a VCS or file URL, or a path.
DIRECT = re.compile(r"\s@\s|^@|[a-z+]+://|^git\+|^(\.{0,2}/|~/|file:)|^-e\b|^--?(f|find-links|index-url|extra-index-url)\b")


def direct_references(lines: list[str]) -> list[str]:
    """The requirement lines (comments and blanks dropped) that point at a file or URL."""
    found = []
    for number, line in lines:
        text = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()  # pip: a comment starts at " #"
        if text and DIRECT.search(text):
            found.append(f"line {number}: {text}")
    return found


def numbered(text: str) -> list[tuple[int, str]]:
    return list(enumerate(text.splitlines(), start=1))


def requirement_lines(path: Path) -> list[tuple[int, str]]:
    """Every requirement string of a pyproject.toml, constraints file or conda environment, with
    the line it stands on."""
    text = path.read_text()
    if path.name == "pyproject.toml":
        import tomllib

        data = tomllib.loads(text)
        specs = list(data["build-system"]["requires"]) + list(data["project"]["dependencies"])
        for extra in data["project"].get("optional-dependencies", {}).values():
            specs += extra
        return [(next((i for i, line in numbered(text) if spec in line), 0), spec) for spec in specs]
    if path.suffix in (".yaml", ".yml"):
        env = yaml.safe_load(text)["dependencies"]
        specs = [d for d in env if isinstance(d, str)]
        specs += [p for d in env if isinstance(d, dict) for p in d.get("pip", [])]
        return [(next((i for i, line in numbered(text) if spec in line), 0), spec) for spec in specs]
    return numbered(text)


@pytest.mark.parametrize("name", ["constraints.txt", "pyproject.toml", "envs/headcount.yaml"])
def test_requirements_name_registry_packages_only(name):
    pytest.importorskip("tomllib")
    found = direct_references(requirement_lines(REPO / name))
    assert not found, f"{name} points at files or URLs a fresh machine does not have; write name==version: {found}"


def test_every_constraint_is_a_name_and_version():
    bad = [f"line {n}: {line}" for n, line in numbered((REPO / "constraints.txt").read_text())
           if line.strip() and not line.startswith("#") and not lock_constraints.PIN.match(line.strip())]
    assert not bad, f"constraints.txt: not name==version: {bad}"


def test_the_checker_sees_the_line_that_broke_installs():
    """The line `make lock` once wrote (pip freeze of a wheel installed from a download)."""
    old = "transformers @ file:///tmp/tfdl/transformers-5.24.0-py3-none-any.whl#sha256=ff5e"
    lines = [(1, "# header"), (2, "tqdm==4.70.1"), (3, old), (4, "x @ https://example.org/x.tar.gz"),
             (5, "git+https://github.com/a/b"), (6, "./wheels/y.whl"), (7, "-e ."), (8, "z==1.0")]
    assert direct_references(lines) == [f"line {n}: {s}" for n, s in lines[2:7]]
    assert not lock_constraints.PIN.match(old)


def test_lock_writes_versions_whatever_pip_freeze_would_print(tmp_path):
    installed = [
        {"name": "transformers", "version": "5.24.0"},  # freeze prints this one as `@ file:///...`
        {"name": "Babel", "version": "2.17.0"},
        {"name": "torch", "version": "2.13.0"},
        {"name": "headcount", "version": "0.1.0", "editable_project_location": "/work/main"},
        {"name": "pip", "version": "25.3"},
    ]
    assert lock_constraints.pins(installed) == ["Babel==2.17.0", "transformers==5.24.0"]
    with pytest.raises(ValueError, match="weird"):
        lock_constraints.pins([{"name": "weird", "version": "1.0 @ file:///x"}])
    assert lock_constraints.header("# a\n# b\nx==1\n# c\n") == ["# a", "# b"]
