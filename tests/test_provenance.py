"""headcount.provenance: the commit a result was made with, and whether its code had changes not
yet committed, read from a real git repository."""

import subprocess

from headcount import provenance


def test_a_record_says_when_the_code_had_changes_not_yet_committed(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("notes\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()

    def in_repo(*args):  # the module's own git call, run in the repository above
        done = subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    monkeypatch.setattr(provenance, "_git", in_repo)
    record = provenance.provenance()
    assert record["headcount_commit"] == head and record["headcount_modified"] is False
    (tmp_path / "notes.md").write_text("other notes\n")  # not code: still as committed
    assert provenance.provenance()["headcount_modified"] is False
    (tmp_path / "src" / "new.py").write_text("y = 2\n")  # a module the commit does not hold
    assert provenance.provenance()["headcount_modified"] is True
    (tmp_path / "src" / "new.py").unlink()
    (tmp_path / "src" / "model.py").write_text("x = 2\n")
    assert provenance.provenance()["headcount_modified"] is True
    monkeypatch.setattr(provenance, "_git", lambda *args: None)  # no git here: unknown, not "clean"
    assert provenance.provenance()["headcount_modified"] is None


def test_a_job_records_the_code_it_started_with_not_an_edit_made_while_it_ran(tmp_path, monkeypatch):
    """workflow/scripts/_common.job: the record is written at the end, but the code state in it is
    the one the job imported at its start."""
    import json
    from pathlib import Path

    from toyflow import REPO

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path / "repo"), *args], capture_output=True, text=True)

    (tmp_path / "repo" / "src").mkdir(parents=True)
    (tmp_path / "repo" / "src" / "model.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    def in_repo(*args):
        done = git(*args)
        return done.stdout if done.returncode == 0 else None

    monkeypatch.setattr(provenance, "_git", in_repo)
    monkeypatch.syspath_prepend(str(REPO / "workflow/scripts"))
    from _common import job

    monkeypatch.chdir(tmp_path)
    snakemake = type("Snakemake", (), {"log": ["logs/job.log"], "threads": 1, "rule": "r", "wildcards": {},
                                       "input": [], "output": [], "params": {}})()
    with job(snakemake):
        (tmp_path / "repo" / "src" / "model.py").write_text("x = 2\n")  # edited while the job runs
    record = json.loads(Path("provenance/job.json").read_text())
    assert record["software"]["headcount_modified"] is False, record["software"]
    assert record["software"]["headcount_commit"] == git("rev-parse", "HEAD").stdout.strip()
    assert provenance.provenance()["headcount_modified"] is True  # the edit itself is seen afterwards
