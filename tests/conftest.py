"""Shared fixtures: one staged copy of ``digits``, one trained run, one S3 server and
one Airflow home (SQLite) per test session.

TensorFlow is configured once, before anything initialises it: two logical CPU devices,
so MirroredStrategy can be exercised for real on a CPU-only machine. Airflow reads its
configuration when first imported, so its environment is set here, at collection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import order
from support.s3server import S3Server

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_HOME = tempfile.mkdtemp(prefix="airflow-home-")
AIRFLOW_ENV = {
    "AIRFLOW_HOME": AIRFLOW_HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": os.fspath(ROOT / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": os.fspath(ROOT / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
    "TRAINING_DATA_DIR": os.fspath(Path(AIRFLOW_HOME) / "training"),
    # No DeadlineAlert: Airflow 3.3.2's dag.test() fails on the DAG's first successful
    # run when it has one (docs/alerts.md); the deadline is tested on ./dev airflow.
    "TRAINING_DEADLINE_MINUTES": "",
}
os.environ.update(AIRFLOW_ENV)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config: pytest.Config) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )


@pytest.fixture(scope="session")
def staging_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.fspath(tmp_path_factory.mktemp("datasets"))


@pytest.fixture(scope="session")
def staged_digits(staging_dir: str):
    from training.config import DatasetConfig
    from training.data.snapshot import staging

    return staging.stage(DatasetConfig(staging_dir=staging_dir))


@pytest.fixture(scope="session")
def trained_run(staged_digits, tmp_path_factory: pytest.TempPathFactory):
    """The seed's mlp trained briefly on digits (one device), with its config."""
    from training.config import RunConfig
    from training.train.fit import train

    cfg = RunConfig.from_flat({
        "staging_dir": staged_digits.staging_dir,
        "output_dir": os.fspath(tmp_path_factory.mktemp("runs")),
        "epochs": 6,
        "strategy": "one_device",
    })
    return cfg, train(cfg, staged_digits)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 server (SeaweedFS) on 127.0.0.1 for the whole session (per xdist worker);
    each test takes a fresh bucket of it (``create_bucket``)."""
    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """The session's Airflow metadata database (SQLite), migrated once."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True,
                   capture_output=True, env={**os.environ, **AIRFLOW_ENV})
    return AIRFLOW_HOME


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``./dev test``'s two pytest-xdist workers get whole groups (``support.order.group``:
    system, deploy, deploy/images, an integration test, else a module), each run on one
    worker, in order. (xdist's own ``loadgroup`` marks do nothing with pytest 9: it
    renames ``item._nodeid``, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return order.group(nodeid)

    # In collection order (pytest_collection_modifyitems puts the longest first), not
    # xdist's default of the groups with the most tests first: those are quick ones.
    config.option.loadscopereorder = False
    return ByGroup(config, log)


DAG_CHECKS_JOURNEY = ("tests/journeys/test_readme_commands.py::"
                      "test_the_dag_checks_a_team_puts_in_its_ci")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest first (``support.order``: modules and the wide groups by their seconds
    in ``tests/durations.json``, each one's tests together and in their order), so that
    no long one starts last and the two workers end together.

    When the DAG-checks journey is selected, the fast ``tests/dags`` tests are not run a
    second time in this session: that journey runs exactly them (the README's ``./dev test
    tests/dags -m "not slow" -n 0``) from a fresh clone, as a team's CI does, and fails
    with their output when one fails. (This runs last: under ``-m "not slow"`` the
    journey is gone by then, and the ``tests/dags`` tests run here.)"""
    if any(item.nodeid == DAG_CHECKS_JOURNEY for item in items):
        twice = [item for item in items if item.nodeid.startswith("tests/dags/")
                 and item.get_closest_marker("slow") is None]
        if twice:
            config.hook.pytest_deselected(items=twice)
            items[:] = [item for item in items if item not in twice]
    ranked = order.order([item.nodeid for item in items], order.known_seconds())
    items[:] = [items[index] for index in ranked]


# Every test's seconds (setup + call + teardown) and the session's wall time, written by
# the run that reports them (the xdist controller, or the one process with -n 0) to
# $TEST_DURATIONS_FILE, else <root>/artifacts/test-durations.json: bench/suite_budget.py reads
# them (the budget) and refreshes tests/durations.json from them (the order).
_SECONDS: dict[str, float] = {}
_STARTED = time.monotonic()  # this file is read first: TensorFlow's import counts too


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput") or not _SECONDS:
        return  # an xdist worker: its controller saw the same reports and writes them
    # Under this run's own root: a run inside a clone (a journey's) writes the clone's.
    path = Path(os.environ.get("TEST_DURATIONS_FILE")
                or session.config.rootpath / "artifacts" / "test-durations.json")
    record = {"wall_s": round(time.monotonic() - _STARTED, 1),
              "workers": session.config.getoption("numprocesses", None) or 0,
              "exitstatus": int(exitstatus), "finished": time.time(),
              "args": list(session.config.invocation_params.args),
              "tests": {k: round(v, 2) for k, v in _SECONDS.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:  # the durations never fail the run
        print(f"\nnote: test durations not written to {path}: {exc}", file=sys.stderr)
