"""Kubernetes specs for a training run: a ConfigMap, a headless Service, an Indexed Job.

``render(cfg, options)`` turns a validated ``RunConfig`` into plain dicts, in apply order:

1. a **ConfigMap** holding ``cfg.to_json()`` as ``config.json`` (mounted read-only at
   ``/etc/training``), so every pod trains on exactly the validated config;
2. a headless **Service** (``clusterIP: None``) selecting the run's pods, so worker ``i``
   is reachable at ``<job>-<i>.<service>.<namespace>.svc:<port>``;
3. an **Indexed Job** of ``runtime.workers`` pods (``completions = parallelism = N``,
   ``subdomain`` = the Service), each running
   ``python -m training.launch.kubernetes exec -- python -m training train --config
   /etc/training/config.json``. The ``exec`` wrapper reads the pod's
   ``JOB_COMPLETION_INDEX`` (set by Kubernetes in Indexed Jobs), builds ``TF_CONFIG``
   with ``tf_config_for_index`` and replaces itself with the training command.

GPU pods ask for ``nvidia.com/gpu`` with a node selector and the ``nvidia.com/gpu``
toleration; TPU pods ask for ``google.com/tpu`` on GKE TPU nodes
(``cloud.google.com/gke-tpu-accelerator`` / ``-topology``). Credentials are never
rendered: pods read them from a named Secret (``secretKeyRef``) or get them from the
platform identity of their service account (GKE workload identity, EKS IRSA).

Names derive from the run id only, so a retry renders the same objects. Nothing here
imports TensorFlow or the ``kubernetes`` client.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training import __version__
from training.config import RunConfig
from training.errors import ConfigError

APP_NAME = "airflow-keras-training"
IMAGE_REPOSITORY = "ghcr.io/example/airflow-keras-training"
GPU_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-gpu"
TPU_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-tpu"
LABEL_PREFIX = "training.example.com"
CONFIG_DIR = "/etc/training"
CONFIG_FILE = "config.json"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
CONTAINER_NAME = "trainer"
PORT_NAME = "grpc"
TRAIN_COMMAND = ("python", "-m", "training", "train", "--config", CONFIG_PATH)
WRAPPER = ("python", "-m", "training.launch.kubernetes", "exec", "--")

# The Secret keys pods read; AWS_SESSION_TOKEN may be absent from the Secret.
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
OPTIONAL_CREDENTIAL_KEYS = ("AWS_SESSION_TOKEN",)
_SECRET_WORDS = ("SECRET", "PASSWORD", "TOKEN", "ACCESS_KEY", "CREDENTIAL", "PRIVATE_KEY")

# Env the exec wrapper reads to rebuild TF_CONFIG inside the pod.
ENV_JOB, ENV_SERVICE, ENV_NAMESPACE = "TRAINING_JOB_NAME", "TRAINING_SERVICE", "TRAINING_NAMESPACE"
ENV_WORKERS, ENV_PORT, ENV_INDEX = "TRAINING_WORKERS", "TRAINING_PORT", "JOB_COMPLETION_INDEX"

MAX_WORKERS = 64  # runtime.workers' maximum
# A pod's hostname is "<job>-<index>" and must stay a 63-character DNS label.
MAX_JOB_NAME = 63 - len(f"-{MAX_WORKERS - 1}")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(r"^\d+(\.\d+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")
_TOPOLOGY = re.compile(r"^[1-9]\d*(x[1-9]\d*){1,2}$")
_TPU_ACCELERATOR = re.compile(r"^tpu-[a-z0-9]+(-[a-z0-9]+)*$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TPU_CHIPS_PER_WORKER = (1, 4, 8)

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def _hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class KubernetesOptions:
    """Where and how the pods run; everything the RunConfig does not say.

    Validated when built: every error names the field, the value and what is allowed.
    """

    namespace: str = "default"
    image: str = ""  # empty: GPU_IMAGE for cpu and gpu runs, TPU_IMAGE for tpu runs
    image_pull_policy: str = "IfNotPresent"
    service_account: str | None = None  # workload identity (GKE) / IRSA (EKS)
    credentials_secret: str | None = None  # Secret with AWS_ACCESS_KEY_ID/_SECRET_ACCESS_KEY
    env: Mapping[str, str] = field(default_factory=dict)  # plain settings, never secrets
    node_selector: Mapping[str, str] = field(default_factory=dict)  # every pod
    gpu_node_selector: Mapping[str, str] = field(
        default_factory=lambda: {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    )
    tolerations: tuple[Mapping[str, Any], ...] = ()  # added to the accelerator's own
    tpu_accelerator: str = "tpu-v5-lite-podslice"  # cloud.google.com/gke-tpu-accelerator
    tpu_topology: str = "2x2"  # cloud.google.com/gke-tpu-topology
    tpu_chips_per_worker: int = 4  # google.com/tpu per pod (chips of one TPU VM)
    cpu: str = "2"  # requested CPU per pod
    memory: str = "8Gi"  # requested (and limited) memory per pod
    port: int = 2222
    backoff_limit: int = 0  # pod failures before the Job fails; Airflow retries the task
    active_deadline_seconds: int | None = 86_400
    ttl_seconds_after_finished: int | None = None
    fail_job_exit_codes: tuple[int, ...] = (2,)  # exit codes that fail at once (2: config)

    def __post_init__(self) -> None:
        for name in ("env", "node_selector", "gpu_node_selector"):
            object.__setattr__(self, name, self._string_map(name, getattr(self, name)))
        if isinstance(self.tolerations, (str, bytes, Mapping)) or not isinstance(
            self.tolerations, (list, tuple)
        ):
            self._fail("tolerations", self.tolerations, "a list of toleration objects")
        object.__setattr__(
            self, "tolerations", tuple(self._toleration(t) for t in self.tolerations)
        )
        if not isinstance(self.fail_job_exit_codes, (list, tuple)) or not all(
            _is_int(c) and 1 <= c <= 255 for c in self.fail_job_exit_codes
        ):
            self._fail("fail_job_exit_codes", self.fail_job_exit_codes,
                       "a list of exit codes between 1 and 255")
        object.__setattr__(self, "fail_job_exit_codes", tuple(self.fail_job_exit_codes))
        self._check()

    # --- validation -----------------------------------------------------------------
    @staticmethod
    def _fail(name: str, value: Any, allowed: str) -> None:
        raise ConfigError(f"KubernetesOptions.{name} must be {allowed}, got {value!r}")

    def _string_map(self, name: str, value: Any) -> dict[str, str]:
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            self._fail(name, value, "a mapping of strings to strings")
        return dict(sorted(value.items()))

    def _toleration(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping) or set(value) - set(_TOLERATION_KEYS):
            self._fail("tolerations", value,
                       "a list of objects with keys " + ", ".join(_TOLERATION_KEYS))
        if value.get("operator", "Equal") not in _TOLERATION_OPERATORS:
            self._fail("tolerations", value,
                       "tolerations with operator " + " or ".join(_TOLERATION_OPERATORS))
        if value.get("effect", "NoSchedule") not in _TOLERATION_EFFECTS:
            self._fail("tolerations", value,
                       "tolerations with effect " + ", ".join(_TOLERATION_EFFECTS))
        if "tolerationSeconds" in value and not _is_int(value["tolerationSeconds"]):
            self._fail("tolerations", value, "tolerations whose tolerationSeconds is an integer")
        for key in ("key", "value"):
            if key in value and not isinstance(value[key], str):
                self._fail("tolerations", value, f"tolerations whose {key} is a string")
        return {k: value[k] for k in _TOLERATION_KEYS if k in value}

    def _check(self) -> None:
        if not isinstance(self.namespace, str) or len(self.namespace) > 63 or not (
            _DNS_LABEL.match(self.namespace)
        ):
            self._fail("namespace", self.namespace,
                       "a DNS-1123 label (a-z, 0-9 and '-', at most 63 characters, "
                       "starting and ending with a letter or digit)")
        if not isinstance(self.image, str) or (self.image and not _IMAGE.match(self.image)):
            self._fail("image", self.image,
                       "an image reference such as registry/name:tag, or '' for the default")
        if self.image_pull_policy not in _PULL_POLICIES:
            self._fail("image_pull_policy", self.image_pull_policy,
                       "one of " + ", ".join(_PULL_POLICIES))
        for name in ("service_account", "credentials_secret"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.match(value)
            ):
                self._fail(name, value,
                           "None or a Kubernetes object name (DNS-1123 subdomain: a-z, 0-9, "
                           "'-' and '.', at most 253 characters)")
        for key in self.env:
            if not _ENV_NAME.match(key):
                self._fail("env", key, "a mapping whose keys are environment variable names")
            if any(word in key.upper() for word in _SECRET_WORDS):
                raise ConfigError(
                    f"KubernetesOptions.env must not carry credentials, got the key {key!r}; "
                    "put them in a Kubernetes Secret and name it in credentials_secret, or "
                    "use service_account for the platform identity"
                )
            if key in (ENV_JOB, ENV_SERVICE, ENV_NAMESPACE, ENV_WORKERS, ENV_PORT, ENV_INDEX,
                       "TF_CONFIG", *CREDENTIAL_KEYS, *OPTIONAL_CREDENTIAL_KEYS):
                self._fail("env", key, "a mapping without keys the launcher sets itself")
        for name in ("node_selector", "gpu_node_selector"):
            for key, value in getattr(self, name).items():
                if not _label_key_ok(key) or len(value) > 63 or not _LABEL_VALUE.match(value):
                    self._fail(name, {key: value},
                               "a mapping of label keys to label values (at most 63 "
                               "characters of A-Z, a-z, 0-9, '-', '_' and '.')")
        if not isinstance(self.tpu_accelerator, str) or not _TPU_ACCELERATOR.match(
            self.tpu_accelerator
        ):
            self._fail("tpu_accelerator", self.tpu_accelerator,
                       "a GKE TPU accelerator such as 'tpu-v5-lite-podslice', 'tpu-v5p-slice' "
                       "or 'tpu-v6e-slice'")
        if not isinstance(self.tpu_topology, str) or not _TOPOLOGY.match(self.tpu_topology):
            self._fail("tpu_topology", self.tpu_topology,
                       "a GKE TPU topology such as '2x2', '2x4' or '2x2x2'")
        if self.tpu_chips_per_worker not in TPU_CHIPS_PER_WORKER or not _is_int(
            self.tpu_chips_per_worker
        ):
            self._fail("tpu_chips_per_worker", self.tpu_chips_per_worker,
                       "one of " + ", ".join(map(str, TPU_CHIPS_PER_WORKER)))
        for name in ("cpu", "memory"):
            value = getattr(self, name)
            # a quantity, and not zero: some digit other than 0 (units hold no digits)
            if not isinstance(value, str) or not _QUANTITY.match(value) or not re.search(
                "[1-9]", value
            ):
                self._fail(name, value,
                           "a positive Kubernetes quantity such as '500m', '2', '8Gi'")
        if not _is_int(self.port) or not 1 <= self.port <= 65535:
            self._fail("port", self.port, "an integer between 1 and 65535")
        if not _is_int(self.backoff_limit) or not 0 <= self.backoff_limit <= 100:
            self._fail("backoff_limit", self.backoff_limit, "an integer between 0 and 100")
        for name in ("active_deadline_seconds", "ttl_seconds_after_finished"):
            value = getattr(self, name)
            low = 1 if name == "active_deadline_seconds" else 0
            if value is not None and (not _is_int(value) or value < low):
                self._fail(name, value, f"None or an integer of at least {low}")

    # --- construction -----------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KubernetesOptions:
        """Build from a JSON object (an Airflow Variable, a file); unknown keys are errors."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"Kubernetes options must be a JSON object, got {type(data).__name__}"
            )
        allowed = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in allowed:
                raise ConfigError(
                    f"unknown Kubernetes option {key!r}; allowed: {', '.join(allowed)}"
                )
        values = dict(data)
        for key in ("tolerations", "fail_job_exit_codes"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tolerations"] = [dict(t) for t in self.tolerations]
        data["fail_job_exit_codes"] = list(self.fail_job_exit_codes)
        return data


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


# --- names ----------------------------------------------------------------------------
def job_name(run_id: str) -> str:
    """The Job (and Service, ConfigMap) name of a run: ``train-<run id>``.

    A DNS-1035 label of at most ``MAX_JOB_NAME`` characters, so ``<job>-<index>`` is a
    valid pod hostname. A run id that had to be changed (case, characters, length) gets
    a hash of the original appended, so different run ids never share a name and the
    same run id always gets the same one.
    """
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError(f"run id must be a non-empty string, got {run_id!r}")
    name = f"train-{run_id}"
    if len(name) <= MAX_JOB_NAME and _DNS_1035.match(name):
        return name
    base = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    suffix = "-" + _hash(run_id)
    head = f"train-{base}"[: MAX_JOB_NAME - len(suffix)].rstrip("-")
    return head + suffix


def run_id_label(run_id: str) -> str:
    """The run id as a label value (at most 63 characters; hashed when it had to change)."""
    if len(run_id) <= 63 and _LABEL_VALUE.match(run_id):
        return run_id
    suffix = "-" + _hash(run_id)
    head = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id)[: 63 - len(suffix)]
    head = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", head)
    return (head + suffix) if head else suffix.lstrip("-")


