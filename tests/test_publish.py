"""tools/publish_results.py: all of a run's published files, or none."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("publish_results", REPO / "tools" / "publish_results.py")
publish_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(publish_results)


def _fake_runs(root: Path) -> dict[str, Path]:
    runs = {"main": root / "results" / "exp", "control": root / "results" / "control"}
    for run, inside in publish_results.PUBLISHED.values():
        source = runs[run] / inside
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(f"{run}:{inside}".encode())
    return runs


def test_a_missing_file_publishes_nothing(tmp_path):
    runs = _fake_runs(tmp_path)
    missing = runs["main"] / "prune" / "table2.md"
    missing.unlink()
    docs = tmp_path / "docs"
    lines = []
    assert publish_results.publish(runs, docs, log=lines.append) == 2
    assert not docs.exists()
    assert any(str(missing) in line for line in lines)


def test_every_file_is_copied_once(tmp_path):
    runs = _fake_runs(tmp_path)
    docs = tmp_path / "docs"
    (docs / "tables").mkdir(parents=True)
    (docs / "tables" / "table2.md").write_text("an older run's table\n")
    assert publish_results.publish(runs, docs, log=lambda _: None) == 0
    for published, (run, inside) in publish_results.PUBLISHED.items():
        assert (docs / published).read_bytes() == (runs[run] / inside).read_bytes()
    lines = []
    assert publish_results.publish(runs, docs, log=lines.append) == 0
    assert lines == [f"0 of {len(publish_results.PUBLISHED)} published files changed"]


def test_every_published_file_in_docs_comes_from_a_run():
    """A table or figure in docs/ that no run writes would outlive every republication."""
    shown = {str(p.relative_to(REPO / "docs")) for folder in ("tables", "figures")
             for p in (REPO / "docs" / folder).iterdir() if p.is_file()}
    assert shown <= set(publish_results.PUBLISHED), sorted(shown - set(publish_results.PUBLISHED))
