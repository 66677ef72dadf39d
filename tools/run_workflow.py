"""Snakemake, with every config file it is given checked as data first: what `make run` and
`make demo` call. Usage: python tools/run_workflow.py [any snakemake option ...]

Snakemake reads a config file through YTE, its YAML template engine, which evaluates the Python
expressions in a file that sets `__use_yte__: true`; and it parses YAML with PyYAML's FullLoader,
whose python/object tags build objects of any class already imported. Both happen before the
Snakefile runs, so no check of headcount's there can stop them. A config file is data: this
script refuses (naming the file and why) one that asks for YTE, carries a YAML tag beyond plain
data, or whose aliases expand past MAX_EXPANDED_VALUES, and otherwise hands every argument to
snakemake unchanged. A profile (--profile) is code by design (profiles/local uses YTE): its own
config files named in it are checked when it is plain YAML; use only profiles you wrote.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import yaml

DEFAULT_CONFIG = "config/config.yaml"  # the Snakefile's configfile:, read from the working directory
CONFIG_OPTIONS = ("--configfile", "--configfiles")
PROFILE_OPTIONS = ("--profile", "--workflow-profile")
# YAML anchors let a 1-KB file name one list a billion times over (the "billion laughs"); Snakemake
# merges configs and headcount validates them value by value, so the expansion is bounded here.
MAX_EXPANDED_VALUES = 1_000_000
# Keys by which Snakemake's YTE turns a config file into a program.
TEMPLATE_KEYS = ("__use_yte__", "__definitions__", "__variables__")


class NotData(Exception):
    """A config file that would run code or exhaust memory when Snakemake reads it."""


def option_values(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """The values given to any of `names` (each takes one or more values, or `--name=value`)."""
    values, taking = [], False
    for token in argv:
        if token.startswith("-"):
            name, eq, value = token.partition("=")
            taking = name in names and not eq
            if name in names and eq:
                values.append(value)
        elif taking:
            values.append(token)
    return values


def config_files(argv: list[str]) -> list[str]:
    """Every config file Snakemake will read: the Snakefile's default, those given on the command
    line, and those a plain-YAML profile names."""
    files = [DEFAULT_CONFIG] if Path(DEFAULT_CONFIG).is_file() else []
    files += option_values(argv, CONFIG_OPTIONS)
    for profile in option_values(argv, PROFILE_OPTIONS):
        settings = Path(profile) / "config.yaml"
        try:
            loaded = yaml.safe_load(settings.read_text(encoding="utf-8")) if settings.is_file() else None
        except (yaml.YAMLError, OSError, UnicodeDecodeError):
            continue  # a templated profile: code its author answers for
        if isinstance(loaded, dict):
            for key in ("configfile", "configfiles"):
                named = loaded.get(key)
                files += [named] if isinstance(named, str) else [n for n in named or () if isinstance(n, str)]
    return files


def check_config_file(path: str | os.PathLike) -> None:
    """NotData, naming the file, for a config file that is not plain data: a YTE template, a YAML
    tag beyond plain data, or aliases that expand past MAX_EXPANDED_VALUES. A file that is not
    YAML at all is left to Snakemake and headcount's own messages."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # Snakemake names a missing or unreadable file itself
    try:
        config = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.constructor.ConstructorError as error:
        where = f" (line {error.problem_mark.line + 1})" if error.problem_mark else ""
        raise NotData(f"{path}: {error.problem}{where}: a config file holds plain YAML data, and Snakemake's YAML "
                      f"reader would build a Python object from this tag. Remove the tag") from None
    except yaml.YAMLError:
        return
    if isinstance(config, dict):
        found = [key for key in TEMPLATE_KEYS if key in config]
        if found:
            raise NotData(f"{path}: sets {', '.join(found)}, which makes Snakemake evaluate the file's '?' "
                          f"expressions as Python (its YTE templates) before the workflow starts; headcount's "
                          f"config files are plain data. Remove {', '.join(found)} and write the values out")
    _count_values(path, config)


def _count_values(path, config) -> None:
    count, todo = 0, [config]
    while todo:
        value = todo.pop()
        count += 1
        if count > MAX_EXPANDED_VALUES:
            raise NotData(f"{path}: its YAML aliases (*name) expand to more than {MAX_EXPANDED_VALUES:,} values, "
                          f"which no headcount config needs and which would exhaust memory when Snakemake merges "
                          f"it; write the repeated parts out or use fewer aliases")
        if isinstance(value, dict):
            todo += list(value.values())
        elif isinstance(value, list):
            todo += value


def snakemake_executable() -> str:
    beside = Path(sys.executable).parent / "snakemake"
    return str(beside) if beside.is_file() else (shutil.which("snakemake") or "snakemake")


def main(argv: list[str]) -> int:
    try:
        for path in config_files(argv):
            check_config_file(path)
    except NotData as error:
        print(f"refused, nothing run: {error}", file=sys.stderr)
        return 2
    executable = snakemake_executable()
    os.execv(executable, [executable, *argv])
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
