"""A sweep through the DAG with ``dag.test()``: one mapped ``trial`` task per trial, named
by its values, the best trial published and promoted, ``sweep.json`` with every trial;
a trial that fails is recorded and the sweep still publishes."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow

SPACE = {"fit.learning_rate": {"float": [1e-3, 3e-2], "log": True},
         "fit.batch_size": {"choices": [32, 64]}}


def _task_instances(run_id: str) -> list:
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.run_id == run_id).all()
        session.expunge_all()
        return tis


def _xcom(run_id: str, task_id: str, key: str = "return_value") -> object:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter(XComModel.run_id == run_id,
                                              XComModel.task_id == task_id,
                                              XComModel.key == key).first()
        return None if row is None else row.value


@pytest.fixture
def dag(airflow_db, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("TRAINING_STORE_URI", str(tmp_path / "store"))
    return DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags["keras_retrain"]


def test_a_sweep_of_four_trials_runs_as_mapped_tasks_and_its_best_is_published(dag, tmp_path):
    from training.registry import open_store
    from training.registry.versions import ModelRegistry

    conf = {"epochs": 2, "min_accuracy": 0, "model_name": "swept", "backup_interval_s": 0,
            "sweep_trials": 4, "sweep_parallel": 2, "sweep_sampler": "random",
            "sweep_pruner": "none", "sweep_space": SPACE, "sweep_seed": 3}
    run = dag.test(run_conf=conf)
    tis = _task_instances(run.run_id)
    states = {(t.task_id, t.map_index): str(t.state) for t in tis}
    assert str(run.state) == "success", states
    trials = sorted((t for t in tis if t.task_id == "trial"), key=lambda t: t.map_index)
    assert [t.map_index for t in trials] == [0, 1, 2, 3]
    assert {str(t.state) for t in trials} == {"success"}
    # Each instance is named by its values in the grid.
    for t in trials:
        assert t.rendered_map_index.startswith(f"t{t.map_index} batch_size="), \
            t.rendered_map_index
        assert " learning_rate=" in t.rendered_map_index
    picked = _xcom(run.run_id, "train")
    assert picked["run_id"].endswith(tuple(f"-t{i}" for i in range(4)))
    published = _xcom(run.run_id, "publish")
    assert published["version"] == picked["run_id"]
    registry = ModelRegistry(open_store(str(tmp_path / "store")))
    assert registry.production("swept") == picked["run_id"]
    sweep = json.loads(open_store(str(tmp_path / "store")).get_bytes(
        f"models/swept/versions/{picked['run_id']}/sweep.json"))
    assert [t["number"] for t in sweep["trials"]] == [0, 1, 2, 3]
    assert {t["state"] for t in sweep["trials"]} == {"complete"}
    assert sweep["counts"]["trials"] == 4
    best = sweep["best"]
    assert picked["run_id"].endswith(f"-t{best['number']}")
    # The best is the best: val_loss is minimised.
    assert best["value"] == min(t["value"] for t in sweep["trials"])
    # Its published config is the trial's: the searched values, no sweep.
    config = json.loads(open_store(str(tmp_path / "store")).get_bytes(
        f"models/swept/versions/{picked['run_id']}/config.json"))
    assert config["fit"]["learning_rate"] == best["params"]["fit.learning_rate"]
    assert config["fit"]["batch_size"] == best["params"]["fit.batch_size"]
    assert config["sweep"]["trials"] == 0


def test_a_run_without_a_sweep_plans_no_trial_and_trains_as_always(dag):
    run = dag.test(run_conf={"epochs": 1, "min_accuracy": 0, "model_name": "plain",
                             "backup_interval_s": 0})
    states = {(t.task_id, t.map_index): str(t.state) for t in _task_instances(run.run_id)}
    assert str(run.state) == "success", states
    assert _xcom(run.run_id, "plan_trials") == []
    assert states[("trial", -1)] == "skipped"
    assert states[("train", -1)] == "success"
    assert "picked_from_sweep" not in _xcom(run.run_id, "train")


def test_a_trial_whose_values_its_model_refuses_fails_alone_and_the_sweep_publishes(
        dag, tmp_path, monkeypatch):
    # support.sweep_models:dense builds with any dropout the config takes; Keras refuses
    # 1.5 when the trial's child builds it (exit 2): that trial fails without retries,
    # is recorded with its reason, and the other trial wins.
    from pathlib import Path

    from training.registry import open_store

    tests = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [tests, os.environ.get("PYTHONPATH", "")])))
    conf = {"epochs": 1, "min_accuracy": 0, "model_name": "refused", "backup_interval_s": 0,
            "model": "support.sweep_models:dense", "sweep_trials": 2, "sweep_parallel": 1,
            "sweep_sampler": "grid", "sweep_pruner": "none", "sweep_max_failed": 1,
            "sweep_space": {"model.args.dropout": {"choices": [0.1, 1.5]}}}
    run = dag.test(run_conf=conf)
    tis = _task_instances(run.run_id)
    trials = {t.map_index: t for t in tis if t.task_id == "trial"}
    states = {i: str(t.state) for i, t in trials.items()}
    assert {t.task_id: str(t.state) for t in tis if t.task_id in ("train", "publish")} == {
        "train": "success", "publish": "success"}, states
    assert sorted(states.values()) == ["failed", "success"], states
    refused = next(t for t in trials.values() if str(t.state) == "failed")
    assert refused.try_number == 1  # no retry: the same values would fail the same way
    assert "dropout=1.5" in refused.rendered_map_index
    picked = _xcom(run.run_id, "train")
    published = _xcom(run.run_id, "publish")
    assert published["version"] == picked["run_id"]
    sweep = json.loads(open_store(str(tmp_path / "store")).get_bytes(
        f"models/refused/versions/{picked['run_id']}/sweep.json"))
    failed = [t for t in sweep["trials"] if t["state"] == "failed"]
    assert [t["params"]["model.args.dropout"] for t in failed] == [1.5]
    assert "dropout" in failed[0]["error"].lower() or "rate" in failed[0]["error"].lower()
    assert sweep["counts"] == {"trials": 2, "complete": 1, "pruned": 0, "failed": 1,
                               "skipped": 0}


def test_a_sweep_with_more_failures_than_allowed_fails_train_naming_each_one(
        tmp_path, monkeypatch):
    # The pick as the ``train`` task runs it, on a study whose trials ended (one
    # completed, one failed): the task fails without retries, and its message is the
    # pick's line, the failed trial with its values and its reason.
    from airflow.sdk.exceptions import AirflowFailException

    from training.config import RunConfig
    from training.data.snapshot.staging import StagedDataset
    from training.steps import sweep
    from training.sweep import study
    from training_airflow.tasks import TrainOperator

    monkeypatch.delenv("TRAINING_SWEEP_STORAGE", raising=False)
    staged = {"name": "digits", "version": "1.0.0", "path": "/data/datasets/digits/1.0.0",
              "staging_dir": "/data/datasets", "fingerprint": "1" * 64}
    cfg = RunConfig.from_flat({
        "run_id": "strict", "output_dir": str(tmp_path / "runs"), "sweep_trials": 2,
        "sweep_sampler": "grid", "sweep_pruner": "none",
        "sweep_space": {"fit.learning_rate": {"choices": [0.003, 0.01]}}})
    opened = sweep.open_sweep(cfg, StagedDataset.from_dict(staged))
    study.plan(opened)
    good, bad = study.ask(opened, 0), study.ask(opened, 1)
    study.tell(good, "complete", value=0.2)
    study.tell(bad, "failed", reason="model 'mine' failed to build (ValueError: 13 units)")
    with pytest.raises(AirflowFailException) as failed:
        TrainOperator(task_id="train", staged=staged).work(cfg, {})
    rate = bad.params["fit.learning_rate"]
    assert str(failed.value) == (
        "the sweep of run strict is refused: 1 trial failed, more than sweep.max_failed (0) "
        "allows (2 trials: 1 complete, 0 pruned, 1 failed, 0 skipped); trial 1 "
        f"(fit.learning_rate={rate}) failed: model 'mine' failed to build (ValueError: 13 "
        "units)")
