"""The suite's order (tests/support/order.py) and its time budget (bench/suite_budget.py):
longest first with each module together and in order; the budget names what is over
and never fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import order

ROOT = Path(__file__).resolve().parents[2]
BUDGET = ROOT / "bench" / "suite_budget.py"

IDS = ["tests/unit/test_a.py::one", "tests/integration/test_i.py::x",
       "tests/integration/test_i.py::y", "tests/deploy/images/test_c.py::c",
       "tests/deploy/test_p.py::p1", "tests/unit/test_a.py::two", "tests/deploy/test_q.py::q",
       "tests/system/test_j.py::j", "tests/unit/test_b.py::b"]


def test_units_run_longest_first_each_together_and_in_order():
    seconds = {"deploy": 900.0, "tests/integration/test_i.py": 300.0, "system": 500.0,
               "tests/unit/test_b.py": 1.0}
    ran = [IDS[i] for i in order.order(IDS, seconds)]
    assert ran == ["tests/deploy/test_p.py::p1", "tests/deploy/test_q.py::q",
                   "tests/system/test_j.py::j", "tests/integration/test_i.py::x",
                   "tests/integration/test_i.py::y", "tests/unit/test_b.py::b",
                   # unknown: after the known ones, in collection order, together
                   "tests/unit/test_a.py::one", "tests/unit/test_a.py::two",
                   "tests/deploy/images/test_c.py::c"]
    assert [IDS[i] for i in order.order(IDS, {})] == sorted(
        IDS, key=lambda n: [order.unit(m) for m in IDS].index(order.unit(n)))


def test_groups_keep_what_shares_a_stack_on_one_worker():
    assert {order.group(n) for n in IDS[3:5] + IDS[6:8]} == {"deploy/images", "deploy",
                                                              "system"}
    assert order.group("tests/integration/test_i.py::x") == "tests/integration/test_i.py::x"
    for module in order.MODULE_GROUPS:
        assert order.group(f"{module}::a") == order.group(f"{module}::b") == module
    assert order.group("tests/unit/test_a.py::one") == "tests/unit/test_a.py"


def test_the_committed_durations_and_allow_list_name_real_tests():
    units = order.known_seconds()
    assert units, "tests/durations.json is missing or unreadable"
    for name in units:
        assert (ROOT / "tests" / name).exists() or (ROOT / name).exists(), name
    for line in (ROOT / "bench" / "suite_budget_allow.txt").read_text().splitlines():
        pattern, _, reason = line.partition("#")
        if pattern.strip():
            assert reason.strip(), line  # every entry says why
            assert (ROOT / pattern.strip().split("::")[0]).exists(), line


def _budget(tmp_path: Path, tests: dict[str, float], wall: float) -> subprocess.CompletedProcess:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"wall_s": wall, "workers": 2, "exitstatus": 0,
                                "finished": 0, "tests": tests}))
    return subprocess.run([sys.executable, BUDGET, "--durations", path], capture_output=True,
                          text=True, timeout=60)


def test_the_budget_names_slow_tests_not_allowed_and_the_wall_and_never_fails(tmp_path):
    allowed = "tests/system/test_people_in_the_loop.py::test_approval_rejection_timeout_and_alerts"
    proc = _budget(tmp_path, {"tests/integration/test_i.py::slow": 150.0, allowed: 280.0,
                              "tests/unit/test_a.py::quick": 1.0}, wall=1600.0)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stdout.splitlines() if "WARNING" in line]
    assert len(warned) == 2, proc.stdout
    assert "150 s over the 120 s" in warned[0] and "test_i.py::slow" in warned[0]
    assert "26.7 min" in warned[1] and "OVER the budget of 25.0 min" in warned[1]
    assert f"allowed: 280 s {allowed} (waits out" in proc.stdout

    proc = _budget(tmp_path, {"tests/unit/test_a.py::quick": 1.0}, wall=900.0)
    assert (proc.returncode, "WARNING" in proc.stdout) == (0, False), proc.stdout
    assert "within the budget" in proc.stdout

    missing = subprocess.run([sys.executable, BUDGET, "--durations", tmp_path / "none.json"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 0 and "no budget this time" in missing.stdout
