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
logs, failure message; ``on_kill`` deletes the Job. The provider's
``KubernetesJobOperator`` is not used; docs/kubernetes-airflow.md says which of our
guarantees it would break.

Other launchers plug in through ``LAUNCHERS``: one function that takes the operator,
the config and the context, sets ``operator.launch`` to what ``on_kill`` stops, and
returns the ``train`` task's XCom.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def launch_kubernetes(operator: Any, cfg: Any, context: Any = None) -> dict[str, Any]:
    """Train ``cfg`` on Kubernetes with the options and connection of the operator's
    deployment; XCom: run id, run dir, Job name and namespace."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from kubernetes.client import BatchV1Api

    from training.launch.kubernetes import KubernetesOptions, TrainingJob

    deployment = operator.deployment
    conn_id = deployment.kubernetes_conn_id
    # Every check (settings, config, objects) before any connection is made.
    job = TrainingJob(cfg, KubernetesOptions.from_env(deployment.kubernetes_env), operator.log,
                      identity=f"the Airflow connection {conn_id!r}", staged=operator.staged)
    operator.launch = job
    hook = KubernetesHook(conn_id=conn_id)
    # stop() runs in a signal handler, maybe inside a request: a client of its own.
    return job.run(hook.core_v1_client, hook.batch_v1_client,
                   new_batch=lambda: BatchV1Api(api_client=hook.get_conn()))


LAUNCHERS: dict[str, Callable[[Any, Any, Any], dict[str, Any]]] = {
    "kubernetes": launch_kubernetes,
}