# --- TF_CONFIG ------------------------------------------------------------------------
def worker_hosts(job: str, service: str, namespace: str, workers: int, port: int) -> list[str]:
    """``host:port`` of every worker: the stable DNS names of the Indexed Job's pods."""
    return [f"{job}-{i}.{service}.{namespace}.svc:{port}" for i in range(workers)]


def tf_config_for_index(job: str, service: str, namespace: str, workers: int, index: int,
                        port: int = 2222) -> str:
    """The ``TF_CONFIG`` of worker ``index`` (0 is the chief): same cluster for every index."""
    if not _is_int(workers) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers must be between 1 and {MAX_WORKERS}, got {workers!r}")
    if not _is_int(index) or not 0 <= index < workers:
        raise ConfigError(
            f"worker index must be between 0 and {workers - 1} for {workers} workers, "
            f"got {index!r}"
        )
    for what, value in (("job", job), ("service", service), ("namespace", namespace)):
        if not isinstance(value, str) or not _DNS_LABEL.match(value) or len(value) > 63:
            raise ConfigError(f"{what} must be a DNS-1123 label, got {value!r}")
    config = {
        "cluster": {"worker": worker_hosts(job, service, namespace, workers, port)},
        "task": {"type": "worker", "index": index},
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


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
            f"{env[ENV_WORKERS]!r} and {env[ENV_PORT]!r}"
        ) from None
    if workers == 1:
        return None
    raw = env.get(ENV_INDEX)
    if raw is None or not raw.isdigit():
        raise ConfigError(
            f"{ENV_INDEX} must be the pod's completion index (set by Kubernetes in "
            f"Indexed Jobs), got {raw!r}"
        )
    return tf_config_for_index(env[ENV_JOB], env[ENV_SERVICE], env[ENV_NAMESPACE], workers,
                               int(raw), port)


