"""What the DAG's tasks hand the tracker: one MLflow run for the whole DAG run.

The training library's tracker (``training.tracking``; off, and MLflow never imported,
without a tracking URI) is handed the pipeline's records by the tasks that make them:
``stage_dataset`` starts the run (the frozen config as params; the Airflow DAG, run and
its link, the data fingerprint as tags); ``train``'s child process logs each epoch and
the evaluation itself (the same library code as the CLI); ``publish`` tags the version
and registers it; ``promote`` moves ``champion`` through the registry's followers
(``store.open_registry``) and ends the run; a task that fails for good ends it FAILED
(``on_task_failure``, the DAG's failure callback beside the alert), so no failed night
stays RUNNING in MLflow. Each task waits (``flush``) until what it handed over was sent,
so nothing is lost when its process ends; the tracker's own process does the sending
(``training.tracking``). Every task finds the same MLflow run by the tag
``pipeline.run_id``: the run id of the DAG run's own config, also after a sweep, whose
picked trial (a child run) the later tasks carry.
"""

from __future__ import annotations

import json
from typing import Any


def tracker() -> Any:
    from training.tracking import tracker_from_env

    return tracker_from_env()


def first_frozen(task: Any, context: Any) -> dict[str, str] | None:
    """The run's frozen config as its first step handed it on (XCom ``config``: path and
    SHA-256), or None (outside a DAG run, or before that step froze it)."""
    from training_airflow.step import CONFIG_XCOM

    first = next((t for t in task.dag.tasks if getattr(t, "builds_config", False)), None) \
        if task.has_dag() and context.get("ti") is not None else None
    return context["ti"].xcom_pull(task_ids=first.task_id, key=CONFIG_XCOM) \
        if first is not None else None


def pipeline_run_id(task: Any, cfg: Any, context: Any) -> str:
    """The DAG run's own run id (the first step's frozen config's), which a sweep's
    picked trial config handed on to the later steps does not carry."""
    frozen = first_frozen(task, context)
    if not frozen:
        return cfg.run_id
    try:
        with open(frozen["path"]) as file:
            return json.load(file)["storage"]["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return cfg.run_id


def run_started(cfg: Any, context: Any, staged: dict[str, Any]) -> None:
    """The run's config and the Airflow run it is (``stage_dataset``)."""
    from training_airflow.alerts import run_url

    dag_run = context["dag_run"]
    tracker().start(cfg, tags={"airflow.dag_id": dag_run.dag_id,
                               "airflow.run_id": dag_run.run_id,
                               "airflow.url": run_url(dag_run.dag_id, dag_run.run_id),
                               "data.fingerprint": staged.get("fingerprint", ""),
                               "mlflow.note.content":
                                   f"Airflow: {run_url(dag_run.dag_id, dag_run.run_id)}"})
    tracker().flush()


def published(task: Any, cfg: Any, context: Any, registry: Any) -> None:
    """The published version on the run, and registered in MLflow's registry."""
    run = pipeline_run_id(task, cfg, context)
    tracker().set_tags(cfg.model_name, run, {"published.version": cfg.run_id})
    tracker().registered(cfg.model_name, cfg.run_id, registry.store.uri, run_id=run)
    tracker().flush()


def evaluated(task: Any, cfg: Any, context: Any, evaluation: dict[str, Any]) -> None:
    """The evaluation on the DAG run's MLflow run (after a sweep, the trial's child
    run has it from the training process already)."""
    run = pipeline_run_id(task, cfg, context)
    if run != cfg.run_id:
        tracker().log_evaluation(cfg.model_name, run, evaluation)
        tracker().flush()


def ended(task: Any, cfg: Any, context: Any, state: str = "complete",
          reason: str = "") -> None:
    """The run's end: after what the promotion moved (``champion``) was sent, or when
    ``validate_data`` skips the night (``skipped``, with its reason)."""
    if not tracker().enabled:
        return
    tracker().end(cfg.model_name, pipeline_run_id(task, cfg, context), state, reason)
    tracker().flush()


def on_task_failure(context: Any) -> None:
    """An operator's ``on_failure_callback``: Airflow calls it once the task has failed
    for good (after its retries). The DAG run's MLflow run ends FAILED, the task and its
    error as ``pipeline.reason``. A trial's failure is the sweep's to judge (``train``
    runs after failed trials, ``sweep.max_failed``), so a trial ends nothing here. Before
    the first step froze the run's config no run was started: nothing to end. Never
    raises: the failure it follows is the news."""
    import logging

    from training.config import frozen
    from training_airflow.alerts import error_line

    task, ti = context.get("task"), context.get("ti")
    if task is None or ti is None or not getattr(task, "ends_run_on_failure", True):
        return
    try:
        if not tracker().enabled:
            return
        handed = first_frozen(task, context)
        if not handed:
            return
        cfg = frozen.thaw(handed)
        reason = f"{ti.task_id} failed: {error_line(context.get('exception'))}"
        tracker().end(cfg.model_name, cfg.run_id, "failed", reason)
        tracker().flush()
    except Exception:  # noqa: BLE001 - a failure callback never raises
        logging.getLogger("training").exception("the MLflow run could not be ended")


def missed_mark() -> int:
    """Where this process's list of calls MLflow did not get ends now (before a move of
    production; ``alert_if_missed`` after it)."""
    return tracker().missed_count if tracker().enabled else 0


def alert_if_missed(mark: int, model: str, version: str, *, dag_id: str,
                    run_id: str) -> None:
    """After production moved and the tracker flushed: one alert when MLflow did not get
    a call asked for since ``mark`` (a server down, a call refused after its retry), so
    the team knows ``champion`` may not be production (docs/tracking.md). The promotion
    stands either way."""
    from training_airflow import alerts

    missed = list(dict.fromkeys(tracker().missed_since(mark) or []))
    if missed:
        alerts.send(alerts.mirror_missed(model, version, missed, dag_id=dag_id,
                                         run_id=run_id))
