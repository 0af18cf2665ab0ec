"""Where a deployment keeps things: the settings a platform team sets, not a run.

A run's settings (the trigger form, a conf, a config file) say what to train; the
deployment says where data, runs and the model store live, which Airflow connections
hold the credentials, which Celery queues the accelerators listen on, and how the
nightly DAG is scheduled. They come from the environment of the Airflow components
(``TRAINING_*``, docs/configuration.md) and are read in one place, ``Deployment.
from_env``: the tasks, the Models page and preflight use what it returns, so two of them
never disagree about where the store is. The DAG files and the routing policy, which run
while Airflow parses DAGs and queues tasks, read only their own variables through the
functions at the end (``schedule_from_env``, ``queue_from_env``, ``landing_from_env``)
with the same defaults, so a wrong store URI fails the first task that needs the store
and never the parsing of every DAG.

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
- ``TRAINING_SWEEP_STORAGE``: where sweeps keep their Optuna studies, a SQLAlchemy URL
  without a password (``postgresql+psycopg2://user@host:5432/db``; unset: a SQLite file
  under the run directories); the password, if the database wants one, comes from
  ``TRAINING_SWEEP_STORAGE_PASSWORD`` (or libpq's ``PGPASSWORD``/``~/.pgpass``) in the
  process that opens the study, never from a config (docs/sweeps.md);
- ``TRAINING_AWS_CONN_ID``: the Airflow connection for ``s3://`` locations (``aws_default``);
- ``TRAINING_K8S_CONN_ID``: the Kubernetes connection (``kubernetes_default``); the
  other ``TRAINING_K8S_*`` variables are the Job's options (``kubernetes_env``, read by
  ``training.launch.kubernetes.KubernetesOptions.from_env``);
- ``TRAINING_GPU_QUEUE``, ``TRAINING_TPU_QUEUE``: the Celery queues ``train`` goes to
  for a GPU or TPU run (``gpu``, ``tpu``);
- ``TRAINING_DEADLINE_MINUTES``: a ``keras_retrain`` run not finished this long after it
  was queued sends a "late" alert (360; set and empty: no deadline);
- ``TRAINING_SCHEDULE``: the nightly cron of ``keras_retrain`` (``0 3 * * *``; set and
  empty: no cron, only landings start runs);
- ``TRAINING_ALERT_EMAIL_CONN_ID``, ``TRAINING_ALERT_WEBHOOK_CONN_ID``: the Airflow
  connections alerts are sent through, an SMTP server and a JSON webhook
  (``training_alerts_email``, ``training_alerts_webhook``; a connection that does not
  exist sends nothing, docs/alerts.md);
- ``TRAINING_MLFLOW_TRACKING_URI`` (else ``MLFLOW_TRACKING_URI``): the MLflow tracking
  server every run, trial and version is mirrored to (``http(s)://host:port``, a
  ``file:`` store or a path; unset or empty: tracking off, MLflow never imported); a
  password inside it is refused (MLflow's client reads ``MLFLOW_TRACKING_PASSWORD``,
  docs/tracking.md);
- ``TRAINING_SERVING_KEEP``: how many integer-numbered folders ``serving/<name>/`` keeps
  for TF Serving, KServe and Triton (5; docs/serving.md);
- ``TRAINING_RETRY_DELAY_SECONDS``: the DAGs' ``retry_delay`` (60; the tests set seconds);
- ``TRAINING_DEFERRABLE``: whether tasks that wait on work outside Airflow (a Kubernetes
  Job, a sweep's lane) hand the wait to the triggerer (``true``; as Airflow's
  ``[operators] default_deferrable``, docs/kubernetes-airflow.md).

Why one module of about 310 lines: it is the list above, each variable read with its
default and its check in one place, so that a platform team (and docs/configuration.md)
finds every setting here; split, two readers of the environment could disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from training.errors import ConfigError, StorageError
from training.registry.uri import StoreURI

DEFAULT_SCHEDULE = "0 3 * * *"
DEFAULT_DEADLINE_MINUTES = 360
DEFAULT_SERVING_KEEP = 5
DEFAULT_RETRY_DELAY_SECONDS = 60
K8S_PREFIX = "TRAINING_K8S_"


@dataclass(frozen=True)
class Deployment:
    """The deployment's paths, store, connections, queues, schedule and alert
    connections (module doc)."""

    data_dir: Path
    staging_dir: str
    output_dir: str
    store: StoreURI
    max_version_mb: int | None = None
    sweep_storage: str = ""
    incoming_dir: str = ""
    data_uri: str = ""
    aws_conn_id: str = "aws_default"
    kubernetes_conn_id: str = "kubernetes_default"
    queues: Mapping[str, str] = field(default_factory=lambda: {"gpu": "gpu", "tpu": "tpu"})
    schedule: str = DEFAULT_SCHEDULE
    kubernetes_env: Mapping[str, str] = field(default_factory=dict)
    alert_email_conn_id: str = "training_alerts_email"
    alert_webhook_conn_id: str = "training_alerts_webhook"
    tracking_uri: str = ""
    serving_keep: int = DEFAULT_SERVING_KEEP

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Deployment:
        """The deployment this process runs in (``env``, default ``os.environ``); a
        ConfigError names the variable, the value and what is allowed."""
        read = _Environment(env)
        try:
            store = StoreURI.parse(read.get("TRAINING_STORE_URI",
                                            os.fspath(read.data_dir / "store")),
                                   field="TRAINING_STORE_URI")
        except StorageError as exc:
            raise ConfigError(str(exc)) from None
        limit = read.env.get("TRAINING_MAX_VERSION_MB") or None
        if limit is not None:
            try:
                limit = int(limit)
            except ValueError:
                raise ConfigError("TRAINING_MAX_VERSION_MB must be a whole number of MiB, "
                                  f"got {limit!r}") from None
        incoming_dir, data_uri = landing_from_env(env)
        return cls(
            data_dir=read.data_dir,
            staging_dir=read.get("TRAINING_STAGING_DIR", os.fspath(read.data_dir / "datasets")),
            output_dir=read.get("TRAINING_OUTPUT_DIR", os.fspath(read.data_dir / "runs")),
            store=store,
            max_version_mb=limit,
            sweep_storage=read.env.get("TRAINING_SWEEP_STORAGE", ""),
            incoming_dir=incoming_dir,
            data_uri=data_uri,
            aws_conn_id=aws_conn_id_from_env(env),
            kubernetes_conn_id=read.get("TRAINING_K8S_CONN_ID", "kubernetes_default"),
            queues=_queues(read),
            schedule=schedule_from_env(env),
            kubernetes_env={k: v for k, v in read.env.items() if k.startswith(K8S_PREFIX)},
            alert_email_conn_id=alert_conn_ids_from_env(env)[0],
            alert_webhook_conn_id=alert_conn_ids_from_env(env)[1],
            tracking_uri=tracking_uri_from_env(env),
            serving_keep=serving_keep_from_env(env),
        )

    def run_settings(self) -> dict[str, Any]:
        """The run config's deployment fields (``storage``, ``dataset.staging_dir``), as
        flat conf keys."""
        settings: dict[str, Any] = {"staging_dir": self.staging_dir,
                                    "output_dir": self.output_dir,
                                    "store_uri": self.store.text}
        if self.max_version_mb is not None:
            settings["max_version_mb"] = self.max_version_mb
        if self.sweep_storage:
            settings["sweep_storage"] = self.sweep_storage
        return settings

    def queue_for(self, accelerator: Any) -> str | None:
        """The Celery queue of a ``train`` task on ``accelerator``; None: its own."""
        return self.queues.get(accelerator) if isinstance(accelerator, str) else None


# What a DAG file and the scheduler's policy read. They run while Airflow parses DAGs
# and queues tasks, so they read only their own variables, none of which can be wrong:
# a typo in TRAINING_STORE_URI fails the first task that needs the store, with its
# message, and never the parsing of every DAG or the queueing of every task.


class _Environment:
    """Reads ``TRAINING_*`` variables; empty counts as unset."""

    def __init__(self, env: Mapping[str, str] | None) -> None:
        self.env = os.environ if env is None else env
        home = Path(self.get("AIRFLOW_HOME", os.fspath(Path.home() / "airflow")))
        self.data_dir = Path(self.get("TRAINING_DATA_DIR", os.fspath(home / "training")))

    def get(self, name: str, default: str) -> str:
        return self.env.get(name) or default


def _queues(read: _Environment) -> dict[str, str]:
    return {"gpu": read.get("TRAINING_GPU_QUEUE", "gpu"),
            "tpu": read.get("TRAINING_TPU_QUEUE", "tpu")}


def schedule_from_env(env: Mapping[str, str] | None = None) -> str:
    """The nightly cron of ``keras_retrain`` (set and empty: none)."""
    return _Environment(env).env.get("TRAINING_SCHEDULE", DEFAULT_SCHEDULE)


def queue_from_env(accelerator: Any, env: Mapping[str, str] | None = None) -> str | None:
    """The Celery queue of a ``train`` task on ``accelerator``; None: its own."""
    return _queues(_Environment(env)).get(accelerator) if isinstance(accelerator, str) \
        else None


def landing_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Where ``land_labelled_data`` reads a day's images and where it lands them."""
    read = _Environment(env)
    return (read.get("TRAINING_INCOMING_DIR", os.fspath(read.data_dir / "incoming")),
            read.get("TRAINING_DATA_URI", os.fspath(read.data_dir / "labelled")))


