"""Deployment: a wrong setting stops ``./dev stack`` at start, in one line that names it.

Each case starts ``./dev stack`` in the deployment tests' fresh copy, in a stack
directory of its own (``TRAINING_STACK_DIR``) on ports of its own, with one setting
overridden in the environment the way an operator's shell or deployment tool sets it:
a store secret the S3 server does not know, a database nobody listens on, a broker
password Redis refuses. The port comes from ``AIRFLOW__API__PORT`` (no ``--port``): the
environment moves the whole stack. Expected: exit 1, one ``error:`` line naming the
setting, no traceback, no secret, and nothing of that stack left running.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.fresh import new_user_env
from support.prodstack import processes

from tools.services import free_port_block, port_is_free
from tools.stack import SECRETS, SPAN

pytestmark = pytest.mark.slow
WRONG = "not-the-secret-0123456789"


def secrets_file(directory: Path) -> dict[str, str]:
    """Known secrets for the stack in ``directory`` (it keeps what it finds)."""
    values = {name: f"{name.lower().replace('_', '-')}-x1" for name in SECRETS}
    values["AIRFLOW_FERNET_KEY"] = "8vJ8c9Xr0ZQ2sFZbqk4x4p3hN3QeWkz8qv0o1G2m3nA="
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "secrets.env").write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return values


def wrong_store(port: int, keys: dict[str, str]) -> tuple[str, str]:
    return "AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": keys["STORE_ACCESS_KEY"], "password": WRONG,
        "extra": {"endpoint_url": f"http://127.0.0.1:{port + 6}", "region_name": "us-east-1"}})


def unreachable_database(port: int, keys: dict[str, str]) -> tuple[str, str]:
    closed = free_port_block(1, start=port + SPAN + 100)
    return ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            f"postgresql+psycopg2://airflow:{WRONG}@127.0.0.1:{closed}/airflow")


def refused_broker(port: int, keys: dict[str, str]) -> tuple[str, str]:
    return "AIRFLOW__CELERY__BROKER_URL", f"redis://:{WRONG}@127.0.0.1:{port + 5}/0"


@pytest.mark.parametrize(("override", "words"), [
    (wrong_store, "refused to list s3://models/registry with the key 'store-access-key-x1': "
                  "SignatureDoesNotMatch"),
    (unreachable_database, "cannot connect to postgresql+psycopg2://airflow:***@127.0.0.1:"),
    (refused_broker, "refused the password"),
], ids=["store-secret", "database", "broker"])
def test_a_wrong_setting_stops_the_stack_in_one_line(production_stack: Any,
                                                      tmp_path: Path, override, words):
    directory = tmp_path / "stack"
    keys = secrets_file(directory)
    port = free_port_block(SPAN)
    setting, value = override(port, keys)
    env = {**new_user_env(), "AIRFLOW__API__PORT": str(port),
           "TRAINING_STACK_DIR": str(directory), setting: value}
    done = subprocess.run(["./dev", "stack"], cwd=production_stack.root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {setting}: "), done.stderr
    assert words in errors[0], errors[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert WRONG not in done.stdout + done.stderr
    assert f"127.0.0.1:{port + 4}/airflow answers" in done.stdout or setting.startswith(
        "AIRFLOW__DATABASE"), done.stdout  # the environment's port moved the database too
    left = [cmd for cmd in processes().values() if str(directory) in cmd]
    assert left == [], left
    assert all(port_is_free(port + offset) for offset in range(SPAN))
