"""``TF_CONFIG``: the one place that builds and reads it.

``tf.distribute`` learns the cluster of a multi-worker run from the ``TF_CONFIG``
environment variable, a JSON object such as::

    {"cluster": {"worker": ["host-0:2222", "host-1:2222"]},
     "task": {"type": "worker", "index": 1}}

Launchers build it (``build``: the local launcher for ``127.0.0.1`` ports, the
Kubernetes exec wrapper for the Indexed Job's pod names) and set it before the training
process starts; the training process reads it (``current``, ``workers``, ``is_chief``,
``task_index``) before any strategy exists, because TensorFlow reads it once, when the
strategy is created. Under Keras's JAX backend the same description joins the processes
through ``jax.distributed`` (``coordinator``: worker 0's address is JAX's coordinator).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from training.errors import ConfigError, shown

ENV = "TF_CONFIG"


def build(hosts: Sequence[str], index: int) -> str:
    """``TF_CONFIG`` of worker ``index`` of a cluster of workers at ``hosts``
    (``host:port`` each, worker 0 first; worker 0 is the chief). Every worker gets the
    same cluster and its own index."""
    hosts = list(hosts)
    if not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ConfigError(f"hosts must be a non-empty list of 'host:port', got {shown(hosts)}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(hosts):
        raise ConfigError(
            f"worker index must be between 0 and {len(hosts) - 1} for {len(hosts)} "
            f"workers, got {index!r}"
        )
    config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _parse(tf_config: str) -> dict[str, Any]:
    try:
        data = json.loads(tf_config)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("cluster", {}), dict):
        raise ConfigError(
            f"TF_CONFIG must be a JSON object with a cluster, got {shown(tf_config)}"
        )
    return data


def workers(tf_config: str | None) -> int:
    """Number of tasks (chief + workers) that ``TF_CONFIG`` names; 0 when unset."""
    if not tf_config:
        return 0
    cluster = _parse(tf_config).get("cluster", {})
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def is_chief(tf_config: str | None) -> bool:
    """Chief = task 'chief', or worker 0 when there is no chief; True without TF_CONFIG."""
    if not tf_config:
        return True
    data = _parse(tf_config)
    task = data.get("task", {})
    if task.get("type") == "chief":
        return True
    has_chief = bool(data.get("cluster", {}).get("chief"))
    return task.get("type", "worker") == "worker" and int(task.get("index", 0)) == 0 and not (
        has_chief
    )


def task_index(tf_config: str | None) -> int:
    """This task's index in its job (``task.index``); 0 without TF_CONFIG."""
    if not tf_config:
        return 0
    return int(_parse(tf_config).get("task", {}).get("index", 0))


def current(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's ``TF_CONFIG`` (from ``environ``, default ``os.environ``); None when
    unset or empty: a process that is not a worker of a multi-worker run."""
    env = os.environ if environ is None else environ
    return env.get(ENV) or None


def coordinator(tf_config: str | None) -> tuple[str, int, int]:
    """The JAX view of the cluster ``TF_CONFIG`` describes: the coordinator's
    ``host:port`` (the chief, else worker 0), the number of processes and this one's id
    (the chief is 0, then the workers in order)."""
    if not tf_config:
        raise ConfigError("a JAX process of a multi-worker run needs TF_CONFIG to find its "
                          "coordinator; start it with `python -m training train`")
    data = _parse(tf_config)
    hosts = [*data["cluster"].get("chief", []), *data["cluster"].get("worker", [])]
    task = data.get("task", {})
    offset = len(data["cluster"].get("chief", [])) if task.get("type") == "worker" else 0
    return hosts[0], len(hosts), offset + int(task.get("index", 0))