def aws_conn_id_from_env(env: Mapping[str, str] | None = None) -> str:
    """The Airflow connection for ``s3://`` locations."""
    return _Environment(env).get("TRAINING_AWS_CONN_ID", "aws_default")


def alert_conn_ids_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The connections alerts go through: (e-mail, webhook). Read alone by an alert sent
    while another setting is wrong (that may be what it reports)."""
    read = _Environment(env)
    return (read.get("TRAINING_ALERT_EMAIL_CONN_ID", "training_alerts_email"),
            read.get("TRAINING_ALERT_WEBHOOK_CONN_ID", "training_alerts_webhook"))


def deadline_from_env(env: Mapping[str, str] | None = None) -> timedelta | None:
    """How long after it is queued a ``keras_retrain`` run must have finished
    (``TRAINING_DEADLINE_MINUTES``, default 360; set and empty: no deadline). A value
    that is not a whole number of minutes from 1 is a ConfigError naming it: the DAG
    file reads it, so the DAG shows it as its import error."""
    read = _Environment(env)
    text = read.env.get("TRAINING_DEADLINE_MINUTES", str(DEFAULT_DEADLINE_MINUTES))
    if text == "":
        return None
    try:
        minutes = int(text)
        if minutes < 1:
            raise ValueError
    except ValueError:
        raise ConfigError("TRAINING_DEADLINE_MINUTES must be a whole number of minutes from 1 "
                          f"(or empty: no deadline), got {text!r}") from None
    return timedelta(minutes=minutes)


def sweep_password_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The sweep's study database password (``TRAINING_SWEEP_STORAGE_PASSWORD``), read in
    the process that opens the study, handed to the driver at connect time and kept out
    of every config, log and record; None: no password (or libpq's own ways)."""
    return _Environment(env).env.get("TRAINING_SWEEP_STORAGE_PASSWORD") or None


