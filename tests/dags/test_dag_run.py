"""The whole DAG end-to-end with ``dag.test()``: digits, the store on a local S3 server
over HTTP, credentials from the ``aws_default`` connection."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow


def _states_and_xcoms(run_id: str) -> tuple[dict, dict]:
    from airflow.models import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.run_id == run_id).all()
        xcoms = session.query(XComModel).filter(XComModel.run_id == run_id).all()
        return ({ti.task_id: str(ti.state) for ti in tis},
                {(x.task_id, x.key): x.value for x in xcoms})


def _rendered(run_id: str) -> str:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.utils.session import create_session

    with create_session() as session:
        return " ".join(str(r.rendered_fields) for r in
                        session.query(RTIF).filter(RTIF.run_id == run_id).all())


def _run_count() -> int:
    from airflow.models import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(DagRun).filter(DagRun.dag_id == "keras_retrain").count()


@pytest.fixture
def dag(airflow_db, s3_server, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    bucket = s3_server.create_bucket()
    monkeypatch.setenv("TRAINING_STORE_URI", f"s3://{bucket}/team")
    # The team's keys: the server refuses any other secret.
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(s3_server.connection()))
    return DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags["keras_retrain"]


def test_first_run_promotes_second_records_why_not_invalid_conf_never_runs(
        dag, s3_server, capfd, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import ParamValidationError
    from support.config_checks import FieldChecks

    from training.config import frozen
    from training.registry import open_store
    from training.registry.versions import ModelRegistry
    from training_airflow.store import s3_options

    conf = {"epochs": 3, "min_accuracy": 0.5, "model_name": "e2e"}
    epochs_checks = FieldChecks("fit.epochs", tmp_path, monkeypatch)
    first = dag.test(run_conf=conf)
    states, xcoms = _states_and_xcoms(first.run_id)
    assert str(first.state) == "success"
    assert states.pop("trial") == "skipped", states  # no sweep: no trial to map
    assert set(states.values()) == {"success"}, states
    # `epochs` from the form to model.fit: checked once, by the first task, in this
    # process (the five after it thaw the frozen config), and once in each training
    # process it enters (`train`'s child, which also evaluates).
    checks = epochs_checks.per_process()
    assert checks[str(os.getpid())] == 1, checks
    assert len(checks) >= 2 and set(checks.values()) == {1}, checks
    handed = xcoms[("stage_dataset", "config")]
    assert frozen.thaw(handed).fit.epochs == 3
    published = xcoms[("publish", "return_value")]
    version = published["version"]
    assert published["store_uri"] == os.environ["TRAINING_STORE_URI"]

    store_uri = os.environ["TRAINING_STORE_URI"]
    registry = ModelRegistry(open_store(store_uri, s3_options(store_uri, "aws_default")))
    assert registry.production("e2e") == version
    registry.verify("e2e", version)

    # The same data and settings again: nothing new, the run skips training and says why.
    same = dag.test(run_conf=conf)
    states, xcoms = _states_and_xcoms(same.run_id)
    assert str(same.state) == "success"
    assert states["validate_data"] == "skipped" and states["train"] == "skipped", states
    assert {states[t] for t in ("evaluate", "publish", "promote")} == {"skipped"}, states
    assert xcoms[("validate_data", "skipped_because")].startswith(
        f"nothing new: production (e2e {version}) was trained on this data")

    # Forced, a second run must beat the first by 50 points: it cannot, so promote is
    # skipped.
    second = dag.test(run_conf={**conf, "min_improvement": 0.5, "force_train": True})
    states, xcoms = _states_and_xcoms(second.run_id)
    assert str(second.state) == "success"
    assert states["promote"] == "skipped" and states["publish"] == "success", states
    decision = xcoms[("evaluate", "return_value")]["decision"]
    assert decision["promote"] is False
    assert any(f"over champion {version}" in r and "< required +0.5000" in r
               for r in decision["reasons"]), decision
    assert registry.production("e2e") == version
    new_version = xcoms[("publish", "return_value")]["version"]
    stored = json.loads(open_store(store_uri, s3_options(store_uri, "aws_default")).get_bytes(
        f"models/e2e/versions/{new_version}/evaluation.json"))
    assert stored["decision"] == decision

    # An invalid conf is refused before a run exists.
    runs = _run_count()
    with pytest.raises(ParamValidationError, match="epochs"):
        dag.test(run_conf={**conf, "epochs": 0})
    assert _run_count() == runs

    # The connection's secret never reaches logs, XCom or rendered fields.
    secret = s3_server.team.secret_key
    out, err = capfd.readouterr()
    assert "Epoch 1/3" in out + err  # the training subprocess streamed into the task log
    for run in (first, second):
        _, run_xcoms = _states_and_xcoms(run.run_id)
        assert secret not in json.dumps(list(run_xcoms.values()), default=str)
        assert secret not in _rendered(run.run_id)
    assert secret not in out + err


def test_an_undeclared_conf_key_fails_the_run_at_once_without_retries(dag):
    # Airflow 3.3 lets conf keys the form does not declare through to the run; the first
    # task refuses them and fails without retrying (a retry cannot fix a conf).
    run = dag.test(run_conf={"epochz": 3})
    states, _ = _states_and_xcoms(run.run_id)
    assert str(run.state) == "failed"
    assert states["stage_dataset"] == "failed", states
    assert states["validate_data"] == "upstream_failed", states
    # train runs after the trials however they ended (all_done), and skips itself when
    # validate_data did not pass; evaluate, below the failed stage_dataset, never runs.
    assert states["train"] == "skipped", states
    assert states["evaluate"] == "upstream_failed", states


def test_a_configuration_error_in_train_fails_at_once_with_the_childs_error_line(dag, capfd):
    # Valid for the form, refused by the training process on this machine (no GPUs):
    # exit 2, so the task fails on its first try instead of retrying with backoff, and
    # its failure is the child's one `error:` line.
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    run = dag.test(run_conf={"num_gpus": 2, "strategy": "mirrored", "epochs": 1})
    states, _ = _states_and_xcoms(run.run_id)
    assert str(run.state) == "failed"
    assert states["stage_dataset"] == "success" and states["train"] == "failed", states
    with create_session() as session:
        train = session.query(TaskInstance).filter(TaskInstance.run_id == run.run_id,
                                                   TaskInstance.task_id == "train").one()
        assert train.try_number == 1
    out, err = capfd.readouterr()
    expected = ("training refused its configuration (exit 2, not retried): "
                "runtime.num_gpus asks for 2 GPUs but 0 are visible")
    assert expected in out + err
    # The CUDA probing of TensorFlow on a CPU-only host does not reach the task log.
    assert "cuInit" not in out + err and "Could not find cuda drivers" not in out + err


def test_a_module_function_model_trains_publishes_and_promotes_through_the_dag(
        dag, monkeypatch):
    # A team's model by reference, on PYTHONPATH, with no model_name: the default name
    # '<dataset>-<model>' holds the reference's ':', and must still be a valid name.
    from pathlib import Path

    example = str(Path(__file__).resolve().parents[2] / "examples" / "tiny_model")
    monkeypatch.syspath_prepend(example)  # this process checks the config (stage_dataset)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [example, os.environ.get("PYTHONPATH", "")])))  # train's child
    run = dag.test(run_conf={"model": "tiny_model:tiny_convnet", "model_args": {"filters": 2},
                             "epochs": 1, "min_accuracy": 0})
    states, xcoms = _states_and_xcoms(run.run_id)
    assert str(run.state) == "success", states
    assert states.pop("trial") == "skipped", states  # no sweep: no trial to map
    assert set(states.values()) == {"success"}, states
    published = xcoms[("publish", "return_value")]
    assert published["model_name"] == "digits-tiny_model-tiny_convnet"
    assert xcoms[("promote", "return_value")]["promoted"] is True
