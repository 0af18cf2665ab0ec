"""Launchers other than a local child process, adapted to an Airflow task.

``launcher=local`` needs no adapter: the ``train`` task runs ``python -m training train
--evaluate`` as its child (``tasks.Step.run_command`` over
``training.launch.command.TrainingCommand``). The launches themselves live in the
library, each with ``run`` and ``stop`` (``training.launch``); what is here only hands
them what Airflow holds: connections and the task's log, and sets ``operator.launch``
for ``on_kill``.

``launcher=kubernetes`` takes the Job's options from the task's deployment
(``training.deployment``; ``KubernetesOptions.from_env`` over its ``TRAINING_K8S_*``; see
docs/kubernetes-airflow.md), gets the ``kubernetes`` API clients from the
cncf-kubernetes provider's ``KubernetesHook`` (the connection ``kubernetes_default``
unless ``TRAINING_K8S_CONN_ID`` names another), and runs
``training.launch.kubernetes``'s ``TrainingJob``: render and check, then apply, follow,
logs, failure message; ``on_kill`` deletes the Job. With ``TRAINING_DEFERRABLE`` (the
default, ``Step.deferrable``) the task only applies the objects (``TrainingJob.apply``)
and defers to ``job_trigger.TrainingJobTrigger``, which follows the Job in the
triggerer; resumed (``Step.resume``) with its event, it concludes (``TrainingJob.
conclude``: the same XCom, the same failure message). The provider's
``KubernetesJobOperator`` is not used; docs/kubernetes-airflow.md says which of our
guarantees it would break.

Other launchers plug in through ``LAUNCHERS``: one function that takes the operator,
the config and the context, sets ``operator.launch`` to what ``on_kill`` stops, and
returns the ``train`` task's XCom.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

JOB_EVENT = "job"  # the kind of a TrainingJobTrigger's event
TIMEOUT_MARGIN_S = 600  # a trigger's timeout past the Job's deadline or the task's


def launch_kubernetes(operator: Any, cfg: Any, context: Any = None) -> dict[str, Any]:
    """Train ``cfg`` on Kubernetes with the options and connection of the operator's
    deployment; XCom: run id, run dir, Job name and namespace. With ``operator.deferrable``
    the Job is applied here and followed by a ``TrainingJobTrigger``; the task comes back
    (``Step.resume``) with its event, and this concludes it."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from kubernetes.client import BatchV1Api

    from training.launch.kubernetes import KubernetesOptions, TrainingJob
    from training.launch.kubernetes.follow import job_state
    from training.launch.kubernetes.options import with_tracking

    deployment = operator.deployment
    conn_id = deployment.kubernetes_conn_id
    # Every check (settings, config, objects) before any connection is made; the pods
    # track to the deployment's MLflow server, as the local launcher's child does.
    options = with_tracking(KubernetesOptions.from_env(deployment.kubernetes_env),
                            deployment.tracking_uri)
    job = TrainingJob(cfg, options, operator.log,
                      identity=f"the Airflow connection {conn_id!r}", staged=operator.staged)
    operator.launch = job
    hook = KubernetesHook(conn_id=conn_id)

    def new_batch() -> Any:  # stop() runs in a signal handler, maybe inside a request
        return BatchV1Api(api_client=hook.get_conn())

    event = operator.event
    if isinstance(event, dict) and event.get("kind") == JOB_EVENT:
        operator.event = None  # taken up: a later launch of this task starts afresh
        job.attach(hook.core_v1_client, hook.batch_v1_client, new_batch)
        return _conclude(job, event)
    if not operator.deferrable:
        return job.run(hook.core_v1_client, hook.batch_v1_client, new_batch=new_batch)
    found = job.apply(hook.core_v1_client, hook.batch_v1_client, new_batch)
    if job_state(found) == "succeeded":  # an earlier try's: nothing to wait for
        job.pods.surface(found)
        return job.conclude(found)
    _defer(operator, job, options, conn_id)
    raise AssertionError("defer() returned")  # pragma: no cover


def _defer(operator: Any, job: Any, options: Any, conn_id: str) -> None:
    """Hand the Job to a ``TrainingJobTrigger``. The task's ``execution_timeout`` becomes
    the trigger's ``stop_at``; the trigger's own timeout (which deletes nothing) is a
    backstop past the Job's ``activeDeadlineSeconds``, none while a Kueue wait may last."""
    import time
    from datetime import timedelta

    from training_airflow.job_trigger import TrainingJobTrigger

    stop_at = None
    if operator.execution_timeout is not None:
        stop_at = operator.entered_at + operator.execution_timeout.total_seconds()
    bounds = []
    if options.active_deadline_seconds is not None and not options.kueue_queue:
        bounds.append(options.active_deadline_seconds + TIMEOUT_MARGIN_S)
    if stop_at is not None:
        bounds.append(stop_at - time.time() + TIMEOUT_MARGIN_S)
    trigger = TrainingJobTrigger(
        conn_id=conn_id, namespace=job.namespace, name=job.name,
        workers=job.job["spec"]["completions"], failure_lines=options.failure_lines,
        poll_interval=options.poll_interval, kueue_queue=options.kueue_queue, stop_at=stop_at,
        trial=getattr(operator, "trial_lane", None))
    operator.defer(trigger=trigger, method_name="resume",
                   timeout=timedelta(seconds=max(min(bounds), 1)) if bounds else None)


def _conclude(job: Any, event: dict[str, Any]) -> dict[str, Any]:
    """The launch's end from its trigger's event: the XCom, or the failure worded as a
    task that followed the Job itself words it."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    from training.errors import LaunchError

    status = event.get("status")
    if event.get("job") != job.name:
        raise LaunchError(f"the trigger followed Job {event.get('job')!r}, this launch's is "
                          f"{job.name!r}")
    if status == "timed_out":
        raise AirflowTaskTimeout(event["message"])
    if status not in ("succeeded", "failed"):
        raise LaunchError(event.get("message") or f"the trigger ended with {event!r}")
    return job.conclude(job.read(), event.get("tails") or {})


LAUNCHERS: dict[str, Callable[[Any, Any, Any], dict[str, Any]]] = {
    "kubernetes": launch_kubernetes,
}
