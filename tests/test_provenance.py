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
