"""``launcher=kubernetes``: the Airflow side of training on Kubernetes, and only that.

``launch(operator, cfg)`` reads the deployment's settings from the Airflow worker's
environment (``KubernetesOptions.from_env``: ``TRAINING_K8S_*``; see
docs/kubernetes-airflow.md), gets the ``kubernetes`` API clients from the cncf-kubernetes
provider's ``KubernetesHook`` (the connection ``kubernetes_default`` unless
``TRAINING_K8S_CONN_ID`` names another), and runs ``training.launch.kubernetes``'s
``TrainingJob``: render and check, then apply, follow, logs, failure message. The operator's
``on_kill`` (a task marked failed, a timeout) calls its ``stop()``, which deletes the Job.

The provider's ``KubernetesJobOperator`` is not used; docs/kubernetes-airflow.md says
which of our guarantees it would break, with the provider's source lines.

This module's name must not be ``kubernetes``: a ``kubernetes.py`` that lands on
``sys.path`` shadows the client package (plugins/.airflowignore keeps this folder out of
Airflow's plugin import for the same reason).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from training.launch.kubernetes import KubernetesOptions, TrainingJob

ENV_CONN_ID = "TRAINING_K8S_CONN_ID"
DEFAULT_CONN_ID = "kubernetes_default"


def conn_id_from_env(env: Mapping[str, str] = os.environ) -> str:
    """The Airflow connection (type Kubernetes) the launch uses; empty counts as unset."""
    return env.get(ENV_CONN_ID) or DEFAULT_CONN_ID


def launch(operator: Any, cfg: Any, context: Any = None,
           env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Train ``cfg`` on Kubernetes; XCom: run id, run dir, Job name and namespace."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from kubernetes.client import BatchV1Api

    conn_id = conn_id_from_env(env)
    # Every check (settings, config, objects) before any connection is made.
    job = TrainingJob(cfg, KubernetesOptions.from_env(env), operator.log,
                      identity=f"the Airflow connection {conn_id!r}")
    operator.stop = job.stop
    hook = KubernetesHook(conn_id=conn_id)
    # stop() runs in a signal handler, maybe inside a request: a client of its own.
    return job.run(hook.core_v1_client, hook.batch_v1_client,
                   new_batch=lambda: BatchV1Api(api_client=hook.get_conn()))
