"""The suite's time budget: what the last test run took, against what it may take.

    .venv/bin/python bench/suite_budget.py [--durations FILE] [--since EPOCH] [--update]

Reads the durations the run recorded (``tests/conftest.py`` writes every test's setup +
call + teardown seconds and the session's wall time to ``$TEST_DURATIONS_FILE``, else
``artifacts/test-durations.json``) and prints:

- every test over ``--test-limit`` seconds (120) that is not on the allow-list,
  ``bench/suite_budget_allow.txt`` (one pattern a line, each with its reason), and those
  that are, with their reasons;
- the session's wall time, and with ``--since`` (the epoch second CI started) CI's
  whole time, set-up and lint included, against ``--budget-min`` minutes (25);
- how busy each worker's share would be: the sum of the tests, against the wall.

It warns and never fails: machines are noisy, and CI's status is the tests' own. It
exits 0 whatever it finds, a missing or broken file included. ``--update`` rewrites
``tests/durations.json`` (each module's seconds, and the system, deploy and image groups'
whole: the order ``tests/conftest.py`` runs them in, longest first) with what this run
measured, keeping the units it did not run: run it after a whole run and commit the file.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.fspath(ROOT / "tests"))

from support import order  # noqa: E402  (tests/support/order.py: no heavy import)

DEFAULT_DURATIONS = ROOT / "artifacts" / "test-durations.json"
ALLOW = Path(__file__).with_name("suite_budget_allow.txt")


def allow_list(path: Path) -> list[tuple[str, str]]:
    """(pattern, reason) for each line ``PATTERN  # REASON``; a line that is only a
    comment explains the file."""
    entries = []
    for raw in path.read_text().splitlines():
        text, _, reason = raw.partition("#")
        if text.strip():
            entries.append((text.strip(), reason.strip()))
    return entries


def allowed(nodeid: str, entries: list[tuple[str, str]]) -> str | None:
    """The reason ``nodeid`` may take long, or None. A pattern matches a test id
    (fnmatch), a module or a folder (a prefix ending in ``.py`` or ``/``)."""
    for pattern, reason in entries:
        if fnmatch.fnmatchcase(nodeid, pattern) or (
                pattern.endswith((".py", "/")) and nodeid.startswith(pattern)):
            return reason or "(no reason given)"
    return None


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min ({seconds:.0f} s)"


def report(record: dict, entries: list[tuple[str, str]], test_limit: float,
           budget_s: float, since: float | None) -> list[str]:
    tests: dict[str, float] = record.get("tests") or {}
    lines = [f"suite budget: {len(tests)} tests recorded"
             f" ({record.get('workers') or 'no'} xdist workers, pytest exit "
             f"{record.get('exitstatus')})"]
    slow = sorted(((s, n) for n, s in tests.items() if s > test_limit), reverse=True)
    over = [(s, n) for s, n in slow if allowed(n, entries) is None]
    for seconds, nodeid in over:
        lines.append(f"  WARNING: {seconds:.0f} s over the {test_limit:.0f} s a test may "
                     f"take, not on {ALLOW.relative_to(ROOT)}: {nodeid}")
    for seconds, nodeid in slow:
        reason = allowed(nodeid, entries)
        if reason is not None:
            lines.append(f"  allowed: {seconds:.0f} s {nodeid} ({reason})")
    if not slow:
        lines.append(f"  no test over {test_limit:.0f} s")
    wall = record.get("wall_s")
    total = sum(tests.values())
    if wall:
        verdict = "within" if wall <= budget_s else "WARNING: OVER"
        lines.append(f"  pytest wall: {minutes(wall)}, {verdict} the budget of "
                     f"{minutes(budget_s)}")
        workers = int(record.get("workers") or 1)
        lines.append(f"  tests' own time: {minutes(total)}, {total / workers / wall:.0%} of "
                     f"{workers} worker(s) x the wall")
    if since:
        ci = time.time() - since
        verdict = "within" if ci <= budget_s else "WARNING: OVER"
        lines.append(f"  CI so far (set-up, ruff, pytest): {minutes(ci)}, {verdict} the "
                     f"budget of {minutes(budget_s)}")
    units = sorted(order.unit_seconds(tests).items(), key=lambda kv: -kv[1])[:10]
    lines.append("  longest units (the order's, tests/durations.json): " + ", ".join(
        f"{name} {seconds:.0f} s" for name, seconds in units))
    return lines


def update(record: dict, path: Path = order.DURATIONS) -> str:
    """tests/durations.json with this run's units, keeping the ones it did not run."""
    measured = order.unit_seconds(record.get("tests") or {})
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    units = {**(old.get("units") or {}), **{k: round(v, 1) for k, v in measured.items()}}
    when = time.strftime("%Y-%m-%d", time.gmtime(record.get("finished") or time.time()))
    new = {
        "about": "Each unit's seconds (a module, or the system, deploy and deploy/images "
                 "groups whole), longest first: the order tests/conftest.py runs them in "
                 "(tests/support/order.py). Refreshed by bench/suite_budget.py --update "
                 "from a run's artifacts/test-durations.json; units a run did not run "
                 "keep their seconds.",
        "source": f"{when}: {len(measured)} units from a run of {len(record['tests'])} "
                  f"tests with {record.get('workers') or 0} xdist workers"
                  + (f"; before: {old['source']}" if old.get("source") else ""),
        "units": dict(sorted(units.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
    path.write_text(json.dumps(new, indent=1) + "\n")
    return f"  {path.relative_to(ROOT)}: {len(measured)} units refreshed, {len(units)} in all"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--durations", type=Path, default=Path(
        os.environ.get("TEST_DURATIONS_FILE") or DEFAULT_DURATIONS))
    parser.add_argument("--allow", type=Path, default=ALLOW)
    parser.add_argument("--test-limit", type=float, default=120.0, metavar="S")
    parser.add_argument("--budget-min", type=float, default=25.0, metavar="MIN")
    parser.add_argument("--since", type=float, metavar="EPOCH",
                        help="when CI started (date +%%s): its whole time against the budget")
    parser.add_argument("--update", action="store_true",
                        help="refresh tests/durations.json from these durations")
    args = parser.parse_args(argv)
    try:
        record = json.loads(args.durations.read_text())
        entries = allow_list(args.allow)
        for line in report(record, entries, args.test_limit, args.budget_min * 60,
                           args.since):
            print(line)
        if args.update:
            print(update(record))
    except Exception as exc:  # the budget warns; it never fails CI
        print(f"suite budget: WARNING: no budget this time ({args.durations}: "
              f"{type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
