"""DAG integrity: what a team's CI runs on every change (fast, no training).

Run just these with ``.venv/bin/python -m pytest tests/dags -m "not slow"``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import pytest

from training.config import RunConfig, flat_fields, json_schema

HEAVY = ("tensorflow", "keras", "tensorflow_datasets", "boto3")
EXPECTED_GRAPH = {
    "stage_dataset": {"validate_data", "plan_trials", "trial", "train", "evaluate"},
    "validate_data": {"plan_trials", "train", "evaluate"},
    "plan_trials": {"trial"},  # a sweep's: one mapped trial per slot (none without one)
    "trial": {"train"},
    "train": {"evaluate"},
    "evaluate": {"publish", "approve_promotion"},
    "publish": {"approve_promotion", "promote"},
    "approve_promotion": {"promote"},
    "promote": set(),
}
# Tasks a person answers or asks for: a retry would ask again, or repeat a request that
# was refused for its content; the approval's wait is bounded by its response_timeout.
NOT_RETRIED = {("keras_retrain", "approve_promotion"),
               ("promote_model", "move_production_pointer")}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])


@pytest.fixture(scope="module")
def dag(dagbag):
    return dagbag.dags["keras_retrain"]


def test_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "keras_retrain" in dagbag.dags


def test_parsing_imports_no_heavy_module_in_a_fresh_interpreter():
    code = (
        "import json, os, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "bag = DagBag(os.environ['AIRFLOW__CORE__DAGS_FOLDER'])\n"
        f"print(json.dumps({{'errors': list(bag.import_errors), 'dags': list(bag.dags),"
        f" 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=os.environ, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["errors"], result["heavy"]) == ([], [])
    assert sorted(result["dags"]) == ["keras_retrain", "land_labelled_data", "promote_model"]


def test_every_dag_follows_the_house_rules(dagbag):
    for dag in dagbag.dags.values():
        assert dag.catchup is False, dag.dag_id
        assert dag.max_active_runs == 1, dag.dag_id
        assert dag.tags, dag.dag_id
        assert dag.doc_md, dag.dag_id
        for task in dag.tasks:
            assert task.owner and task.owner != "airflow", task.task_id
            if (dag.dag_id, task.task_id) in NOT_RETRIED:
                assert task.retries == 0, task.task_id
                continue
            assert task.retries >= 1, task.task_id
            assert task.retry_exponential_backoff > 1, task.task_id
            # TRAINING_RETRY_DELAY_SECONDS unset: a minute (the next test sets it)
            assert task.retry_delay == timedelta(minutes=1), task.task_id
            assert isinstance(task.execution_timeout, timedelta), task.task_id


def test_task_graph(dag):
    assert {t.task_id: set(t.downstream_task_ids) for t in dag.tasks} == EXPECTED_GRAPH
    # The trials: as many at once as a sweep may ask (its own sweep.parallel holds the
    # rest back), named in the grid by their values; train picks after all of them.
    trial = dag.get_task("trial")
    assert trial.max_active_tis_per_dagrun == 64
    assert trial.map_index_template == "{{ trial_label }}"
    assert dag.get_task("train").trigger_rule == "all_done"
    assert [o.name for o in dag.get_task("promote").outlets] == ["training_production_model"]
    assert [o.name for o in dag.get_task("stage_dataset").outlets] == ["training_staged_dataset"]


def test_schedule_is_nightly_by_default_or_on_landed_data(dag):
    assert dag.timetable.timetable.expression == "0 3 * * *"  # AssetOrTimeSchedule


def test_schedule_and_retry_delay_are_overridable_and_a_wrong_store_does_not_break_parsing():
    """The DAG files read only their own variables: a typo in the store URI or the size
    limit fails the first task that needs them (next test), never the parsing. The
    retry delay (TRAINING_RETRY_DELAY_SECONDS) reaches every retried task of both DAGs
    that declare it; a wrong one is their import error, naming it."""
    code = ("import os\nfrom airflow.dag_processing.dagbag import DagBag\n"
            "bag = DagBag(os.environ['AIRFLOW__CORE__DAGS_FOLDER'])\n"
            "print('errors:', sorted(bag.import_errors), sorted(bag.dags))\n"
            "print('cron:', bag.dags['keras_retrain'].timetable.timetable.expression)\n"
            "print('delays:', sorted({t.retry_delay.total_seconds() for d in "
            "('keras_retrain', 'land_labelled_data') for t in bag.dags[d].tasks "
            "if t.retries}))\n"
            "os.environ['TRAINING_RETRY_DELAY_SECONDS'] = '0.5'\n"
            "bag = DagBag(os.environ['AIRFLOW__CORE__DAGS_FOLDER'])\n"
            "print('wrong:', sorted(os.path.basename(f) for f in bag.import_errors), "
            "all('TRAINING_RETRY_DELAY_SECONDS must be a whole number of seconds' in e "
            "for e in bag.import_errors.values()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TRAINING_SCHEDULE": "30 1 * * 1-5",
                               "TRAINING_STORE_URI": "gs://typo", "TRAINING_MAX_VERSION_MB": "x",
                               "TRAINING_RETRY_DELAY_SECONDS": "7"},
                          timeout=300)
    said = dict(line.split(": ", 1) for line in proc.stdout.splitlines()
                if line.startswith(("errors: ", "cron: ", "delays: ", "wrong: ")))
    assert said.get("errors", "").startswith("[] ["), proc.stderr[-2000:]
    assert "'keras_retrain'" in said["errors"] and "'land_labelled_data'" in said["errors"]
    assert said["cron"] == "30 1 * * 1-5"
    assert said["delays"] == "[7.0]", said
    assert said["wrong"] == "['keras_retrain.py', 'land_labelled_data.py'] True", said


def test_a_wrong_store_fails_the_task_at_once_and_routing_goes_on(dag, tmp_path,
                                                                  monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from training_airflow.policies import task_instance_mutation_hook

    monkeypatch.setenv("TRAINING_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TRAINING_STORE_URI", "gs://bucket/models")
    with pytest.raises(AirflowFailException, match=(  # no retry fixes it
            "TRAINING_STORE_URI scheme must be s3:// or file:// .* got 'gs://bucket/models'")):
        dag.get_task("stage_dataset").execute(
            {"params": dag.params.validate(), "run_id": "manual__2026-12-01T00:00:00+00:00"})
    assert list(tmp_path.iterdir()) == []
    train = SimpleNamespace(task_id="train", queue="default")
    task_instance_mutation_hook(task_instance=train,
                                dag_run=SimpleNamespace(conf={"accelerator": "gpu"}))
    assert train.queue == "gpu"


def test_default_params_validate_and_map_onto_the_default_config(dag):
    from training_airflow.params import config_for_run

    params = dag.params.validate()
    cfg = config_for_run(params, "scheduled__2026-11-30T03:00:00+00:00")
    defaults = RunConfig().to_flat()
    deployment = {s.key for s in flat_fields() if s.deployment}
    assert {k: v for k, v in cfg.to_flat().items() if k not in deployment} == {
        k: v for k, v in defaults.items() if k not in deployment}
    assert cfg.run_id == "scheduled__2026-11-30T03-00-00-00-00"


def test_a_rule_across_fields_fails_the_first_task_before_staging(dag, tmp_path,
                                                                 monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("TRAINING_DATA_DIR", str(tmp_path))
    params = {**dag.params.validate(), "workers": 2, "strategy": "mirrored"}
    stage = dag.get_task("stage_dataset")
    with pytest.raises(AirflowFailException, match=(  # fails at once: no retry fixes it
            "invalid run configuration: runtime.strategy must be 'auto' or 'multi_worker' "
            r".* got 'mirrored' with runtime.workers=2")):
        stage.execute({"params": params, "run_id": "manual__2026-12-01T00:00:00+00:00"})
    assert list(tmp_path.iterdir()) == []  # nothing staged


def test_form_is_the_config_schema_minus_deployment_settings(dag):
    schema = json_schema(flat=True)["properties"]
    form = {s.key for s in flat_fields() if not s.deployment}
    assert set(dag.params) == form
    specs = {s.key: s for s in flat_fields()}
    for key in form:
        param = dag.params.get_param(key)
        assert param.description == schema[key]["description"]
        for rule in ("minimum", "maximum", "exclusiveMinimum", "enum"):
            assert param.schema.get(rule) == schema[key].get(rule), (key, rule)
        assert param.schema["section"]
        # The UI refuses to submit a non-nullable field left empty: empty defaults are null.
        if specs[key].optional:
            assert param.value is None and "null" in param.schema["type"], key
        else:
            assert param.value == specs[key].default, key
        # A pattern is shown as its rule in words, never as a regular expression.
        assert "pattern" not in param.schema, key
        if "pattern" in schema[key]:
            assert param.schema["format"] in specs[key].says, key
    for key in ("dataset", "model", "epochs", "batch_size", "learning_rate", "lr_scaling",
                "early_stopping_patience", "reduce_lr_factor", "strategy", "accelerator",
                "workers", "launcher", "min_accuracy", "min_improvement", "force_promote",
                "model_name"):
        assert key in dag.params, key


@pytest.mark.parametrize(
    ("key", "value"),
    [("epochs", 0), ("batch_size", -1), ("model", "nope"), ("learning_rate", 0),
     ("accelerator", "fpga"), ("workers", 0), ("min_accuracy", 1.5), ("strategy", "ps"),
     ("model_name", "../x"), ("launcher", "slurm")],
)
def test_invalid_form_values_are_rejected_by_airflow(dag, key, value):
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError, match=key):
        params[key] = value  # ParamsDict validates on assignment, as the trigger form does
        params.validate()


def test_conf_cannot_override_deployment_settings_or_add_unknown_keys():
    from airflow.sdk.exceptions import AirflowFailException

    from training_airflow.params import config_for_run

    with pytest.raises(AirflowFailException, match="store_uri is set by the deployment"):
        config_for_run({"store_uri": "s3://elsewhere"}, "manual__x")
    with pytest.raises(AirflowFailException,
                       match=r"unknown conf key 'epoch' \(did you mean 'epochs'\?\); "
                             r"a run's conf may set: ") as refused:
        config_for_run({"epoch": 3}, "manual__x")
    # Only keys a conf may set are offered, never the deployment's.
    assert "store_uri" not in str(refused.value) and "epochs" in str(refused.value)


def test_optional_fields_left_empty_mean_not_set(dag):
    from training_airflow.params import config_for_run

    params = dag.params.validate()
    assert params["tpu"] is None and params["devices"] is None
    cfg = config_for_run({**params, "model_name": "", "tpu": None, "devices": None}, "manual__x")
    assert (cfg.runtime.tpu, cfg.runtime.devices, cfg.storage.model_name) == ("", [], "")
    assert cfg.model_name == "digits-mlp"


@pytest.mark.parametrize(("key", "value", "words"), [
    ("model_name", "a b", "registry name of 1 to 128 letters"),
    ("dataset", "MNIST", "dataset name: lower-case letters"),
    ("dataset_version", "latest", "version of three numbers, like 3.0.1"),
    ("devices", ["gpu0"], "device name like /gpu:0 or /cpu:0"),
])
def test_refused_names_say_the_rule_in_words(dag, key, value, words):
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError) as refused:
        params[key] = value
        params.validate()
    first_line = str(refused.value).splitlines()[0]
    assert key in first_line and words in first_line, first_line
    assert "^" not in first_line and "[A-Za-z" not in first_line, first_line


@pytest.mark.parametrize(("accelerator", "queue"), [("gpu", "gpu"), ("tpu", "tpu"),
                                                     ("cpu", "default"), (None, "default")])
def test_train_is_routed_to_the_accelerator_queue(accelerator, queue):
    from training_airflow.policies import task_instance_mutation_hook

    conf = {} if accelerator is None else {"accelerator": accelerator}
    train = SimpleNamespace(task_id="train", queue="default")
    task_instance_mutation_hook(task_instance=train, dag_run=SimpleNamespace(conf=conf))
    assert train.queue == queue
    other = SimpleNamespace(task_id="evaluate", queue="default")
    task_instance_mutation_hook(task_instance=other, dag_run=SimpleNamespace(conf=conf))
    assert other.queue == "default"


def test_the_policy_is_registered_with_airflow():
    from airflow.policies import make_plugin_from_local_settings  # noqa: F401
    from airflow.settings import get_policy_plugin_manager, load_policy_plugins

    manager = get_policy_plugin_manager()
    load_policy_plugins(manager)
    names = [type(p).__name__ if not hasattr(p, "__name__") else p.__name__
             for p in manager.get_plugins()]
    assert "training_airflow.policies" in names


def test_airflow_calls_the_policy_without_local_settings():
    """Airflow 3.3.2 skips ``task_instance_mutation_hook`` while its ``is_noop`` flag is
    set, and only an ``airflow_local_settings`` module cleared it: the scheduler never
    called the entry point's policy and a GPU run's train went to the default queue. A
    fresh process, as every Airflow component starts, with no local settings anywhere."""
    code = ("import airflow.settings as settings\n"
            "print(settings.task_instance_mutation_hook.is_noop)\n"
            "import importlib.util\n"
            "print(importlib.util.find_spec('airflow_local_settings'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=os.environ)
    assert result.stdout.split() == ["False", "None"], result.stdout + result.stderr


def test_loading_the_plugins_folder_shadows_no_package():
    """Airflow imports every .py file under plugins/ as a top-level module; the glue
    package is ignored there (plugins/.airflowignore): a module of it named like an
    installed package (a kubernetes.py once) would replace that package for every
    Airflow component, and its modules would be imported twice under other names."""
    code = ("from airflow import plugins_manager\n"
            "plugins_manager.ensure_plugins_loaded()\n"
            "import kubernetes\n"
            "print(kubernetes.__file__)\n"
            "print(sorted(p.name for p in plugins_manager._get_plugins()[0]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=os.environ, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kubernetes_file, plugins = proc.stdout.strip().splitlines()[-2:]
    assert "site-packages" in kubernetes_file
    assert "models" in plugins.lower()


@pytest.mark.parametrize("airflow_run_id", [
    "manual__2026-12-01T00:00:00+00:00", "scheduled__2026-12-01T03:00:00+00:00",
    "a..b", "..", "a/../b", "x" * 300, "asset_triggered__2026-12-01T00:00:00.123456+00:00"])
def test_every_airflow_run_id_gives_a_valid_version_id(airflow_run_id):
    from training.layout import validate_name
    from training_airflow.params import run_id_for

    version = run_id_for(airflow_run_id)
    assert validate_name("version", version) == version
    assert run_id_for(airflow_run_id) == version  # a retry gets the same one


def test_own_data_runs_cover_the_days_that_are_over_when_the_run_starts():
    import pendulum

    from training_airflow.params import config_for, run_day

    nightly = {"data_interval_end": pendulum.datetime(2026, 12, 1, 3, tz="UTC")}
    assert run_day(nightly) == "2026-11-30"
    manual = {"data_interval_end": None,
              "dag_run": SimpleNamespace(run_after=pendulum.datetime(2026, 12, 1, 10, 2))}
    assert run_day(manual) == "2026-11-30"
    own = {"data_source": "images", "data_uri": "s3://team/images", "image_shape": "8x8x1"}
    context = {**nightly, "params": own, "run_id": "scheduled__2026-12-01T03:00:00+00:00"}
    assert config_for(context).dataset.until == "2026-11-30"
    chosen = {**context, "params": {**own, "data_until": "2026-11-15"}}
    assert config_for(chosen).dataset.until == "2026-11-15"  # the form's value wins
    catalog = {**context, "params": {}}
    assert config_for(catalog).dataset.until is None  # a catalog dataset has no days


@pytest.mark.parametrize(("require", "promote", "why"), [
    (False, True, "promotion.require_approval is off"),
    (True, False, "the model lost: below min_accuracy"),
    (False, False, "promotion.require_approval is off"),
])
def test_approval_asks_only_when_required_and_the_model_won(dag, tmp_path, monkeypatch,
                                                            require, promote, why):
    """A model that loses (or a run that needs no approval) never reaches a person: the
    task returns at once, before any request exists."""
    from training.config import frozen
    from training_airflow.params import config_for_run

    monkeypatch.setenv("TRAINING_DATA_DIR", str(tmp_path))
    cfg = config_for_run({**dag.params.validate(), "require_approval": require},
                         "manual__2026-12-01T00:00:00+00:00")
    handed = frozen.freeze(cfg)
    task = copy.copy(dag.get_task("approve_promotion"))
    task.evaluation = {"decision": {"promote": promote, "reasons": ["below min_accuracy"]}}
    task.published = {"model_name": cfg.model_name, "version": cfg.run_id}
    ti = SimpleNamespace(xcom_pull=lambda task_ids, key: handed if
                         (task_ids, key) == ("stage_dataset", "config") else None)
    assert task.execute({"ti": ti}) == {"asked": False, "why": why}


def test_the_promote_model_form_needs_every_field(dagbag):
    from airflow.sdk.exceptions import ParamValidationError

    filled = {"model_name": "digits-mlp", "version": "v1", "action": "rollback",
              "reason": "v2 misbehaves"}
    params = copy.deepcopy(dagbag.dags["promote_model"].params)
    for key, value in filled.items():
        params[key] = value
    assert params.validate() == filled
    for key, value in (("reason", ""), ("action", "delete"), ("version", "")):
        params = copy.deepcopy(dagbag.dags["promote_model"].params)
        with pytest.raises(ParamValidationError, match=key):
            params[key] = value
            params.validate()


def test_failures_and_late_runs_alert(dag):
    from training_airflow import tracking
    from training_airflow.alerts import on_task_failure

    for task in dag.tasks:  # an alert, and the night's MLflow run ended
        callbacks = task.on_failure_callback
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        assert callbacks == [on_task_failure, tracking.on_task_failure], task.task_id
    # The deadline as a deployment gets it (the tests run without one: conftest.py).
    code = ("import os\nfrom airflow.dag_processing.dagbag import DagBag\n"
            "[late] = DagBag(os.environ['AIRFLOW__CORE__DAGS_FOLDER'])"
            ".dags['keras_retrain'].deadline\n"
            "print(late.interval, late.callback.path)")
    env = {k: v for k, v in os.environ.items() if k != "TRAINING_DEADLINE_MINUTES"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == (
        "6:00:00 training_airflow.alerts.deadline_missed"), proc.stderr[-2000:]
    assert dag.deadline is None or dag.deadline == []  # TRAINING_DEADLINE_MINUTES=""