# --- rendering ------------------------------------------------------------------------
def gpus_per_worker(cfg: RunConfig) -> int:
    """GPUs one pod asks for: ``runtime.num_gpus``, else the GPUs in ``devices``, else 1."""
    runtime = cfg.runtime
    if runtime.num_gpus:
        return runtime.num_gpus
    named = {d.lower().rsplit(":", 1)[-1] for d in runtime.devices if "gpu" in d.lower()}
    return len(named) or 1


def _check_config(cfg: RunConfig, options: KubernetesOptions) -> None:
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"render needs a RunConfig, got {type(cfg).__name__}")
    runtime = cfg.runtime
    if runtime.workers > 1 and runtime.strategy not in ("auto", "multi_worker", "tpu"):
        raise ConfigError(
            f"runtime.strategy must be auto, multi_worker or tpu for runtime.workers="
            f"{runtime.workers}, got {runtime.strategy!r}; with {runtime.strategy!r} every "
            "worker would train alone"
        )
    if runtime.strategy == "tpu" and runtime.accelerator != "tpu":
        raise ConfigError(
            f"runtime.accelerator must be 'tpu' when runtime.strategy is 'tpu', "
            f"got {runtime.accelerator!r}"
        )
    if runtime.accelerator != "gpu" and (
        runtime.num_gpus or any("gpu" in d.lower() for d in runtime.devices)
    ):
        raise ConfigError(
            f"runtime.accelerator must be 'gpu' when runtime.num_gpus or runtime.devices "
            f"name GPUs, got {runtime.accelerator!r}"
        )
    if runtime.accelerator == "tpu":
        chips = math.prod(int(n) for n in options.tpu_topology.split("x"))
        if chips != runtime.workers * options.tpu_chips_per_worker:
            raise ConfigError(
                f"runtime.workers must be the TPU slice's hosts: topology "
                f"{options.tpu_topology!r} has {chips} chips, which is "
                f"{chips / options.tpu_chips_per_worker:g} workers of "
                f"{options.tpu_chips_per_worker} chips (tpu_chips_per_worker), "
                f"got {runtime.workers}"
            )


