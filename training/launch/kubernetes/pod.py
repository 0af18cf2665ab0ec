"""Inside a training pod: its ``TF_CONFIG`` from the Indexed Job's completion index.

Every rendered pod runs ``python -m training.launch.kubernetes exec -- <train command>``
(``WRAPPER``). Kubernetes sets ``JOB_COMPLETION_INDEX`` (0 .. N-1) in each pod of an
Indexed Job and names its host ``<job>-<index>``; the rendered pods also carry the Job,
Service and namespace names, the worker count and the port (``ENV_*`` below). The
wrapper builds ``TF_CONFIG`` from them with ``training.train.cluster.build`` (the one
place that builds it): the same cluster for every worker, its own task index (worker 0
is the chief); then it replaces itself with the command. One worker
gets no ``TF_CONFIG``: the strategy is then chosen as on a single machine.

This runs in every pod before training: it imports neither TensorFlow nor the
``kubernetes`` client.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from training.config.sections import MAX_WORKERS
from training.errors import ConfigError, shown
from training.launch.kubernetes.names import is_dns_label
from training.train import cluster  # TF_CONFIG: the one place that builds it

WRAPPER = ("python", "-m", "training.launch.kubernetes", "exec", "--")

# The env the renderer gives every pod and the wrapper reads back.
ENV_JOB, ENV_SERVICE, ENV_NAMESPACE = "TRAINING_JOB_NAME", "TRAINING_SERVICE", "TRAINING_NAMESPACE"
ENV_WORKERS, ENV_PORT = "TRAINING_WORKERS", "TRAINING_PORT"
ENV_INDEX = "JOB_COMPLETION_INDEX"  # set by Kubernetes in Indexed Jobs
POD_ENV = (ENV_JOB, ENV_SERVICE, ENV_NAMESPACE, ENV_WORKERS, ENV_PORT, ENV_INDEX, cluster.ENV)


def worker_hosts(job: str, service: str, namespace: str, workers: int, port: int) -> list[str]:
    """``host:port`` of every worker: the stable DNS names of the Indexed Job's pods."""
    return [f"{job}-{i}.{service}.{namespace}.svc:{port}" for i in range(workers)]


def tf_config_for_index(job: str, service: str, namespace: str, workers: int, index: int,
                        port: int = 2222) -> str:
    """The ``TF_CONFIG`` of worker ``index`` (0 is the chief): same cluster for every index."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not (
        1 <= workers <= MAX_WORKERS
    ):
        raise ConfigError(f"workers must be between 1 and {MAX_WORKERS}, got {shown(workers)}")
    for what, value in (("job", job), ("service", service), ("namespace", namespace)):
        if not is_dns_label(value):
            raise ConfigError(f"{what} must be a DNS-1123 label, got {shown(value)}")
    return cluster.build(worker_hosts(job, service, namespace, workers, port), index)


def tf_config_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """``TF_CONFIG`` for this pod from the env the Job sets; None for a single worker."""
    env = os.environ if environ is None else environ
    missing = [k for k in (ENV_JOB, ENV_SERVICE, ENV_NAMESPACE, ENV_WORKERS, ENV_PORT)
               if not env.get(k)]
    if missing:
        raise ConfigError(
            f"environment variables {', '.join(missing)} are not set; the exec wrapper "
            "runs in pods rendered by training.launch.kubernetes.render"
        )
    try:
        workers, port = int(env[ENV_WORKERS]), int(env[ENV_PORT])
    except ValueError:
        raise ConfigError(
            f"{ENV_WORKERS} and {ENV_PORT} must be integers, got "
            f"{shown(env[ENV_WORKERS])} and {shown(env[ENV_PORT])}"
        ) from None
    if workers == 1:
        return None
    raw = env.get(ENV_INDEX)
    if raw is None or not raw.isdigit():
        raise ConfigError(
            f"{ENV_INDEX} must be the pod's completion index (set by Kubernetes in "
            f"Indexed Jobs), got {shown(raw)}"
        )
    return tf_config_for_index(env[ENV_JOB], env[ENV_SERVICE], env[ENV_NAMESPACE], workers,
                               int(raw), port)


def exec_command(command: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Set TF_CONFIG for this pod and replace the process with ``command``."""
    if not command:
        raise ConfigError("exec needs a command after '--', got none")
    env = dict(os.environ if environ is None else environ)
    tf_config = tf_config_from_env(env)
    if tf_config is not None:
        env[cluster.ENV] = tf_config
    sys.stdout.flush()
    os.execvpe(command[0], list(command), env)
