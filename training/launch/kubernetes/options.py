"""``KubernetesOptions``: where and how a run's pods run, and how the launch follows them.

One frozen object, validated when built; every error names the option, the value
received and what is allowed (``KubernetesOptions.port must be an integer between 1
and 65535, got 0``). It is read from a JSON object (``from_dict``: an options file, an
Airflow worker's environment) or from the ``TRAINING_K8S_*`` variables (``from_env``),
whose errors also name the variable.

Nothing here is a secret, and nothing may be: ``env`` refuses keys that look like
credentials; pods get them from the Secret named in ``credentials_secret`` or from the
platform identity of ``service_account``.

Just over 300 lines on purpose: the fields and the checks behind their errors are one
idea; apart, a new field (``kueue_queue`` was the last) could lose its check.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from training import backend
from training.errors import CONFIG_ERROR_EXIT, ConfigError, shown
from training.launch.kubernetes.names import (
    DNS_LABEL_WORDS,
    OBJECT_NAME_WORDS,
    is_dns_label,
    is_label_key,
    is_label_value,
    is_object_name,
)
from training.launch.kubernetes.pod import POD_ENV

# The Secret keys pods read; AWS_SESSION_TOKEN may be absent from the Secret.
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# The MLflow server's login, when it wants one (``with_tracking``).
OPTIONAL_CREDENTIAL_KEYS = ("AWS_SESSION_TOKEN", "MLFLOW_TRACKING_USERNAME",
                            "MLFLOW_TRACKING_PASSWORD")
TRACKING_ENV = "TRAINING_MLFLOW_TRACKING_URI"
_SECRET_WORDS = ("SECRET", "PASSWORD", "TOKEN", "ACCESS_KEY", "CREDENTIAL", "PRIVATE_KEY")

# from_env: a JSON object of options, and single options that override it.
ENV_OPTIONS = "TRAINING_K8S_OPTIONS"
ENV_SHARED_PVC = "TRAINING_K8S_SHARED_PVC"
ENV_FIELDS = {
    "TRAINING_K8S_NAMESPACE": "namespace",
    "TRAINING_K8S_IMAGE": "image",
    "TRAINING_K8S_SERVICE_ACCOUNT": "service_account",
    "TRAINING_K8S_CREDENTIALS_SECRET": "credentials_secret",
    ENV_SHARED_PVC: "shared_volume_claim",
    "TRAINING_K8S_SHARED_MOUNT": "shared_mount_path",
    "TRAINING_K8S_POLL_INTERVAL": "poll_interval",
    "TRAINING_K8S_FAILURE_LINES": "failure_lines",
    "TRAINING_K8S_KUEUE_QUEUE": "kueue_queue",
}
_ENV_NUMBERS = {"poll_interval": float, "failure_lines": int}

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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(name: str, value: Any, allowed: str) -> NoReturn:
    error = ConfigError(f"KubernetesOptions.{name} must be {allowed}, got {shown(value)}")
    error.option = name  # type: ignore[attr-defined]  # from_env names the variable
    raise error


@dataclass(frozen=True)
class KubernetesOptions:
    """Everything about a Kubernetes run that the RunConfig does not say."""

    namespace: str = "default"
    image: str = ""  # empty: the project's GPU image for cpu and gpu runs, TPU for tpu
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
    # exit codes that fail the Job at once: a bad config (training.entry)
    fail_job_exit_codes: tuple[int, ...] = (CONFIG_ERROR_EXIT,)
    kueue_queue: str | None = None  # Kueue LocalQueue: the Job waits suspended until admitted
    shared_volume_claim: str | None = None  # ReadWriteMany PVC holding output/staging dirs
    shared_mount_path: str | None = None  # where it is mounted; None: their common parent
    poll_interval: float = 15.0  # seconds between two looks at the Job
    failure_lines: int = 20  # log lines of the failed pod quoted in the error

    def __post_init__(self) -> None:
        for name in ("env", "node_selector", "gpu_node_selector"):
            object.__setattr__(self, name, _string_map(name, getattr(self, name)))
        if isinstance(self.tolerations, (str, bytes, Mapping)) or not isinstance(
            self.tolerations, (list, tuple)
        ):
            _fail("tolerations", self.tolerations, "a list of toleration objects")
        object.__setattr__(self, "tolerations", tuple(_toleration(t) for t in self.tolerations))
        if not isinstance(self.fail_job_exit_codes, (list, tuple)) or not all(
            _is_int(c) and 1 <= c <= 255 for c in self.fail_job_exit_codes
        ):
            _fail("fail_job_exit_codes", self.fail_job_exit_codes,
                  "a list of exit codes between 1 and 255")
        object.__setattr__(self, "fail_job_exit_codes", tuple(self.fail_job_exit_codes))
        _check_pods(self)
        _check_job(self)
        _check_launch(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KubernetesOptions:
        """Build from a JSON object (a file, a variable); unknown keys are errors."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"Kubernetes options must be a JSON object, got {type(data).__name__}"
            )
        allowed = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in allowed:
                error = ConfigError(
                    f"unknown Kubernetes option {shown(key)}; allowed: {', '.join(allowed)}"
                )
                error.option = key  # type: ignore[attr-defined]
                raise error
        values = dict(data)
        for key in ("tolerations", "fail_job_exit_codes"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        return cls(**values)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KubernetesOptions:
        """From ``TRAINING_K8S_OPTIONS`` (a JSON object of options) and the single options
        of ``ENV_FIELDS``, which override it. Empty variables count as unset; an error
        names the variable that set the option."""
        data: dict[str, Any] = {}
        raw = env.get(ENV_OPTIONS, "").strip()
        if raw:
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{ENV_OPTIONS} must be a JSON object of Kubernetes "
                                  f"options, got invalid JSON ({exc})") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{ENV_OPTIONS} must be a JSON object of Kubernetes "
                                  f"options, got {type(data).__name__}")
        source = dict.fromkeys(data, ENV_OPTIONS)
        for variable, name in ENV_FIELDS.items():
            value = env.get(variable, "")
            if not value:
                continue
            if name in _ENV_NUMBERS:
                try:
                    value = _ENV_NUMBERS[name](value)
                except ValueError:
                    raise ConfigError(f"{variable} must be a number, got {shown(value)}") from None
            data[name], source[name] = value, variable
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            variable = source.get(getattr(exc, "option", None))
            if variable is None:
                raise
            raise ConfigError(f"{variable}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tolerations"] = [dict(t) for t in self.tolerations]
        data["fail_job_exit_codes"] = list(self.fail_job_exit_codes)
        return data