def _labels(cfg: RunConfig, job: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": "training",
        "app.kubernetes.io/version": __version__,
        f"{LABEL_PREFIX}/run-id": run_id_label(cfg.run_id),
        f"{LABEL_PREFIX}/accelerator": cfg.runtime.accelerator,
    }


def _selector(job: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": job}


def _metadata(cfg: RunConfig, job: str, namespace: str) -> dict[str, Any]:
    return {
        "name": job,
        "namespace": namespace,
        "labels": _labels(cfg, job),
        "annotations": {
            f"{LABEL_PREFIX}/run-id": cfg.run_id,
            f"{LABEL_PREFIX}/config-fingerprint": cfg.fingerprint(),
        },
    }


def _env(cfg: RunConfig, options: KubernetesOptions, job: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": ENV_JOB, "value": job},
        {"name": ENV_SERVICE, "value": job},
        {"name": ENV_NAMESPACE, "value": options.namespace},
        {"name": ENV_WORKERS, "value": str(cfg.runtime.workers)},
        {"name": ENV_PORT, "value": str(options.port)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    env += [{"name": k, "value": v} for k, v in options.env.items()]
    if options.credentials_secret:
        for key in CREDENTIAL_KEYS + OPTIONAL_CREDENTIAL_KEYS:
            ref = {"name": options.credentials_secret, "key": key}
            if key in OPTIONAL_CREDENTIAL_KEYS:
                ref["optional"] = True
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return env


def _scheduling(cfg: RunConfig, options: KubernetesOptions) -> dict[str, Any]:
    """Resources, node selector and tolerations for the run's accelerator."""
    requests = {"cpu": options.cpu, "memory": options.memory}
    limits = {"memory": options.memory}
    selector = dict(options.node_selector)
    tolerations = [dict(t) for t in options.tolerations]
    accelerator = cfg.runtime.accelerator
    if accelerator == "gpu":
        limits["nvidia.com/gpu"] = str(gpus_per_worker(cfg))
        selector.update(options.gpu_node_selector)
        tolerations.insert(0, dict(GPU_TOLERATION))
    elif accelerator == "tpu":
        chips = str(options.tpu_chips_per_worker)
        requests["google.com/tpu"] = limits["google.com/tpu"] = chips
        selector["cloud.google.com/gke-tpu-accelerator"] = options.tpu_accelerator
        selector["cloud.google.com/gke-tpu-topology"] = options.tpu_topology
        tolerations.insert(0, dict(TPU_TOLERATION))
    return {
        "resources": {"requests": requests, "limits": limits},
        "node_selector": dict(sorted(selector.items())),
        "tolerations": tolerations,
    }


def default_image(accelerator: str) -> str:
    """The project's training image for an accelerator (the GPU image also runs on CPU)."""
    return TPU_IMAGE if accelerator == "tpu" else GPU_IMAGE


def render(cfg: RunConfig, options: KubernetesOptions | None = None) -> list[dict[str, Any]]:
    """ConfigMap, Service and Indexed Job for ``cfg``, in apply order, as plain dicts."""
    options = KubernetesOptions() if options is None else options
    if not isinstance(options, KubernetesOptions):
        raise ConfigError(f"options must be KubernetesOptions, got {type(options).__name__}")
    _check_config(cfg, options)
    job = job_name(cfg.run_id)
    namespace = options.namespace
    workers = cfg.runtime.workers
    labels = _labels(cfg, job)

    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(cfg, job, namespace),
        "data": {CONFIG_FILE: cfg.to_json()},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(cfg, job, namespace),
        "spec": {
            "clusterIP": "None",
            "selector": _selector(job),
            # Workers dial each other while starting, before any readiness.
            "publishNotReadyAddresses": True,
            "ports": [{"name": PORT_NAME, "port": options.port, "targetPort": options.port,
                       "protocol": "TCP"}],
        },
    }
    sched = _scheduling(cfg, options)
    container = {
        "name": CONTAINER_NAME,
        "image": options.image or default_image(cfg.runtime.accelerator),
        "imagePullPolicy": options.image_pull_policy,
        "command": [*WRAPPER, *TRAIN_COMMAND],
        "env": _env(cfg, options, job),
        "ports": [{"name": PORT_NAME, "containerPort": options.port, "protocol": "TCP"}],
        "resources": sched["resources"],
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": job,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": job}}],
    }
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    if sched["node_selector"]:
        pod_spec["nodeSelector"] = sched["node_selector"]
    if sched["tolerations"]:
        pod_spec["tolerations"] = sched["tolerations"]

    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": workers,
        "parallelism": workers,
        "backoffLimit": options.backoff_limit,
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if options.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = options.active_deadline_seconds
    if options.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = options.ttl_seconds_after_finished
    rules: list[dict[str, Any]] = []
    if options.fail_job_exit_codes:
        rules.append({"action": "FailJob", "onExitCodes": {
            "containerName": CONTAINER_NAME, "operator": "In",
            "values": sorted(set(options.fail_job_exit_codes))}})
    # A preempted or evicted pod does not count against backoffLimit.
    rules.append({"action": "Ignore",
                  "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]})
    job_spec["podFailurePolicy"] = {"rules": rules}
    job_obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(cfg, job, namespace),
        "spec": job_spec,
    }
    return [config_map, service, job_obj]


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """A multi-document YAML stream for ``kubectl apply -f -``.

    Multi-line strings (the config) are written in block style so they stay readable.
    PyYAML is imported here: the pods' ``exec`` wrapper does not need it.
    """
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, represent_str)
    return yaml.dump_all([dict(o) for o in objects], Dumper=Dumper, sort_keys=False,
                         default_flow_style=False, explicit_start=True)


