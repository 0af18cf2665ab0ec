"""Promote or roll back a model version by hand, from the Airflow UI (``promote_model``).

A person fills the ``promote_model`` DAG's trigger form (or a Models page row's
"promote this version" / "roll back to this version" link opens the page's own form,
filled in, which triggers the DAG as that person):
the model, the version, promote or roll back, and why. ``move_pointer`` then moves the
production pointer through the same checks as every promotion
(``ModelRegistry.promote``: every file downloaded and verified against the manifest,
the model loaded safely, a compare-and-swap against the production version read first)
and records in the promotion history who triggered it (the run's
``triggering_user_name``). Airflow's permissions decide who may: triggering
``promote_model`` needs the right to create its runs.

Bad input fails the task at once (no retry fixes it) with one line naming the field,
the value and what is allowed; the pointer does not move.
"""

from __future__ import annotations

from typing import Any

ACTIONS = ("promote", "rollback")


def _refuse(message: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    raise AirflowFailException(message)


def _registry() -> Any:
    from training.deployment import Deployment
    from training.errors import ConfigError
    from training.tracking import tracked_registry
    from training_airflow.store import s3_options

    try:
        deployment = Deployment.from_env()
    except ConfigError as exc:
        _refuse(str(exc))
    store = deployment.store.text
    return tracked_registry(store, s3_options(store, deployment.aws_conn_id))


def checked_request(params: dict[str, Any], registry: Any) -> tuple[str, str, str, str]:
    """(model, version, action, reason) from the form, each checked against the store."""
    from training.errors import RegistryError

    model = (params.get("model_name") or "").strip()
    version = (params.get("version") or "").strip()
    action, reason = params.get("action"), (params.get("reason") or "").strip()
    if action not in ACTIONS:
        _refuse(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
    if not reason:
        _refuse("reason must say why (it goes into the promotion history), got an empty "
                "reason")
    models = registry.list_models()
    if model not in models:
        _refuse(f"model_name {model!r} is not a model in the store {registry.store.uri}; "
                f"models there: {', '.join(models) or 'none'}")
    try:
        registry.show(model, version)
    except RegistryError:
        versions = [v["version"] for v in registry.list_versions(model)]
        shown = ", ".join(versions[:10]) + (" ..." if len(versions) > 10 else "")
        _refuse(f"version {version!r} is not a complete version of model {model!r}; "
                f"its versions, newest first: {shown or 'none'}")
    return model, version, action, reason


def move_pointer(params: dict[str, Any], dag_run: Any, airflow_run_id: str) -> dict[str, Any]:
    """The ``promote_model`` task: move production as the form says; what moved."""
    from training.errors import RegistryError, StorageError
    from training_airflow import alerts, tracking
    from training_airflow.approval import request_links
    from training_airflow.params import run_id_for

    registry = _registry()
    model, version, action, reason = checked_request(params, registry)
    by = getattr(dag_run, "triggering_user_name", None) or "unknown user"
    at, run_id = dag_run.run_after.isoformat(), run_id_for(airflow_run_id)
    previous = registry.production(model)
    mark = tracking.missed_mark()
    try:
        if action == "rollback":
            registry.rollback(model, version, run_id=run_id, at=at, note=reason, by=by)
        else:
            registry.promote(model, version, run_id=run_id, at=at,
                             reason=f"manual promotion: {reason}", forced=True,
                             expected_current=previous, by=by)
    except (RegistryError, StorageError) as exc:  # StorageError: corrupt files, a lost race
        _refuse(str(exc))
    tracking.tracker().flush()  # the MLflow mirror's champion moved before the task ends
    if previous == version:
        return {"model_name": model, "version": version, "moved": False, "by": by,
                "why": f"{version} was already in production"}
    tracking.alert_if_missed(mark, model, version, dag_id=dag_run.dag_id,
                             run_id=airflow_run_id)
    alerts.send(alerts.promoted(model, version, previous, [f"{action} by {by}: {reason}"],
                                by, request_links(model, version),
                                dag_id=dag_run.dag_id, run_id=airflow_run_id))
    return {"model_name": model, "version": version, "moved": True, "from": previous,
            "action": action, "by": by, "reason": reason}