def with_tracking(options: KubernetesOptions, uri: str) -> KubernetesOptions:
    """``options`` whose pods track to the deployment's MLflow server ``uri`` (the
    chief pod logs each epoch to the run: ``training.tracking``), given as the pods'
    ``TRAINING_MLFLOW_TRACKING_URI``. Only a server (``http(s)://``) is handed on: a
    local store is the worker's own disk, which no pod sees. An ``env`` of the options
    that names the variable wins: the address by which the pods reach the server."""
    if not uri.startswith(("http://", "https://")) or TRACKING_ENV in options.env:
        return options
    return dataclasses.replace(options, env={**options.env, TRACKING_ENV: uri})


# --- validation -----------------------------------------------------------------------
def _string_map(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        _fail(name, value, "a mapping of strings to strings")
    return dict(sorted(value.items()))


def _toleration(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or set(value) - set(_TOLERATION_KEYS):
        _fail("tolerations", value, "a list of objects with keys " + ", ".join(_TOLERATION_KEYS))
    if value.get("operator", "Equal") not in _TOLERATION_OPERATORS:
        _fail("tolerations", value,
              "tolerations with operator " + " or ".join(_TOLERATION_OPERATORS))
    if value.get("effect", "NoSchedule") not in _TOLERATION_EFFECTS:
        _fail("tolerations", value, "tolerations with effect " + ", ".join(_TOLERATION_EFFECTS))
    if "tolerationSeconds" in value and not _is_int(value["tolerationSeconds"]):
        _fail("tolerations", value, "tolerations whose tolerationSeconds is an integer")
    for key in ("key", "value"):
        if key in value and not isinstance(value[key], str):
            _fail("tolerations", value, f"tolerations whose {key} is a string")
    return {k: value[k] for k in _TOLERATION_KEYS if k in value}


def _check_pods(o: KubernetesOptions) -> None:
    """Where the pods run, what they run and what they are given."""
    if not is_dns_label(o.namespace):
        _fail("namespace", o.namespace, DNS_LABEL_WORDS)
    if not isinstance(o.image, str) or (o.image and not _IMAGE.match(o.image)):
        _fail("image", o.image,
              "an image reference such as registry/name:tag, or '' for the default")
    if o.image_pull_policy not in _PULL_POLICIES:
        _fail("image_pull_policy", o.image_pull_policy, "one of " + ", ".join(_PULL_POLICIES))
    for name in ("service_account", "credentials_secret"):
        value = getattr(o, name)
        if value is not None and not is_object_name(value):
            _fail(name, value, f"None or a Kubernetes object name ({OBJECT_NAME_WORDS})")
    for key in o.env:
        if not _ENV_NAME.match(key):
            _fail("env", key, "a mapping whose keys are environment variable names")
        if any(word in key.upper() for word in _SECRET_WORDS):
            error = ConfigError(
                f"KubernetesOptions.env must not carry credentials, got the key {key!r}; "
                "put them in a Kubernetes Secret and name it in credentials_secret, or "
                "use service_account for the platform identity"
            )
            error.option = "env"  # type: ignore[attr-defined]
            raise error
        if key in (*POD_ENV, *CREDENTIAL_KEYS, *OPTIONAL_CREDENTIAL_KEYS, backend.ENV):
            _fail("env", key, "a mapping without keys the launcher sets itself (the Keras "
                  "backend is the run's runtime.backend)")
    for name in ("node_selector", "gpu_node_selector"):
        for key, value in getattr(o, name).items():
            if not is_label_key(key) or not is_label_value(value):
                _fail(name, {key: value}, "a mapping of label keys to label values (at most 63 "
                      "characters of A-Z, a-z, 0-9, '-', '_' and '.')")
    if not isinstance(o.tpu_accelerator, str) or not _TPU_ACCELERATOR.match(o.tpu_accelerator):
        _fail("tpu_accelerator", o.tpu_accelerator, "a GKE TPU accelerator such as "
              "'tpu-v5-lite-podslice', 'tpu-v5p-slice' or 'tpu-v6e-slice'")
    if not isinstance(o.tpu_topology, str) or not _TOPOLOGY.match(o.tpu_topology):
        _fail("tpu_topology", o.tpu_topology,
              "a GKE TPU topology such as '2x2', '2x4' or '2x2x2'")
    if o.tpu_chips_per_worker not in TPU_CHIPS_PER_WORKER or not _is_int(
        o.tpu_chips_per_worker
    ):
        _fail("tpu_chips_per_worker", o.tpu_chips_per_worker,
              "one of " + ", ".join(map(str, TPU_CHIPS_PER_WORKER)))
    for name in ("cpu", "memory"):
        value = getattr(o, name)
        # a quantity, and not zero: some digit other than 0 (units hold no digits)
        if not isinstance(value, str) or not _QUANTITY.match(value) or not re.search(
            "[1-9]", value
        ):
            _fail(name, value, "a positive Kubernetes quantity such as '500m', '2', '8Gi'")
    if not _is_int(o.port) or not 1 <= o.port <= 65535:
        _fail("port", o.port, "an integer between 1 and 65535")


def _check_job(o: KubernetesOptions) -> None:
    """The Job's limits and its Kueue queue."""
    if not _is_int(o.backoff_limit) or not 0 <= o.backoff_limit <= 100:
        _fail("backoff_limit", o.backoff_limit, "an integer between 0 and 100")
    for name, low in (("active_deadline_seconds", 1), ("ttl_seconds_after_finished", 0)):
        value = getattr(o, name)
        if value is not None and (not _is_int(value) or value < low):
            _fail(name, value, f"None or an integer of at least {low}")
    queue = o.kueue_queue
    # a LocalQueue name that is also a label value (kueue.x-k8s.io/queue-name)
    if queue is not None and not (is_object_name(queue) and len(queue) <= 63):
        _fail("kueue_queue", queue, "None or a Kueue LocalQueue name in the Job's namespace "
              "(a-z, 0-9, '-' and '.', at most 63 characters: it is a label value)")


def _check_launch(o: KubernetesOptions) -> None:
    """The shared volume and how the launch follows the Job."""
    claim, mount = o.shared_volume_claim, o.shared_mount_path
    if claim is not None and not is_object_name(claim):
        _fail("shared_volume_claim", claim,
              f"None or a PersistentVolumeClaim name ({OBJECT_NAME_WORDS})")
    if mount is not None and (
        not isinstance(mount, str) or not posixpath.isabs(mount)
        or posixpath.normpath(mount) == "/"
    ):
        _fail("shared_mount_path", mount, "None or an absolute directory other than '/'")
    if mount is not None and claim is None:
        _fail("shared_mount_path", mount, "None when shared_volume_claim "
              f"({ENV_SHARED_PVC}) is not set; name the PersistentVolumeClaim to mount")
    if isinstance(o.poll_interval, bool) or not isinstance(o.poll_interval, (int, float)) or (
        not 0 <= o.poll_interval <= 3600
    ):
        _fail("poll_interval", o.poll_interval, "between 0 and 3600 seconds")
    if not _is_int(o.failure_lines) or not 1 <= o.failure_lines <= 1000:
        _fail("failure_lines", o.failure_lines, "an integer between 1 and 1000")