# --- command line (inside pods, and for rendering by hand) ----------------------------
def _exec(command: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Set TF_CONFIG for this pod and replace the process with ``command``."""
    if not command:
        raise ConfigError("exec needs a command after '--', got none")
    env = dict(os.environ if environ is None else environ)
    tf_config = tf_config_from_env(env)
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    sys.stdout.flush()
    os.execvpe(command[0], list(command), env)


def _render_command(args: argparse.Namespace) -> str:
    cfg = RunConfig.from_file(args.config) if args.config else RunConfig()
    data: dict[str, Any] = {}
    if args.options:
        try:
            with open(args.options) as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read Kubernetes options {args.options!r}: {exc}") from None
    for key in ("namespace", "image", "service_account", "credentials_secret"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    objects = render(cfg, KubernetesOptions.from_dict(data))
    if args.output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2)
    return to_yaml(objects)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.launch.kubernetes",
                                     description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("tf-config", help="Print this pod's TF_CONFIG (empty for one worker).")
    run = sub.add_parser("exec", help="Set TF_CONFIG for this pod, then exec the command.")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    render_cmd = sub.add_parser("render", help="Print the run's Kubernetes objects.")
    render_cmd.add_argument("--config", metavar="FILE", help="JSON run config")
    render_cmd.add_argument("--options", metavar="FILE", help="JSON KubernetesOptions")
    for key in ("namespace", "image", "service_account", "credentials_secret"):
        render_cmd.add_argument(f"--{key.replace('_', '-')}", dest=key, default=None)
    render_cmd.add_argument("--output", choices=["yaml", "json"], default="yaml")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from training.cli import run_command

    args = build_parser().parse_args(argv)

    def command() -> int:
        if args.command == "tf-config":
            print(tf_config_from_env() or "")
        elif args.command == "exec":
            _exec(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
        else:
            print(_render_command(args), end="")
        return 0

    return run_command(command)
