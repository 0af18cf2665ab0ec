"""How ``train`` runs: one launcher per ``runtime.launcher``, over ``training.launch``.

``run_training_command`` runs ``python -m training COMMAND`` for a task as a child
process on the worker, in the task's working directory: ``stage`` when the dataset is
not cached yet, ``train --evaluate`` (``launcher=local``), ``evaluate`` when the
evaluation the training process wrote no longer stands. The Airflow task process itself
never loads TensorFlow.

``launcher=local`` runs ``python -m training train --evaluate`` that way
(``training.launch.child``), in its own process group: its output streams line by line
into the task log (TensorFlow's CUDA probing noise on a CPU-only worker left out),
``on_kill`` (a task marked failed, a timeout, a worker shutdown) sends SIGTERM to its
group, and its exit code decides the task: 0 succeeds; 2 is a configuration error that
no retry can fix, so the task fails at once without retries (``AirflowFailException``);
anything else fails and is retried.
The failure message is the child's ``error:`` line. The child gets the store's
credentials through its environment only. The run's frozen config (the file its first
step wrote, ``<run_dir>/run-config.json``) is passed with ``--config``; because the run id
comes from the Airflow run, a retry lands in the same run directory and
BackupAndRestore resumes it. The dataset is the one ``stage_dataset`` staged (its XCom,
written beside the config and passed with ``--staged``), verified, never staged again;
``validate_data``'s statistics go with ``--data-stats``.

``launcher=kubernetes`` takes the Job's options from the task's deployment
(``training.deployment``; ``KubernetesOptions.from_env`` over its ``TRAINING_K8S_*``; see
docs/kubernetes-airflow.md), gets the ``kubernetes`` API clients from the cncf-kubernetes
provider's ``KubernetesHook`` (the connection ``kubernetes_default`` unless
``TRAINING_K8S_CONN_ID`` names another), and runs ``training.launch.kubernetes``'s
``TrainingJob``: render and check, then apply, follow, logs, failure message;
``on_kill`` deletes the Job. The provider's ``KubernetesJobOperator`` is not used;
docs/kubernetes-airflow.md says which of our guarantees it would break.

Other launchers plug in through ``LAUNCHERS``: one function that takes the operator,
the config and the context. A launcher that needs its own clean-up on kill sets
``operator.stop``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.errors import CONFIG_ERROR_EXIT, LaunchError
from training.launch.child import Child, ChildResult
from training.registry.uri import is_s3


def run_child(operator: Any, command: list[str], env: dict[str, str],
              cwd: str) -> ChildResult:
    """``command`` as the task's child (``training.launch.child``), its lines into the
    task log; ``on_kill`` stops it (``operator.child``)."""
    operator.child = Child(command, env, cwd)
    return operator.child.run(lambda line: operator.log.info("%s", line))


def _s3_uri(cfg: Any) -> str:
    """The run's first s3:// location a child process reads (the store, the backbone's
    weights, the holdout, the team's data): its credentials come from one connection."""
    uris = (cfg.storage.store_uri, cfg.model.weights, cfg.promotion.holdout_uri,
            cfg.dataset.uri)
    return next((uri for uri in uris if is_s3(uri)), "")


def run_training_command(operator: Any, cfg: Any, command: str, *, staged: Any = None,
                         data_stats: Any = None, flags: tuple[str, ...] = ()
                         ) -> dict[str, Any]:
    """``python -m training COMMAND`` for this run, a child process of the task: the
    config (and ``staged``, ``data_stats``) in files beside the run directory, the
    credentials in its environment. Returns what it printed as JSON; exit 2 fails the
    task without retries (``AirflowFailException``), any other failure is retried."""
    from airflow.sdk.exceptions import AirflowFailException

    from training_airflow.store import s3_options, subprocess_env

    output_dir = Path(cfg.storage.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # The run's frozen config, as the first step wrote it (``training.config.frozen``).
    args = [sys.executable, "-m", "training", command, "--config", operator.frozen["path"]]
    for flag, value in (("--staged", staged), ("--data-stats", data_stats)):
        if value is not None:  # stage_dataset's and validate_data's XComs
            path = output_dir / f"{cfg.run_id}.{flag[2:]}.json"
            path.write_text(json.dumps(value))
            args += [flag, os.fspath(path)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           **subprocess_env(s3_options(_s3_uri(cfg), operator.deployment.aws_conn_id))}
    operator.log.info("starting %s (TensorFlow loads in it, about 15 s): %s", command,
                      " ".join([*args, *flags]))
    # In the task's own working directory: a relative path in the conf (data_uri) means
    # in the child what it means here.
    ended = run_child(operator, [*args, *flags], env, os.getcwd())
    code, error = ended.code, ended.error
    what = "training" if command == "train" else f"`{command}`"
    if code == CONFIG_ERROR_EXIT:
        raise AirflowFailException(
            f"{what} refused its configuration (exit {code}, not retried): "
            f"{error or 'no error line'}")
    if code != 0:
        raise LaunchError(
            f"{what} exited with code {code}: {error or 'no error line; see the log above'}")
    return ended.results


def launch_local(operator: Any, cfg: Any, context: Any) -> dict[str, Any]:
    """Train, then evaluate against production, in one child process: TensorFlow loads
    once per run, and never in the task process (``evaluate`` reads what it wrote)."""
    run_training_command(operator, cfg, "train", staged=operator.staged,
                         data_stats=(operator.validated or {}).get("data_stats"),
                         flags=("--evaluate",))
    return {"run_id": cfg.run_id, "run_dir": os.fspath(cfg.run_dir())}


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
    operator.stop = job.stop
    hook = KubernetesHook(conn_id=conn_id)
    # stop() runs in a signal handler, maybe inside a request: a client of its own.
    return job.run(hook.core_v1_client, hook.batch_v1_client,
                   new_batch=lambda: BatchV1Api(api_client=hook.get_conn()))


LAUNCHERS: dict[str, Callable[[Any, Any, Any], dict[str, Any]]] = {
    "local": launch_local,
    "kubernetes": launch_kubernetes,
}
