"""Journeys: the README's ``./dev`` commands, run exactly as written, from a fresh clone.

One copy of the tree as a clone of it would be (``support/fresh.py``), one environment
as a new user's shell has it, and each command typed as the README types it. ``./dev
airflow`` is walked in a browser by ``tests/system/test_journey.py``; ``./dev test`` is
what CI runs around all of this. A README that gains a ``./dev`` command without a test
here fails ``test_every_dev_command_of_the_readme_is_run_here``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from support.fresh import REPO, fresh_copy, new_user_env

pytestmark = pytest.mark.slow

DEMO = "./dev demo"
DEMO_WITH_CONF = """./dev demo '{"model": "cnn", "epochs": 3}'"""
CLI_HELP = "./dev cli run --help"
DAG_CHECKS = './dev test tests/dags -m "not slow"'
TENSORBOARD = ".venv/bin/tensorboard --logdir var/store/models/digits-mlp/versions --port 6006"
# Run elsewhere: ./dev test is CI itself; ./dev airflow is the system journey.
ELSEWHERE = {"./dev test", "./dev airflow"}


def readme_commands() -> set[str]:
    """Every command line in the README's bash blocks, without its comment."""
    commands = set()
    for block in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.add(line)
    return commands


def sh(clone: Path, command: str, timeout: float) -> subprocess.CompletedProcess:
    """``command`` as a person types it into a shell at the clone's root."""
    return subprocess.run(["bash", "-c", command], cwd=clone, env=new_user_env(),
                          capture_output=True, text=True, timeout=timeout)


def summary(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)  # the demo's last word: the run's summary, as JSON


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_copy(tmp_path_factory.mktemp("readme") / "clone")


def test_every_dev_command_of_the_readme_is_run_here():
    tested = {DEMO, DEMO_WITH_CONF, CLI_HELP, DAG_CHECKS, TENSORBOARD, *ELSEWHERE}
    written = {c for c in readme_commands() if c.startswith(("./dev", ".venv/bin/tensorboard"))}
    assert written <= tested, f"README commands no test runs: {sorted(written - tested)}"
    assert {DEMO, CLI_HELP, DAG_CHECKS, TENSORBOARD, *ELSEWHERE} <= written


def test_demo_runs_the_dag_end_to_end_then_again_against_the_first(clone: Path):
    first = summary(sh(clone, DEMO, timeout=900))
    assert first["state"] == "success", first
    assert set(first["tasks"].values()) == {"success"}, first
    assert first["promoted"] is True and first["champion"] is None, first
    assert first["metrics"]["accuracy"] >= 0.9, first
    assert first["store_uri"] == str(clone / "var" / "store")
    assert any("no model in production" in r for r in first["decision"]["reasons"]), first

    # "Run it again: nothing is new, so it skips training and says why."
    second = summary(sh(clone, DEMO, timeout=900))
    assert second["state"] == "success", second
    assert second["tasks"]["validate_data"] == "skipped", second
    assert second["tasks"]["train"] == "skipped" and second["published_version"] is None
    assert second["skipped_because"].startswith(
        f"nothing new: production (digits-mlp {first['published_version']}) was trained "
        "on this data"), second


def test_demo_with_a_conf_trains_what_it_says(clone: Path):
    done = summary(sh(clone, DEMO_WITH_CONF, timeout=900))
    assert done["state"] == "success", done
    assert done["model_name"] == "digits-cnn", done
    config = json.loads((clone / "var" / "store" / "models" / "digits-cnn" / "versions"
                         / done["published_version"] / "config.json").read_text())
    assert (config["model"]["name"], config["fit"]["epochs"]) == ("cnn", 3)


def test_cli_help_lists_the_config_flags(clone: Path):
    done = sh(clone, CLI_HELP, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for flag in ("--epochs", "--batch-size", "--strategy", "--model-name", "--config"):
        assert flag in done.stdout, flag


def test_the_dag_checks_a_team_puts_in_its_ci(clone: Path):
    done = sh(clone, DAG_CHECKS, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-2000:]


def test_tensorboard_serves_the_published_versions(clone: Path):
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 6006)) == 0:
            pytest.skip("port 6006 is taken on this machine")
    versions = sorted(p.name for p in
                      (clone / "var" / "store" / "models" / "digits-mlp" / "versions").iterdir())
    assert versions, "run the demo first (test order)"
    server = subprocess.Popen(["bash", "-c", f"exec {TENSORBOARD}"], cwd=clone,
                              env=new_user_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        runs, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen("http://127.0.0.1:6006/data/runs", timeout=5) as r:
                    runs = json.loads(r.read())
                if {f"{v}/tensorboard/train" for v in versions} <= set(runs):
                    break
            time.sleep(1.0)
        assert {f"{v}/tensorboard/train" for v in versions} <= set(runs), runs
        assert {f"{v}/tensorboard/validation" for v in versions} <= set(runs), runs
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
