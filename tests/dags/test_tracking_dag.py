"""Issue 46 through the DAG with ``dag.test()`` and a real ``mlflow server`` process:

- a ``keras_retrain`` run with a 3-trial sweep is one MLflow run (every task writes to
  it: stage's Airflow tags, the trials as its 3 children with their epochs, publish's
  version, promote's end), its version registered and ``champion`` on it;
- a second DAG run is a second MLflow run; a third, which ``validate_data`` skips (nothing
  new), is a third run, ended (FINISHED, ``pipeline.state`` skipped, with the reason);
  a fourth, whose ``validate_data`` refuses the data, ends FAILED with the task's error;
- ``promote_model`` (what the Models page's form triggers) moves ``champion`` on a
  rollback, and ``serving/<name>/`` gets the older model as its highest number.
"""

from __future__ import annotations

import json
import os

import pytest
from support.mlflow_fixture import mlflow_server as mlflow_server  # the fixture

pytestmark = pytest.mark.slow

NAME = "dag-tracked"
SPACE = {"fit.learning_rate": {"choices": [0.003, 0.01, 0.03]}}


@pytest.fixture
def dagbag(airflow_db, s3_server, monkeypatch, mlflow_server):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("TRAINING_STORE_URI", f"s3://{s3_server.create_bucket()}/team")
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(s3_server.connection()))
    monkeypatch.setenv("TRAINING_MLFLOW_TRACKING_URI", mlflow_server.url)
    from training.tracking import forget_tracker

    forget_tracker()  # this process's tracker: the server's
    yield DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    forget_tracker()


def test_a_dag_run_with_a_sweep_is_one_mlflow_run_and_promote_model_moves_champion(
        dagbag, mlflow_server, s3_server):
    import mlflow
    from airflow.dag_processing.dagbag import DagBag

    from training.registry import open_store
    from training.registry.serving import ServingLayout

    def parsed() -> object:
        """keras_retrain parsed again: a DAG object keeps a dag.test's conf in its
        params, so each later night runs on a DAG of its own."""
        return DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags["keras_retrain"]

    base = {"min_accuracy": 0, "model_name": NAME, "backup_interval_s": 0}
    first = dagbag.dags["keras_retrain"].test(run_conf={
        **base, "epochs": 2, "sweep_trials": 3, "sweep_parallel": 2, "sweep_sampler": "grid",
        "sweep_pruner": "none", "sweep_space": SPACE})
    assert str(first.state) == "success"
    second = parsed().test(run_conf={**base, "epochs": 1, "force_train": True,
                                     "force_promote": True})
    assert str(second.state) == "success"
    # A third night with nothing new: validate_data skips it, and its MLflow run ends.
    third = parsed().test(run_conf={**base, "epochs": 1})
    assert str(third.state) == "success"
    # A fourth whose validate_data refuses the data (a task failed for good): its MLflow
    # run ends FAILED, the task and its error the reason (tracking.on_task_failure).
    fourth = parsed().test(run_conf={**base, "epochs": 1, "force_train": True,
                                     "min_examples_per_class": 1_000_000})
    assert str(fourth.state) == "failed"

    client = mlflow.MlflowClient(tracking_uri=mlflow_server.url,
                                 registry_uri=mlflow_server.url)
    experiment = client.get_experiment_by_name(NAME)
    runs = client.search_runs([experiment.experiment_id], max_results=50)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    # One MLflow run per DAG run, whatever number of tasks wrote to it.
    assert sorted(r.data.tags["airflow.run_id"] for r in parents) == sorted(
        [first.run_id, second.run_id, third.run_id, fourth.run_id])
    refused = next(r for r in parents if r.data.tags["airflow.run_id"] == fourth.run_id)
    assert refused.info.status == "FAILED", refused.info  # not left RUNNING
    assert refused.data.tags["pipeline.state"] == "failed", refused.data.tags
    assert refused.data.tags["pipeline.reason"].startswith(
        "validate_data failed: ") and "1000000" in refused.data.tags[
        "pipeline.reason"], refused.data.tags
    skipped = next(r for r in parents if r.data.tags["airflow.run_id"] == third.run_id)
    assert skipped.info.status == "FINISHED", skipped.info  # not left RUNNING
    assert skipped.data.tags["pipeline.state"] == "skipped", skipped.data.tags
    assert "pipeline.reason" in skipped.data.tags and "published.version" not in \
        skipped.data.tags, skipped.data.tags
    night = next(r for r in parents if r.data.tags["airflow.run_id"] == first.run_id)
    assert night.data.tags["airflow.dag_id"] == "keras_retrain"
    assert night.data.tags["airflow.url"].endswith(
        f"/dags/keras_retrain/runs/{first.run_id}".replace(":", "%3A").replace("+", "%2B"))
    assert night.data.tags["data.fingerprint"]
    assert night.info.status == "FINISHED"
    assert night.data.params["sweep.trials"] == "3"
    other = next(r for r in parents if r.data.tags["airflow.run_id"] == second.run_id)
    assert other.data.params["sweep.trials"] == "0"
    assert other.data.tags["published.version"] == other.data.tags["pipeline.run_id"]
    assert [m.step for m in client.get_metric_history(other.info.run_id, "loss")] == [0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == night.info.run_id]
    assert len(children) == 3
    for child in children:
        assert [m.step for m in client.get_metric_history(child.info.run_id, "val_loss")] \
            == [0, 1]
        assert child.data.tags["pipeline.state"] == "complete"
    picked = night.data.tags["published.version"]
    assert picked.startswith(night.data.tags["pipeline.run_id"] + "-t")
    assert "test_accuracy" in night.data.metrics and "decision.promote" in night.data.tags
    # The second night is champion now; the Models page's form rolls back to the first.
    champion = client.get_model_version_by_alias(NAME, "champion")
    assert champion.tags["pipeline.version"] != picked
    rollback = dagbag.dags["promote_model"].test(run_conf={
        "model_name": NAME, "version": picked, "action": "rollback",
        "reason": "the second night is worse"})
    assert str(rollback.state) == "success"
    assert client.get_model_version_by_alias(NAME, "champion").tags[
        "pipeline.version"] == picked
    serving = ServingLayout(open_store(os.environ["TRAINING_STORE_URI"], s3_server.options()))
    assert serving.served(NAME) == 3
    assert serving.index(NAME)[-1] == {"number": 3, "version": picked}
