"""Where a deployment keeps things: the settings a platform team sets, not a run.

A run's settings (the trigger form, a conf, a config file) say what to train; the
deployment says where data, runs and the model store live, which Airflow connections
hold the credentials, which Celery queues the accelerators listen on, and how the
nightly DAG is scheduled. They come from the environment of the Airflow components
(``TRAINING_*``, docs/configuration.md) and are read in one place, ``Deployment.
from_env``: the tasks, the Models page, the landing DAG and the routing policy all use
what it returns, so two of them never disagree about where the store is.

Variables (empty counts as unset):

- ``TRAINING_DATA_DIR``: root of the directories below (default ``$AIRFLOW_HOME/training``);
- ``TRAINING_STAGING_DIR``: staged datasets (``<data dir>/datasets``);
- ``TRAINING_OUTPUT_DIR``: run directories (``<data dir>/runs``);
- ``TRAINING_STORE_URI``: the model store, ``s3://bucket/prefix`` or a path
  (``<data dir>/store``), parsed once (``training.registry.uri.StoreURI``);
- ``TRAINING_MAX_VERSION_MB``: the largest version the registry accepts (the config's
  default, 10240, when unset);
- ``TRAINING_INCOMING_DIR``, ``TRAINING_DATA_URI``: where ``land_labelled_data`` reads
  a day's images and where it lands them (``<data dir>/incoming``, ``<data dir>/labelled``);
- ``TRAINING_AWS_CONN_ID``: the Airflow connection for ``s3://`` locations (``aws_default``);
- ``TRAINING_K8S_CONN_ID``: the Kubernetes connection (``kubernetes_default``); the
  other ``TRAINING_K8S_*`` variables are the Job's options (``kubernetes_env``, read by
  ``training.launch.kubernetes.KubernetesOptions.from_env``);
- ``TRAINING_GPU_QUEUE``, ``TRAINING_TPU_QUEUE``: the Celery queues ``train`` goes to
  for a GPU or TPU run (``gpu``, ``tpu``);
- ``TRAINING_SCHEDULE``: the nightly cron of ``keras_retrain`` (``0 3 * * *``; set and
  empty: no cron, only landings start runs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.errors import ConfigError, StorageError
from training.registry.uri import StoreURI

DEFAULT_SCHEDULE = "0 3 * * *"
K8S_PREFIX = "TRAINING_K8S_"


@dataclass(frozen=True)
class Deployment:
    """The deployment's paths, store, connections, queues and schedule (module doc)."""

    data_dir: Path
    staging_dir: str
    output_dir: str
    store: StoreURI
    max_version_mb: int | None = None
    incoming_dir: str = ""
    data_uri: str = ""
    aws_conn_id: str = "aws_default"
    kubernetes_conn_id: str = "kubernetes_default"
    queues: Mapping[str, str] = field(default_factory=lambda: {"gpu": "gpu", "tpu": "tpu"})
    schedule: str = DEFAULT_SCHEDULE
    kubernetes_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Deployment:
        """The deployment this process runs in (``env``, default ``os.environ``); a
        ConfigError names the variable, the value and what is allowed."""
        env = os.environ if env is None else env

        def get(name: str, default: str) -> str:
            return env.get(name) or default

        home = Path(get("AIRFLOW_HOME", os.fspath(Path.home() / "airflow")))
        data = Path(get("TRAINING_DATA_DIR", os.fspath(home / "training")))
        try:
            store = StoreURI.parse(get("TRAINING_STORE_URI", os.fspath(data / "store")),
                                   field="TRAINING_STORE_URI")
        except StorageError as exc:
            raise ConfigError(str(exc)) from None
        limit = env.get("TRAINING_MAX_VERSION_MB") or None
        if limit is not None:
            try:
                limit = int(limit)
            except ValueError:
                raise ConfigError("TRAINING_MAX_VERSION_MB must be a whole number of MiB, "
                                  f"got {env['TRAINING_MAX_VERSION_MB']!r}") from None
        return cls(
            data_dir=data,
            staging_dir=get("TRAINING_STAGING_DIR", os.fspath(data / "datasets")),
            output_dir=get("TRAINING_OUTPUT_DIR", os.fspath(data / "runs")),
            store=store,
            max_version_mb=limit,
            incoming_dir=get("TRAINING_INCOMING_DIR", os.fspath(data / "incoming")),
            data_uri=get("TRAINING_DATA_URI", os.fspath(data / "labelled")),
            aws_conn_id=get("TRAINING_AWS_CONN_ID", "aws_default"),
            kubernetes_conn_id=get("TRAINING_K8S_CONN_ID", "kubernetes_default"),
            queues={"gpu": get("TRAINING_GPU_QUEUE", "gpu"),
                    "tpu": get("TRAINING_TPU_QUEUE", "tpu")},
            schedule=env.get("TRAINING_SCHEDULE", DEFAULT_SCHEDULE),
            kubernetes_env={k: v for k, v in env.items() if k.startswith(K8S_PREFIX)},
        )

    def run_settings(self) -> dict[str, Any]:
        """The run config's deployment fields (``storage``, ``dataset.staging_dir``), as
        flat conf keys."""
        settings: dict[str, Any] = {"staging_dir": self.staging_dir,
                                    "output_dir": self.output_dir,
                                    "store_uri": self.store.text}
        if self.max_version_mb is not None:
            settings["max_version_mb"] = self.max_version_mb
        return settings

    def queue_for(self, accelerator: Any) -> str | None:
        """The Celery queue of a ``train`` task on ``accelerator``; None: its own."""
        return self.queues.get(accelerator) if isinstance(accelerator, str) else None
