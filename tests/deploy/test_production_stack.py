"""Deployment: the production configuration, started by ``./dev stack`` as the README says.

PostgreSQL, Redis, SeaweedFS and Airflow with the CeleryExecutor, two ``default`` workers
and a ``gpu`` worker, all real processes on 127.0.0.1 (``conftest.py``). The nightly DAG is
triggered from the UI's form in headless Chromium; where a run went, what it stored and
what the UI shows are read from the workers' own logs, a plain boto3 reader with the
store's key, and the browser. Then faults, each injected for real on that stack: two
triggers at once, the gpu worker killed with its tasks while ``train`` runs, PostgreSQL
killed mid-run, SeaweedFS killed while ``publish`` waits on it.

Screenshots go to ``$TEST_ARTIFACTS_DIR`` (default ``artifacts/``) as ``stack-*.png``.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from support.airflow_ui import dag_page, new_run, open_trigger_form, submit_button
from support.devstack import DAG_ID, artifacts_dir, quote
from support.mlflow_fixture import mlflow_s3_environment
from support.prodstack import MODEL, RUN_TIMEOUT_S

pytestmark = pytest.mark.slow


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(artifacts_dir() / f"stack-{name}.png"), full_page=True)


def test_a_gpu_run_from_the_form_trains_on_the_gpu_worker(production_stack: Any,
                                                           browser: Any):
    from playwright.sync_api import expect

    stack = production_stack
    page = dag_page(browser, stack)
    dialog = open_trigger_form(page)
    dialog.get_by_role("button", name="Hardware and distribution").click()
    shot(page, "01-form-hardware")
    field = dialog.locator("#element_accelerator")
    field.click()
    page.get_by_role("option", name="gpu", exact=True).click()
    shot(page, "02-form-accelerator-gpu")
    known = {r["dag_run_id"] for r in stack.runs()}
    submit_button(dialog).click()
    expect(dialog).to_be_hidden()
    run = new_run(stack, known)
    run_id = run["dag_run_id"]
    assert run["conf"]["accelerator"] == "gpu", run["conf"]
    assert stack.wait_end(run_id) == "success", stack.diagnostics(run_id)

    # train went to the gpu queue, and the gpu worker's own log says it ran it; every
    # other task ran on one of the default queue's workers.
    assert stack.task(run_id, "train")["queue"] == "gpu"
    assert stack.ran_on(run_id, "train") == {"worker-gpu"}
    for other in ("stage_dataset", "validate_data", "evaluate", "publish", "promote"):
        ran = stack.ran_on(run_id, other)
        assert len(ran) == 1 and ran <= stack.default_workers, (other, ran)

    # The version is in SeaweedFS, every object re-hashed by a plain boto3 reader, and it
    # is in production.
    version = stack.xcom(run_id, "publish")["version"]
    manifest = stack.rehash(version)
    assert manifest["source"] == {"dag_id": DAG_ID, "run_id": run_id}
    assert stack.production()["version"] == version

    # MLflow (the stack's server: PostgreSQL and SeaweedFS): the night is one run, no
    # secret of the stack in it, and a plain client loads the champion (issue 46).
    champion_in_mlflow(stack, run_id, version)

    # The Models page shows it.
    page.goto(f"{stack.base_url}/models/#{MODEL}/{version}")
    row = page.locator(f'tr.version[id="{MODEL}/{version}"]')
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("production")
    shot(page, "03-models-page")

    # The task logs are readable from the UI, from either worker.
    # (The log view draws the lines near its end: the step's closing timing line, and
    # for train the evaluation the training process printed last.)
    for task_id, words in (("train", '"test_accuracy": '),
                           ("evaluate", "verdict for digits-mlp")):
        page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{quote(run_id)}/tasks/{task_id}")
        expect(page.get_by_text(re.compile(r"timing: queued .*, work [\d.]+ s")).first) \
            .to_be_visible(timeout=60_000)
        expect(page.get_by_text(words).first).to_be_visible()
        shot(page, f"04-log-{task_id}")
    page.close()


def champion_in_mlflow(stack: Any, run_id: str, version: str) -> None:
    """The stack's MLflow server has the DAG run as one run, its version registered as
    ``champion``, no secret in a param or tag; a plain client (MLflow's own, the store's
    key) loads ``models:/digits-mlp@champion`` from the store and it answers with class
    probabilities (tests/integration/test_tracking.py compares them with the .keras
    model's)."""
    import json
    import os

    import mlflow
    import numpy as np

    from tools.stack import PORTS

    url = f"http://127.0.0.1:{stack.port + PORTS['mlflow']}"
    client = mlflow.MlflowClient(tracking_uri=url, registry_uri=url)
    experiment = client.get_experiment_by_name(MODEL)
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`airflow.run_id` = '{run_id}'")
    assert len(runs) == 1, runs
    assert runs[0].data.tags["published.version"] == version
    assert {"loss", "val_loss", "test_accuracy"} <= set(runs[0].data.metrics)
    text = json.dumps([runs[0].data.params, runs[0].data.tags])
    for name, secret in stack.secrets().items():
        assert secret not in text, name
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert champion.tags["pipeline.version"] == version
    assert champion.source == f"s3://models/registry/models/{MODEL}/versions/{version}"
    keys = stack.secrets()
    config = stack.stack_dir / "aws-config-reader"
    config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    with mlflow_s3_environment({"MLFLOW_TRACKING_URI": url,
                                "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{stack.port + 6}",
                                "AWS_ACCESS_KEY_ID": keys["STORE_ACCESS_KEY"],
                                "AWS_SECRET_ACCESS_KEY": keys["STORE_SECRET_KEY"],
                                "AWS_DEFAULT_REGION": "us-east-1",
                                "AWS_CONFIG_FILE": os.fspath(config)}):
        model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
        images = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 1), dtype=np.uint8)
        probabilities = np.asarray(model.predict(images))
    assert probabilities.shape == (4, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-4)


def test_two_triggers_at_the_same_moment_run_one_after_the_other(production_stack: Any):
    stack = production_stack
    before = stack.versions()
    run_ids: list[str] = []
    barrier = threading.Barrier(2)

    def fire() -> None:
        barrier.wait()
        run_ids.append(stack.trigger({"force_train": True, "epochs": 3}))

    threads = [threading.Thread(target=fire) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(run_ids) == 2
    most_running = 0
    deadline = time.monotonic() + 2 * RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        states = [stack.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(r)}")["state"]
                  for r in run_ids]
        most_running = max(most_running, states.count("running"))
        if all(s in ("success", "failed") for s in states):
            break
        time.sleep(1.0)
    assert states == ["success", "success"], (states, stack.diagnostics())
    assert most_running == 1  # max_active_runs=1 held on the real scheduler
    published = {stack.xcom(r, "publish")["version"] for r in run_ids}
    assert stack.versions() - before == published and len(published) == 2
    history = stack.production()["history"]
    promoted = [entry["to"] for entry in history]
    assert len(promoted) == len(set(promoted)), history  # nothing promoted twice
