"""System: runs of ``keras_retrain`` triggered through the REST API of ``./dev airflow``.

The stack is ``./dev airflow`` from a fresh copy (``conftest.py``); the browser journey
is ``test_journey.py``. Here the same requests go over REST, as a script or CI would
send them: ``PATCH`` to unpause (the DAG starts paused), ``POST
/api/v2/dags/{dag_id}/dagRuns`` with a Bearer JWT, a conf and no logical date.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from training.registry import ModelRegistry
from training.storage import open_store

pytestmark = pytest.mark.slow

DAG_ID = "keras_retrain"
TASKS = ("stage_dataset", "train", "evaluate", "publish", "promote")
CONF = {"epochs": 3, "batch_size": 32, "min_accuracy": 0.5, "model_name": "system-test"}


@pytest.fixture(scope="module")
def airflow_stack(dev_airflow: Any) -> Any:
    dag = dev_airflow.request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    assert dag["is_paused"] is False, dag
    return dev_airflow


def trigger(stack: Any, conf: dict[str, Any]) -> tuple[int, Any]:
    """The trigger form's request: conf, no logical date, sent from the DAG's page."""
    return stack.call(
        "POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
        {"logical_date": None, "conf": conf, "note": "system test"},
        headers={"Referer": f"{stack.base_url}/dags/{DAG_ID}/trigger"},
    )


def run_count(stack: Any) -> int:
    return stack.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"]


def test_triggered_run_trains_publishes_and_promotes(airflow_stack: Any):
    stack = airflow_stack
    status, created = trigger(stack, CONF)
    assert status == 200, created
    run_id = created["dag_run_id"]
    assert created["conf"] == CONF
    assert created["logical_date"] is None
    assert created["run_type"] == "manual"

    run = stack.wait_for_run(run_id)
    states = stack.task_states(run_id)
    report = f"tasks: {states}\n{stack.diagnostics(run_id)}"
    assert run["state"] == "success", report
    assert states == {task: "success" for task in TASKS}, report

    # XCom carries a small summary of the published version, never the model.
    published = stack.xcom(run_id, "publish")
    assert isinstance(published, dict), published
    assert len(json.dumps(published)) < 2048, published
    assert set(published) == {"model_name", "version", "store_uri", "files", "metrics"}
    assert published["model_name"] == "system-test"
    assert published["store_uri"] == stack.store_uri
    assert set(published["metrics"]) == {"accuracy", "loss", "macro_f1"}
    assert published["metrics"]["accuracy"] >= CONF["min_accuracy"]
    version = published["version"]

    # The version is in the store the deployment names, complete and in production.
    registry = ModelRegistry(open_store(stack.store_uri))
    assert registry.production("system-test") == version
    manifest = registry.verify("system-test", version)
    assert manifest["metrics"] == published["metrics"]
    assert len(manifest["files"]) == published["files"]
    [promotion] = registry.history("system-test")
    assert promotion["to"] == version and promotion["from"] is None

    # The trained model used the run's conf, not the defaults.
    config = json.loads(registry.store.get_bytes(
        f"models/system-test/versions/{version}/config.json"))
    assert config["fit"]["epochs"] == 3
    assert config["fit"]["batch_size"] == 32
    assert config["promotion"]["min_accuracy"] == 0.5
    assert config["storage"]["model_name"] == "system-test"
    assert config["storage"]["run_id"] == version
    history = json.loads(registry.store.get_bytes(
        f"models/system-test/versions/{version}/history.json"))
    assert history["epochs"] == [1, 2, 3], history


@pytest.mark.parametrize("conf", [
    {"epochs": 0},
    {"model": "no-such-model"},
    {"batch_size": "big"},
], ids=["epochs-below-minimum", "unknown-model", "batch-size-not-integer"])
def test_invalid_conf_is_refused_before_a_run_exists(airflow_stack: Any, conf):
    stack = airflow_stack
    before = run_count(stack)
    status, answer = trigger(stack, conf)
    assert status == 400, answer
    key = next(iter(conf))
    assert key in json.dumps(answer), answer
    assert run_count(stack) == before
