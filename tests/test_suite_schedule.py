"""How `make test` hands work to its pytest-xdist workers (tests/conftest.py)."""
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest

TESTS = Path(__file__).parent


def fake_item(nodeid: str, fixtures=()):
    return SimpleNamespace(nodeid=nodeid, path=Path(nodeid.split("::")[0]), fixturenames=list(fixtures))


def test_every_slow_unit_named_exists():
    """A renamed or deleted file left in SLOWEST_UNITS would silently stop going first."""
    for unit in conftest.SLOWEST_UNITS:
        if unit != "smoke_run":
            assert (TESTS.parent / unit).is_file(), f"{unit} in SLOWEST_UNITS of tests/conftest.py does not exist"
    assert len(set(conftest.SLOWEST_UNITS)) == len(conftest.SLOWEST_UNITS)


def test_the_slowest_units_are_queued_first_and_the_rest_keep_their_order():
    slow_last, slow_first = conftest.SLOWEST_UNITS[-1], conftest.SLOWEST_UNITS[0]
    assert slow_first == "smoke_run"
    items = [fake_item("tests/test_a.py::test_1"), fake_item("tests/test_a.py::test_2"),
             fake_item(f"{slow_last}::test_x"), fake_item("tests/test_b.py::test_1"),
             fake_item("tests/test_workflow.py::test_smoke", ["smoke_run"]), fake_item(f"{slow_last}::test_y"),
             fake_item("tests/test_atlas.py::test_atlas", ["smoke_run"])]
    conftest.pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == [
        "tests/test_workflow.py::test_smoke", "tests/test_atlas.py::test_atlas",  # the smoke run's files: one unit
        f"{slow_last}::test_x", f"{slow_last}::test_y",
        "tests/test_a.py::test_1", "tests/test_a.py::test_2", "tests/test_b.py::test_1"]


def test_a_test_reading_the_smoke_run_outside_its_files_is_refused():
    with pytest.raises(pytest.UsageError, match="SMOKE_RUN_FILES"):
        conftest.pytest_collection_modifyitems([fake_item("tests/test_a.py::test_1", ["smoke_run"])])
