"""Shared fixtures: one staged copy of ``digits``, one trained run, one S3 server and
one Airflow home (SQLite) per test session.

TensorFlow is configured once, before anything initialises it: two logical CPU devices,
so MirroredStrategy can be exercised for real on a CPU-only machine. Airflow reads its
configuration when first imported, so its environment is set here, at collection.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
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


LONGEST_FIRST = ("deploy/images", "deploy", "system", "tests/journeys/test_readme_commands.py")


def _group(nodeid: str) -> str:
    """A test's group: every system test is one group ("system"), every deployment test
    another ("deploy": they share one ``./dev stack``), every image test a third
    ("deploy/images": they share one engine and its images); an integration test is a group of
    its own (they share nothing wider than the session, and the long ones spread over
    both workers); any other test, its module (module fixtures, order)."""
    module = nodeid.split("::")[0]
    for folder in ("system", "deploy/images", "deploy"):
        if module.startswith(f"tests/{folder}/"):
            return folder
    return nodeid if module.startswith("tests/integration/") else module


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``./dev test``'s two pytest-xdist workers get whole groups (``_group``), each run
    on one worker, in order. (xdist's own ``loadgroup`` marks do nothing with pytest 9:
    it renames ``item._nodeid``, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    # In collection order (pytest_collection_modifyitems puts the longest first), not
    # xdist's default of the groups with the most tests first: those are quick ones.
    config.option.loadscopereorder = False
    return ByGroup(config, log)


DAG_CHECKS_JOURNEY = ("tests/journeys/test_readme_commands.py::"
                      "test_the_dag_checks_a_team_puts_in_its_ci")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The two longest groups (minutes each) first, so that they do not start last.

    When the DAG-checks journey is selected, the fast ``tests/dags`` tests are not run a
    second time in this session: that journey runs exactly them (the README's ``./dev test
    tests/dags -m "not slow" -n 0``) from a fresh clone, as a team's CI does, and fails
    with their output when one fails."""
    if any(item.nodeid == DAG_CHECKS_JOURNEY for item in items):
        twice = [item for item in items if item.nodeid.startswith("tests/dags/")
                 and item.get_closest_marker("slow") is None]
        if twice:
            config.hook.pytest_deselected(items=twice)
            items[:] = [item for item in items if item not in twice]
    items.sort(key=lambda item: LONGEST_FIRST.index(_group(item.nodeid))
               if _group(item.nodeid) in LONGEST_FIRST else len(LONGEST_FIRST))
