"""The suite's order and spread over the xdist workers, and its recorded durations.

- A test's *group* (``group``) is what one xdist worker runs whole, in order: every
  system test (they share one ``./dev airflow``), every deployment test (one ``./dev
  stack``), every image test (one engine and its images); an integration test alone
  (they share nothing wider than the session, so the long ones spread over both
  workers), unless its module shares a module fixture (``MODULE_GROUPS``); any other
  test, its module.
- A test's *unit* (``unit``) is what the order moves as one, its tests kept together
  and in their order: a wide group (system, deploy, deploy/images) whole, else a module.
  Units run longest first (``order``) by ``tests/durations.json``, which
  ``bench/suite_budget.py --update`` refreshes from a run's recorded durations: with
  xdist handing the next group to whichever worker is free, the long ones start first
  and the two workers end together. A unit the file does not know runs after the known
  ones, in collection order.

No import of pytest, TensorFlow or Airflow: ``bench/suite_budget.py`` uses it too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DURATIONS = TESTS / "durations.json"
WIDE_GROUPS = ("system", "deploy/images", "deploy")
# Integration modules whose tests share a module-scoped fixture: one group, one worker,
# so that the fixture is made once (an integration test is otherwise a group alone).
MODULE_GROUPS = ("tests/integration/test_sweep_cli.py",  # failing_sweep
                 "tests/integration/test_tracking.py")  # one walk: night 1, 2, 3 in order


def module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def group(nodeid: str) -> str:
    """The xdist group of a test (see the module's docstring)."""
    path = module(nodeid)
    for folder in WIDE_GROUPS:
        if path.startswith(f"tests/{folder}/"):
            return folder
    if path.startswith("tests/integration/") and path not in MODULE_GROUPS:
        return nodeid
    return path


def unit(nodeid: str) -> str:
    """What the order moves as one: a wide group whole, else a module."""
    found = group(nodeid)
    return found if found in WIDE_GROUPS else module(nodeid)


def unit_seconds(tests: Mapping[str, float]) -> dict[str, float]:
    """Each unit's seconds (the sum of its tests' setup, call and teardown)."""
    totals: dict[str, float] = {}
    for nodeid, seconds in tests.items():
        totals[unit(nodeid)] = totals.get(unit(nodeid), 0.0) + seconds
    return totals


def known_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """``tests/durations.json``'s seconds by unit; nothing when it is missing or broken
    (the order is then the collection's: the suite never fails on it)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text())["units"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def order(nodeids: Iterable[str], seconds: Mapping[str, float]) -> list[int]:
    """The indices of ``nodeids`` in run order: units longest first, each unit's tests
    together and in collection order; units ``seconds`` does not know last."""
    nodeids = list(nodeids)
    first: dict[str, int] = {}
    for index, nodeid in enumerate(nodeids):
        first.setdefault(unit(nodeid), index)

    def key(index: int) -> tuple[float, int, int]:
        name = unit(nodeids[index])
        return (-seconds.get(name, 0.0), first[name], index)

    return sorted(range(len(nodeids)), key=key)
