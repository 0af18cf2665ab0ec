"""Cluster policy: send ``train`` to the worker queue that matches the run's accelerator.

Registered through the ``airflow.policy`` entry point (pyproject.toml), so installing
the project is enough. Airflow 3.3.2 calls ``task_instance_mutation_hook`` only when
``airflow.settings.task_instance_mutation_hook.is_noop`` is False, and only importing an
``airflow_local_settings`` module makes it so: a policy registered solely through the
entry point was skipped without a word, and a GPU run's ``train`` ran on a CPU worker.
Airflow loads this module (``load_policy_plugins``) before it looks for local settings,
so the module clears the flag itself when it is loaded. The scheduler then calls the hook
for every task instance it creates or re-queues; a manual run whose conf says
``accelerator: gpu`` (or ``tpu``) puts its ``train`` task and a sweep's ``trial`` tasks
on the ``gpu`` (``tpu``) queue, where only Celery workers with that hardware listen
(``airflow celery worker --queues gpu``). Scheduled runs use the
form's default (``cpu``) and the task's own queue. Queue names are the deployment's
(``training.deployment.queue_from_env``: ``TRAINING_GPU_QUEUE`` / ``TRAINING_TPU_QUEUE``;
it reads only those, so no other setting can break the queueing of tasks).
"""

from __future__ import annotations

import sys
from typing import Any

from airflow.policies import hookimpl

from training.deployment import queue_from_env

TRAINING_TASK_IDS = {"train", "trial"}  # trial: a sweep's (sweep_tasks.py)


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any) -> None:
    if task_instance.task_id not in TRAINING_TASK_IDS or dag_run is None:
        return
    queue = queue_from_env((dag_run.conf or {}).get("accelerator"))
    if queue:
        task_instance.queue = queue


def _let_airflow_call_the_hook() -> None:
    """Clear Airflow's "no mutation hook" flag (module doc); a no-op outside Airflow's
    settings start (nothing to clear) and once Airflow no longer has the flag."""
    settings = sys.modules.get("airflow.settings")
    hook = getattr(settings, "task_instance_mutation_hook", None)
    if hook is not None and getattr(hook, "is_noop", False):
        hook.is_noop = False


_let_airflow_call_the_hook()
