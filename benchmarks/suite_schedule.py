"""How long `make test` takes under pytest-xdist's work-unit order against the one tests/conftest.py sets.

Reads the log of one verbose run with every duration,
    .venv/bin/python -m pytest -n 2 -v --durations=0 -p no:cacheprovider > suite.log
and replays its measured per-test times through xdist's LoadScope scheduling (a worker is handed the
next work unit whenever 2 or fewer of its tests are pending) for two queue orders: xdist's own (the
units with most tests first) and conftest's (SLOWEST_UNITS first, then the collection's order). Both
replays use the same durations, so their ratio holds however loaded the machine was during the run.

    .venv/bin/python benchmarks/suite_schedule.py suite.log [--workers 2]
"""
import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import unit_rank, work_unit  # noqa: E402

DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)")
RESULT = re.compile(r"^\[gw\d+\] \[\s*\d+%\] (?:PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR) (\S+)")


def read_log(text: str) -> tuple[list[str], dict[str, float]]:
    """The tests in the order of the log's results, and each test's seconds (setup + call + teardown)."""
    tests, seconds = [], defaultdict(float)
    for line in text.splitlines():
        if match := RESULT.match(line):
            tests.append(match[1])
        elif match := DURATION.match(line):
            seconds[match[3]] += float(match[1])
    return list(dict.fromkeys(tests)), seconds


def units_in_collection_order(tests: list[str]) -> dict[str, list[str]]:
    """Work units with their tests; units in file-name order (pytest collects files alphabetically)."""
    units = defaultdict(list)
    for nodeid in sorted(tests, key=lambda nodeid: nodeid.split("::")[0]):
        units[work_unit(nodeid)].append(nodeid)
    return dict(units)


def replay(queue: list[list[float]], workers: int) -> float:
    """Wall time of xdist's LoadScope on `queue` (each unit a list of test seconds, in queue order)."""
    queue = list(queue)
    pending = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def refill(node: int) -> None:
        if queue and len(pending[node]) <= 2:
            pending[node].extend(queue.pop(0))

    for node in range(workers):  # the initial assignment, then a second unit where a first is short
        refill(node)
    for node in range(workers):
        refill(node)
    while any(pending):
        node = min((n for n in range(workers) if pending[n]), key=lambda n: clock[n] + pending[n][0])
        clock[node] += pending[node].pop(0)
        refill(node)
    return max(clock)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    tests, seconds = read_log(args.log.read_text())
    if not tests:
        sys.exit(f"{args.log}: no '[gwN] [ N%] PASSED <test>' lines; run pytest with -n 2 -v --durations=0")
    units = units_in_collection_order(tests)
    times = {unit: [seconds.get(nodeid, 0.0) for nodeid in nodeids] for unit, nodeids in units.items()}
    xdist_order = sorted(units, key=lambda unit: -len(units[unit]))  # stable: ties keep collection order
    conftest_order = sorted(units, key=unit_rank)
    total = sum(map(sum, times.values()))
    print(f"{len(tests)} tests in {len(units)} work units, {total:.0f} s of test time, {args.workers} workers")
    print("\nslowest units (s):")
    for unit in sorted(units, key=lambda unit: -sum(times[unit]))[:10]:
        print(f"  {sum(times[unit]):7.1f}  {unit}  ({len(units[unit])} tests, "
              f"queued {xdist_order.index(unit) + 1} by xdist, {conftest_order.index(unit) + 1} by conftest)")
    walls = {name: replay([times[unit] for unit in order], args.workers)
             for name, order in (("xdist's order (most tests first)", xdist_order),
                                 ("conftest's order (SLOWEST_UNITS first)", conftest_order))}
    print(f"\nreplayed wall time (a perfect split: {total / args.workers:.0f} s):")
    for name, wall in walls.items():
        print(f"  {wall:7.0f} s  {name}")
    before, after = walls.values()
    print(f"  conftest / xdist: {after / before:.2f}")


if __name__ == "__main__":
    main()
