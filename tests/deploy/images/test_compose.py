"""Deployment: docker/compose.yaml comes up under a real Compose and runs the nightly DAG.

Why: the compose file is what a team deploys, and nothing short of a Compose
implementation and an engine shows that it starts (issue 24). docker-compose 1.29.2 (the
v1 tool, from ``tools/compose-requirements.txt``) brings up compose.yaml with
docker/compose.local.yaml on top (``support/compose.py``): the project's Airflow image
built from docker/Dockerfile (the ``images`` fixture) for Airflow and MLflow's server,
PostgreSQL, Redis and SeaweedFS from images built here from Debian's packages. Once
every service is healthy, one run of ``keras_retrain`` is triggered through the REST API
with a small conf (digits, three epochs); it must succeed on the Celery worker, its
version must be in SeaweedFS (every object re-hashed by a plain boto3 reader with the
store's key), and the api-server must serve the Models page with it. The stack's own
``mlflow server`` (the ``mlflow`` service, the Airflow services' default tracking URI)
must then hold, read over its REST API on the published port: one MLflow run for the
DAG run (tagged ``pipeline.run_id``, FINISHED, ``loss`` logged at each of the three
epochs, no secret of the stack in a param or tag, its report uploaded through the server
into SeaweedFS), the registered model's ``champion`` on that run's version, and its
store the PostgreSQL database ``mlflow`` with MLflow's tables. The project is removed at
the end, failed or not.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from support.compose import (
    SERVICE_PACKAGES,
    ComposeStack,
    build_local_images,
    describe,
    running,
)
from support.devstack import DAG_ID
from support.prodstack import MODEL, rehash

from tools.images import bootstrap_base

pytestmark = pytest.mark.slow

RUN_CONF = {"epochs": 3, "min_accuracy": 0.5}  # digits, as tests/dags/test_dag_run.py


@pytest.fixture
def compose_stack(images: Any, tmp_path: Path):
    base = bootstrap_base(images.engine, SERVICE_PACKAGES,
                          name="airflow-keras-training-local/base")
    build_local_images(images.docker, base)
    stack = ComposeStack(tmp_path, images.docker, images.env, images.airflow)
    with running(stack):
        yield stack


def test_the_compose_stack_runs_the_nightly_dag_and_serves_the_models_page(compose_stack):
    stack = compose_stack
    print(f"\ncompose: up {stack.timings['up']:.0f} s, every service healthy after "
          f"{stack.timings['healthy']:.0f} s: {describe(stack.states())}")
    assert stack.request("GET", "/api/v2/version")["version"].startswith("3.")

    stack.request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    started = time.monotonic()
    run_id = stack.request("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                           {"logical_date": None, "conf": RUN_CONF})["dag_run_id"]
    run = stack.wait_for_run(run_id, timeout=900.0)
    print(f"compose: {DAG_ID} run {run['state']} in {time.monotonic() - started:.0f} s")
    assert run["state"] == "success", (stack.task_states(run_id), stack.diagnostics(run_id))
    states = stack.task_states(run_id)  # a sweep's `trial` mapped over nothing: skipped
    assert states.pop("trial") == "skipped" and set(states.values()) == {"success"}, states

    # The version is in SeaweedFS, whole, and in production.
    version = stack.xcom(run_id, "publish")["version"]
    manifest = rehash(stack.s3(), version)
    assert manifest["source"] == {"dag_id": DAG_ID, "run_id": run_id}
    production = stack.s3().get_object(Bucket="models",
                                       Key=f"registry/models/{MODEL}/production.json")
    assert json.loads(production["Body"].read())["version"] == version

    # The api-server serves the Models page (the plugin's app) with that version on it;
    # without a login it refuses.
    status, page = stack.call("GET", "/models/", headers={"Accept": "text/html"})
    assert status == 200, page
    assert MODEL in page and version in page
    assert stack.call("GET", "/models/", auth=False)[0] == 401

    tracked_in_mlflow(stack, run_id, version)


def tracked_in_mlflow(stack: ComposeStack, run_id: str, version: str) -> None:
    """The ``mlflow`` service's view of the run (module doc), over its REST API."""
    experiment = stack.mlflow("experiments/get-by-name",
                              {"experiment_name": MODEL})["experiment"]
    runs = stack.mlflow("runs/search", body={"experiment_ids": [experiment["experiment_id"]],
                                             "max_results": 50}).get("runs", [])
    tagged = [r for r in runs if {"key": "pipeline.run_id", "value": version}
              in r["data"].get("tags", [])]
    assert len(runs) == len(tagged) == 1, runs  # every task wrote to the same run
    info, data = tagged[0]["info"], tagged[0]["data"]
    tags = {t["key"]: t["value"] for t in data.get("tags", [])}
    params = {p["key"]: p["value"] for p in data.get("params", [])}
    assert info["status"] == "FINISHED", info
    assert tags["airflow.run_id"] == run_id and tags["published.version"] == version, tags
    assert tags["pipeline.state"] == "complete", tags
    assert params["fit.epochs"] == "3", params
    history = stack.mlflow("metrics/get-history", {"run_id": info["run_id"],
                                                   "metric_key": "loss"})["metrics"]
    assert sorted(m["step"] for m in history) == [0, 1, 2], history
    assert "test_accuracy" in {m["key"] for m in data.get("metrics", [])}, data
    secrets = {k: v for k, v in stack.values.items()
               if re.search(r"PASSWORD|SECRET|_KEY$|FERNET", k)}
    assert {"POSTGRES_PASSWORD", "STORE_SECRET_KEY", "S3_ADMIN_SECRET_KEY"} <= set(secrets)
    written = json.dumps([params, tags])
    assert [k for k, v in secrets.items() if v in written] == []

    # The registry mirrored: champion is this run's version, its source the store's folder.
    champion = stack.mlflow("registered-models/alias",
                            {"name": MODEL, "alias": "champion"})["model_version"]
    assert champion["run_id"] == info["run_id"], champion
    assert {"key": "pipeline.version", "value": version} in champion.get("tags", [])
    assert champion["source"] == f"s3://models/registry/models/{MODEL}/versions/{version}"

    # Artifacts proxied by the server into SeaweedFS (s3://models/mlflow/...).
    prefix = "mlflow/" + info["artifact_uri"].removeprefix("mlflow-artifacts:/").strip("/")
    listed = stack.s3().list_objects_v2(Bucket="models", Prefix=f"{prefix}/report/")
    assert listed.get("KeyCount", 0) > 0, (info["artifact_uri"], listed)

    # Its backend store is PostgreSQL: the database mlflow with MLflow's tables, this run.
    tables = set(stack.psql("mlflow", "SELECT tablename FROM pg_tables "
                                      "WHERE schemaname = 'public'"))
    assert {"alembic_version", "experiments", "runs", "metrics", "params",
            "registered_models", "model_versions"} <= tables, tables
    assert stack.psql("mlflow", f"SELECT status FROM runs WHERE run_uuid = "
                                f"'{info['run_id']}'") == ["FINISHED"]
