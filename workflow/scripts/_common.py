"""What every script shares: the library on sys.path, a log file, clean errors.

Scripts are thin: they take paths and settings from the `snakemake` object and call
src/headcount. A HeadcountError (bad data, bad config) is written to the job's log as one clear
message and fails the job without a traceback; anything else keeps its traceback.
"""

import os
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
        try:
            print(line, file=sys.stderr, flush=True)
        except OSError:  # the terminal went away (a closed ssh session): the log file still has it
            pass


@contextmanager
def job(snakemake):
    """with job(snakemake) as log: ... -- threads set, errors reported."""
    log = Log(snakemake.log[0])
    # The job's threads, read by torch when (and only if) the job's code imports it: fetching,
    # scoring and plotting jobs never load torch (1.5-2.5 s a job).
    threads = str(max(1, snakemake.threads))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads
    if "torch" in sys.modules:  # pragma: no cover - imported before the job: its pool is sized already
        sys.modules["torch"].set_num_threads(int(threads))
    log(f"rule {snakemake.rule}, wildcards {dict(snakemake.wildcards)}")
    from headcount.provenance import provenance

    # the code as the job imported it: an edit made while the job runs is not what ran
    started = provenance()
    try:
        yield log
        write_provenance(snakemake, started)
    except HeadcountError as error:
        log(f"ERROR: {error}{mirror_copy_note(snakemake, str(error))}")
        sys.exit(1)
    except Exception:
        import traceback

        log("ERROR: unexpected failure\n" + traceback.format_exc())
        raise
    log("done")


def mirror_copy_note(snakemake, message: str) -> str:
    """Where an error names an input that is a copy of a data mirror's file, say so: the fix
    belongs in the mirror (the copy is made again once the mirror's file is newer)."""
    import os

    from headcount.config import FETCHED_DIR, MIRROR_ENV

    mirror = os.environ.get(MIRROR_ENV)
    notes = []
    for path in map(str, snakemake.input) if mirror else ():
        if path.startswith(FETCHED_DIR + "/") and path in message:
            original = Path(mirror) / Path(path).relative_to(FETCHED_DIR)
            notes.append(f"\n{path} is a copy of {original} from the data mirror: fix or replace the file "
                         f"there, and the next run copies it again.")
    return "".join(notes)


def provenance_path(log_path) -> Path:
    """results/{exp}/logs/<name>.log -> results/{exp}/provenance/<name>.json"""
    log_path = Path(log_path)
    parts = log_path.parts
    if "logs" in parts:
        i = len(parts) - 1 - parts[::-1].index("logs")
        return Path(*parts[:i], "provenance", *parts[i + 1:]).with_suffix(".json")
    return log_path.with_suffix(".provenance.json")


def write_provenance(snakemake, software: dict) -> None:
    """Record what produced each output of the job: the settings it was given (its params, which
    hold every config value it depends on, seeds included), its inputs and outputs with their
    checksums, and `software` (headcount.provenance.provenance() as the job started: the versions,
    the headcount commit and whether the code had uncommitted changes). One file per job, beside the
    logs."""
    from headcount.io import sha256_file, write_json

    def files(paths):
        out = {}
        for path in map(Path, paths):
            if path.is_file():
                out[str(path)] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
            elif path.is_dir():
                out[str(path)] = {"directory": True}
        return out

    import json

    params = json.loads(json.dumps(dict(snakemake.params.items()), default=str))
    write_json(provenance_path(snakemake.log[0]), {
        "rule": snakemake.rule, "wildcards": dict(snakemake.wildcards), "params": params,
        "threads": snakemake.threads, "inputs": files(snakemake.input), "outputs": files(snakemake.output),
        "software": {**software, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")},
    })