def _whole_number(read: _Environment, name: str, default: int, unit: str) -> int:
    text = read.get(name, str(default))
    try:
        value = int(text)
        if value < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{name} must be a whole number of {unit} from 1, "
                          f"got {text!r}") from None
    return value


def serving_keep_from_env(env: Mapping[str, str] | None = None) -> int:
    """How many folders the serving layout keeps (``TRAINING_SERVING_KEEP``, default 5)."""
    return _whole_number(_Environment(env), "TRAINING_SERVING_KEEP", DEFAULT_SERVING_KEEP,
                         "folders")


def retry_delay_from_env(env: Mapping[str, str] | None = None) -> timedelta:
    """The DAGs' ``retry_delay`` (``TRAINING_RETRY_DELAY_SECONDS``, default 60): a DAG
    file reads it, so a wrong value is the DAG's import error, naming it."""
    return timedelta(seconds=_whole_number(_Environment(env), "TRAINING_RETRY_DELAY_SECONDS",
                                           DEFAULT_RETRY_DELAY_SECONDS, "seconds"))


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def deferrable_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether waiting tasks defer to the triggerer (``TRAINING_DEFERRABLE``, default
    true); a word that is not a boolean is a ConfigError naming it."""
    text = _Environment(env).get("TRAINING_DEFERRABLE", "true")
    if text.strip().lower() in _TRUE:
        return True
    if text.strip().lower() in _FALSE:
        return False
    raise ConfigError(f"TRAINING_DEFERRABLE must be a boolean ({', '.join(_TRUE)} or "
                      f"{', '.join(_FALSE)}), got {text!r}")


TRACKING_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "databricks")


def tracking_uri_from_env(env: Mapping[str, str] | None = None) -> str:
    """The MLflow tracking URI (``TRAINING_MLFLOW_TRACKING_URI``, else
    ``MLFLOW_TRACKING_URI``; empty: off). A URI MLflow cannot take, or one that holds a
    password, is a ConfigError naming the variable (the password belongs in
    ``MLFLOW_TRACKING_PASSWORD``, never in a URI that logs and records repeat)."""
    read = _Environment(env)
    name = "TRAINING_MLFLOW_TRACKING_URI"
    text = read.env.get(name, "")
    if not text:
        name, text = "MLFLOW_TRACKING_URI", read.env.get("MLFLOW_TRACKING_URI", "")
    text = text.strip()
    if not text:
        return ""
    if text.startswith("/"):
        return text
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise ConfigError(f"{name} is not a URI ({exc}), got {text!r}") from None
    scheme = parts.scheme.split("+")[0]
    if scheme not in TRACKING_SCHEMES or (scheme in ("http", "https") and not parts.hostname):
        raise ConfigError(f"{name} must be an http(s)://host[:port] tracking server, a "
                          f"file: store or an absolute path (or empty: tracking off), "
                          f"got {text!r}")
    if parts.password is not None:
        shown = text.replace(f":{parts.password}@", ":***@")
        raise ConfigError(f"{name} must not hold a password (set MLFLOW_TRACKING_PASSWORD "
                          f"in the process's environment instead), got {shown!r}")
    return text
