"""``launcher=kubernetes``: run a training run's pods and follow them to the end.

``launch(operator, cfg)`` renders the run's objects with
``training.launch.kubernetes.render`` (a ConfigMap, a headless Service, an Indexed Job of
``runtime.workers`` pods) and applies them with the ``kubernetes`` client of the
cncf-kubernetes provider's ``KubernetesHook`` (the connection ``kubernetes_default``
unless ``TRAINING_K8S_CONN_ID`` names another). The provider's ``KubernetesJobOperator``
is not used: it renames the Job (``job-`` prefix, random suffix), which would break the
worker host names in ``TF_CONFIG``, and it creates no Service or ConfigMap.

A retry of the Airflow task lands on the same objects (their names derive from the run
id only):

- ConfigMap: replaced with this try's body; Service: reused;
- Job: one that **succeeded** ends the task at once (the model is written); one that
  **failed** is deleted (propagation ``Background``) and created again, and the training
  resumes from its BackupAndRestore backup; one still **running** (the Airflow worker was
  lost) is followed again.

While the Job runs, its pods' output is copied into the task log, prefixed with
``[worker <index>]`` (worker 0 is the chief), a few lines per poll; pods are selected by
the Job's own selector (its controller uid), so the pods of a deleted earlier try are
never mixed in. A failed Job raises ``LaunchError`` naming the pod that failed
first, its termination reason and exit code, and its last log lines. ``stop()`` (the
operator's ``on_kill``: a task marked failed, a timeout) deletes the Job, and Kubernetes
stops the pods.

Deployment settings come from the environment of the Airflow workers (see
``settings_from_env``); none of them is a secret, and credentials never pass through
here: pods read them from the Secret named in ``credentials_secret`` or get them from
their service account's platform identity.
"""

from __future__ import annotations

import collections
import json
import os
import posixpath
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from training.errors import ConfigError, LaunchError
from training.launch.kubernetes import (
    CONFIG_DIR,
    CONTAINER_NAME,
    LABEL_PREFIX,
    KubernetesOptions,
    render,
)

ENV_OPTIONS = "TRAINING_K8S_OPTIONS"
# Single options that override the JSON in TRAINING_K8S_OPTIONS.
ENV_OVERRIDES = {
    "TRAINING_K8S_NAMESPACE": "namespace",
    "TRAINING_K8S_IMAGE": "image",
    "TRAINING_K8S_SERVICE_ACCOUNT": "service_account",
    "TRAINING_K8S_CREDENTIALS_SECRET": "credentials_secret",
}
ENV_CONN_ID = "TRAINING_K8S_CONN_ID"
ENV_POLL_INTERVAL = "TRAINING_K8S_POLL_INTERVAL"
ENV_SHARED_PVC = "TRAINING_K8S_SHARED_PVC"
ENV_SHARED_MOUNT = "TRAINING_K8S_SHARED_MOUNT"
ENV_FAILURE_LINES = "TRAINING_K8S_FAILURE_LINES"

SHARED_VOLUME = "shared"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
TRANSIENT_STATUS = (429, 500, 502, 503, 504)
MAX_TRANSIENT_ERRORS = 5
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# RFC 3339 with up to nine fraction digits, as the kubelet writes with timestamps=true.
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


# --- settings -------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchSettings:
    """The deployment's Kubernetes settings; validated when built."""

    options: KubernetesOptions
    conn_id: str = "kubernetes_default"
    poll_interval: float = 15.0  # seconds between two looks at the Job
    shared_volume_claim: str | None = None  # ReadWriteMany PVC holding output/staging dirs
    shared_mount_path: str | None = None  # where it is mounted; None: their common parent
    failure_lines: int = 20  # log lines of the failed pod quoted in the error

    def __post_init__(self) -> None:
        if not isinstance(self.options, KubernetesOptions):
            raise ConfigError(f"options must be KubernetesOptions, got {self.options!r}")
        if not isinstance(self.conn_id, str) or not self.conn_id:
            raise ConfigError(f"{ENV_CONN_ID} must be an Airflow connection id, "
                              f"got {self.conn_id!r}")
        if isinstance(self.poll_interval, bool) or not isinstance(
            self.poll_interval, (int, float)
        ) or not 0 <= self.poll_interval <= 3600:
            raise ConfigError(f"{ENV_POLL_INTERVAL} must be between 0 and 3600 seconds, "
                              f"got {self.poll_interval!r}")
        claim = self.shared_volume_claim
        if claim is not None and (
            not isinstance(claim, str) or len(claim) > 253 or not _DNS_SUBDOMAIN.match(claim)
        ):
            raise ConfigError(f"{ENV_SHARED_PVC} must be a PersistentVolumeClaim name "
                              f"(a-z, 0-9, '-' and '.'), got {claim!r}")
        mount = self.shared_mount_path
        if mount is not None and (
            not isinstance(mount, str) or not posixpath.isabs(mount)
            or posixpath.normpath(mount) == "/"
        ):
            raise ConfigError(f"{ENV_SHARED_MOUNT} must be an absolute directory other than "
                              f"'/', got {mount!r}")
        if mount is not None and claim is None:
            raise ConfigError(f"{ENV_SHARED_MOUNT} is set ({mount!r}) but {ENV_SHARED_PVC} "
                              "is not; name the PersistentVolumeClaim to mount there")
        if isinstance(self.failure_lines, bool) or not isinstance(self.failure_lines, int) or (
            not 1 <= self.failure_lines <= 1000
        ):
            raise ConfigError(f"{ENV_FAILURE_LINES} must be between 1 and 1000, "
                              f"got {self.failure_lines!r}")


def _number(env: Mapping[str, str], key: str, default: Any, kind: type) -> Any:
    raw = env.get(key, "")
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a number, got {raw!r}") from None


def settings_from_env(env: Mapping[str, str] = os.environ) -> LaunchSettings:
    """``LaunchSettings`` from the Airflow worker's environment.

    ``TRAINING_K8S_OPTIONS`` holds a JSON object of ``KubernetesOptions`` (unknown keys
    are errors); ``TRAINING_K8S_NAMESPACE``, ``_IMAGE``, ``_SERVICE_ACCOUNT`` and
    ``_CREDENTIALS_SECRET`` override single options. ``TRAINING_K8S_CONN_ID``,
    ``_POLL_INTERVAL``, ``_SHARED_PVC``, ``_SHARED_MOUNT`` and ``_FAILURE_LINES`` set the
    launcher itself. Empty variables count as unset.
    """
    data: dict[str, Any] = {}
    raw = env.get(ENV_OPTIONS, "").strip()
    if raw:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{ENV_OPTIONS} must be a JSON object of Kubernetes options, "
                              f"got invalid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{ENV_OPTIONS} must be a JSON object of Kubernetes options, "
                              f"got {type(data).__name__}")
    for key, option in ENV_OVERRIDES.items():
        if env.get(key):
            data[option] = env[key]
    return LaunchSettings(
        options=KubernetesOptions.from_dict(data),
        conn_id=env.get(ENV_CONN_ID) or "kubernetes_default",
        poll_interval=_number(env, ENV_POLL_INTERVAL, 15.0, float),
        shared_volume_claim=env.get(ENV_SHARED_PVC) or None,
        shared_mount_path=env.get(ENV_SHARED_MOUNT) or None,
        failure_lines=_number(env, ENV_FAILURE_LINES, 20, int),
    )


# --- objects --------------------------------------------------------------------------
def shared_mount_path(cfg: Any, settings: LaunchSettings) -> str:
    """Where the shared volume goes: the setting, else the output and staging dirs' parent.

    The volume is mounted at the same path as on the Airflow workers, so a path means the
    same file in a pod and in the evaluate/publish tasks.
    """
    dirs = [cfg.storage.output_dir, cfg.dataset.staging_dir]
    for path in dirs:
        if not posixpath.isabs(path):
            raise ConfigError(
                f"storage.output_dir and dataset.staging_dir must be absolute paths for a "
                f"shared volume (set TRAINING_OUTPUT_DIR/TRAINING_STAGING_DIR or "
                f"TRAINING_DATA_DIR), got {path!r}"
            )
    dirs = [posixpath.normpath(d) for d in dirs]
    mount = settings.shared_mount_path
    if mount is None:
        mount = posixpath.commonpath(dirs)
        if mount == "/":
            raise ConfigError(
                f"storage.output_dir {dirs[0]!r} and dataset.staging_dir {dirs[1]!r} share no "
                f"parent directory but '/'; set {ENV_SHARED_MOUNT} to where the volume "
                "is mounted"
            )
    mount = posixpath.normpath(mount)
    for path in dirs:
        if posixpath.commonpath([mount, path]) != mount:
            raise ConfigError(f"{ENV_SHARED_MOUNT} must contain storage.output_dir and "
                              f"dataset.staging_dir, got {mount!r} for {path!r}")
    if posixpath.commonpath([mount, CONFIG_DIR]) in (mount, CONFIG_DIR):
        raise ConfigError(f"{ENV_SHARED_MOUNT} must not contain or lie in {CONFIG_DIR}, "
                          f"got {mount!r}")
    return mount


def _validate(obj: dict[str, Any], kind: str) -> None:
    """Check a body against the kubernetes client's model (types, required fields, keys)."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    model = api._ApiClient__deserialize(obj, kind)  # type: ignore[attr-defined]
    if api.sanitize_for_serialization(model) != obj:
        raise ConfigError(f"the {obj.get('kind')} body does not round-trip through {kind}; "
                          "a field is unknown or has the wrong type")


def render_objects(cfg: Any, settings: LaunchSettings) -> list[dict[str, Any]]:
    """The rendered ConfigMap, Service and Job, the Job with the shared volume if any."""
    objects = render(cfg, settings.options)
    if settings.shared_volume_claim:
        mount = shared_mount_path(cfg, settings)
        job = objects[2]
        pod = job["spec"]["template"]["spec"]
        pod["volumes"].append({"name": SHARED_VOLUME, "persistentVolumeClaim": {
            "claimName": settings.shared_volume_claim}})
        (container,) = pod["containers"]
        container["volumeMounts"].append({"name": SHARED_VOLUME, "mountPath": mount})
        _validate(job, "V1Job")
    return objects


# --- job state ------------------------------------------------------------------------
def _condition(job: Any, kind: str) -> Any:
    for condition in (job.status and job.status.conditions) or []:
        if condition.type == kind and condition.status == "True":
            return condition
    return None


def job_state(job: Any) -> str:
    """``succeeded``, ``failed`` or ``running`` from the Job's terminal conditions."""
    if _condition(job, "Complete") is not None:
        return "succeeded"
    if _condition(job, "Failed") is not None:
        return "failed"
    return "running"


def _worker_index(pod: Any) -> int | None:
    for source in (pod.metadata.labels or {}, pod.metadata.annotations or {}):
        value = source.get(INDEX_KEY)
        if value is not None and str(value).isdigit():
            return int(value)
    return None


def _trainer_status(pod: Any) -> Any:
    for status in (pod.status and pod.status.container_statuses) or []:
        if status.name == CONTAINER_NAME:
            return status
    return None


def _timestamp_key(stamp: str) -> tuple[str, str, str] | None:
    match = _TIMESTAMP.match(stamp)
    if match is None:
        return None
    seconds, fraction, zone = match.groups()
    return (seconds, (fraction or "").ljust(9, "0"), zone)


class _PodLog:
    """One pod's log as read so far: what was printed, and its last lines."""

    def __init__(self, label: str, keep: int) -> None:
        self.label = label
        self.last_key: tuple[str, str, str] | None = None
        self.at_last_key = 0  # lines seen with exactly last_key
        self.fetched_at: float | None = None  # monotonic time of the last complete read
        self.tail: collections.deque[str] = collections.deque(maxlen=keep)

    def new_lines(self, text: str) -> list[str]:
        """Lines of a ``timestamps=true`` read that were not printed yet."""
        lines, seen_here = [], 0
        previous: tuple[str, str, str] | None = None
        for raw in text.splitlines():
            stamp, _, line = raw.partition(" ")
            key = _timestamp_key(stamp)
            if key is None:  # no timestamp: a continuation; keep it
                key, line = previous, raw
            seen_here = seen_here + 1 if key == previous else 1
            previous = key
            if key is not None and self.last_key is not None and (
                key < self.last_key or (key == self.last_key and seen_here <= self.at_last_key)
            ):
                continue
            if key is not None:
                if key != self.last_key:
                    self.last_key, self.at_last_key = key, 0
                self.at_last_key += 1
            lines.append(line)
            self.tail.append(line)
        return lines


# --- the launch -----------------------------------------------------------------------
class KubernetesTrainingJob:
    """Apply one run's objects, follow its Job, surface logs; ``stop()`` deletes it."""

    def __init__(self, hook: Any, settings: LaunchSettings, objects: list[dict[str, Any]],
                 log: Any, sleep: Callable[[float], None] = time.sleep) -> None:
        self.hook = hook
        self.settings = settings
        self.config_map, self.service, self.job = objects
        self.name = self.job["metadata"]["name"]
        self.namespace = self.job["metadata"]["namespace"]
        self.log = log
        self.sleep = sleep
        self.stopped = False
        self.pod_logs: dict[str, _PodLog] = {}

    @property
    def core(self) -> Any:
        return self.hook.core_v1_client

    @property
    def batch(self) -> Any:
        return self.hook.batch_v1_client

    # --- apply ------------------------------------------------------------------------
    def run(self) -> None:
        """Apply the objects and follow the Job; raise ``LaunchError`` if it fails."""
        self._apply_config_map()
        self._apply_service()
        job = self._create_or_reuse_job()
        if job_state(job) != "succeeded":
            job = self._follow(job)
        self._surface_logs(job)
        if job_state(job) == "failed":
            raise LaunchError(self._failure_message(job))
        self.log.info("Job %s/%s succeeded", self.namespace, self.name)

    def _apply_config_map(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespaced_config_map(self.namespace, self.config_map)
            self.log.info("created ConfigMap %s/%s", self.namespace, self.name)
        except ApiException as exc:
            if exc.status != 409:
                raise self._api_error("create the ConfigMap", exc) from None
            try:
                self.core.replace_namespaced_config_map(self.name, self.namespace,
                                                        self.config_map)
            except ApiException as again:
                raise self._api_error("replace the ConfigMap", again) from None
            self.log.info("replaced ConfigMap %s/%s (from an earlier try)", self.namespace,
                          self.name)

    def _apply_service(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespaced_service(self.namespace, self.service)
            self.log.info("created headless Service %s/%s", self.namespace, self.name)
        except ApiException as exc:
            if exc.status != 409:
                raise self._api_error("create the Service", exc) from None
            self.log.info("reusing Service %s/%s (from an earlier try)", self.namespace,
                          self.name)

    def _create_job(self, exists_ok: bool = False) -> Any:
        """Create the Job; None when it exists already and ``exists_ok``."""
        from kubernetes.client.exceptions import ApiException

        try:
            job = self.batch.create_namespaced_job(self.namespace, self.job)
        except ApiException as exc:
            if exists_ok and exc.status == 409:
                return None
            raise self._api_error("create the Job", exc) from None
        spec = self.job["spec"]
        self.log.info("created Job %s/%s: %d worker(s), image %s", self.namespace, self.name,
                      spec["completions"], spec["template"]["spec"]["containers"][0]["image"])
        return job

    def _create_or_reuse_job(self) -> Any:
        job = self._create_job(exists_ok=True)
        if job is not None:
            return job
        existing = self._read_job()
        state = job_state(existing)
        if state == "failed":
            self.log.warning("Job %s/%s of an earlier try failed (%s); deleting it and "
                             "starting again (training resumes from its backup)",
                             self.namespace, self.name, self._condition_text(existing))
            self._delete_job()
            self._wait_deleted()
            return self._create_job()
        fingerprint_key = f"{LABEL_PREFIX}/config-fingerprint"
        theirs = (existing.metadata.annotations or {}).get(fingerprint_key)
        ours = self.job["metadata"]["annotations"][fingerprint_key]
        if theirs != ours:
            raise LaunchError(
                f"Job {self.namespace}/{self.name} exists ({state}) with config fingerprint "
                f"{theirs!r}, but this run's config has {ours!r}; delete it to train this "
                f"config: kubectl -n {self.namespace} delete job {self.name}"
            )
        if state == "succeeded":
            self.log.info("Job %s/%s of an earlier try already succeeded; not training again",
                          self.namespace, self.name)
        else:
            self.log.info("Job %s/%s of an earlier try is still running; following it",
                          self.namespace, self.name)
        return existing

    def _read_job(self) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.batch.read_namespaced_job_status(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise LaunchError(
                    f"Job {self.namespace}/{self.name} was deleted while the task followed "
                    "it (the task was stopped, or someone deleted the Job)"
                ) from None
            raise

    def _delete_job(self) -> None:
        from kubernetes.client import V1DeleteOptions

        self.batch.delete_namespaced_job(
            self.name, self.namespace, body=V1DeleteOptions(propagation_policy="Background"))

    def _wait_deleted(self, timeout: float = 300.0) -> None:
        from kubernetes.client.exceptions import ApiException

        start = time.monotonic()
        while True:
            try:
                self.batch.read_namespaced_job_status(self.name, self.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if time.monotonic() - start > timeout:
                raise LaunchError(
                    f"Job {self.namespace}/{self.name} was not deleted within {timeout:g} s; "
                    "check its finalizers"
                )
            self.sleep(min(max(self.settings.poll_interval, 0.1), 5.0))

    # --- follow -----------------------------------------------------------------------
    def _follow(self, job: Any) -> Any:
        """Poll the Job until it succeeds or fails, copying pod output into the task log."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        errors, last_progress = 0, None
        while True:
            if self.stopped:
                raise LaunchError(f"Job {self.namespace}/{self.name} was stopped")
            if job_state(job) != "running":
                return job
            self.sleep(self.settings.poll_interval)
            try:
                job = self._read_job()
                self._stream_logs(job)
                progress = self._progress(job)
                errors = 0
            except (ApiException, HTTPError, OSError) as exc:
                status = getattr(exc, "status", None)
                errors += 1
                if (status is not None and status not in TRANSIENT_STATUS) or (
                    errors > MAX_TRANSIENT_ERRORS
                ):
                    raise LaunchError(
                        f"cannot read Job {self.namespace}/{self.name}: "
                        f"{self._exception_text(exc)}"
                    ) from None
                self.log.warning("reading Job %s/%s failed (%s), try %d of %d",
                                 self.namespace, self.name, self._exception_text(exc), errors,
                                 MAX_TRANSIENT_ERRORS)
                continue
            if progress != last_progress:
                self.log.info("Job %s/%s: %s", self.namespace, self.name, progress)
                last_progress = progress

    def _progress(self, job: Any) -> str:
        status = job.status
        counts = (f"{(status and status.active) or 0} active, "
                  f"{(status and status.succeeded) or 0} succeeded, "
                  f"{(status and status.failed) or 0} failed")
        waiting = sorted({
            s.state.waiting.reason for pod in self._pods(job)
            if (s := _trainer_status(pod)) is not None and s.state and s.state.waiting
            and s.state.waiting.reason
        })
        return counts + (f"; waiting: {', '.join(waiting)}" if waiting else "")

    def _selector(self, job: Any) -> str:
        labels = (job.spec and job.spec.selector and job.spec.selector.match_labels) or {}
        if labels:
            return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        return f"job-name={self.name}"

    def _pods(self, job: Any) -> list[Any]:
        pods = self.core.list_namespaced_pod(self.namespace,
                                             label_selector=self._selector(job)).items
        return sorted(pods, key=lambda p: (_worker_index(p) is None, _worker_index(p) or 0,
                                           p.metadata.name))

    def _stream_logs(self, job: Any) -> None:
        """Print the output each pod wrote since the last read, ``[worker i]`` first."""
        for pod in self._pods(job):
            if _trainer_status(pod) is None or (pod.status.phase == "Pending"):
                continue
            name = pod.metadata.name
            record = self.pod_logs.get(name)
            if record is None:
                index = _worker_index(pod)
                label = f"worker {index}" if index is not None else f"pod {name}"
                record = self.pod_logs[name] = _PodLog(label, self.settings.failure_lines)
            kwargs: dict[str, Any] = {"container": CONTAINER_NAME, "timestamps": True,
                                      "_preload_content": False}
            started = time.monotonic()
            if record.fetched_at is not None:
                # Overlapping window (timestamps remove the repeats); no clock is compared.
                kwargs["since_seconds"] = int(started - record.fetched_at) + 30
            try:
                response = self.core.read_namespaced_pod_log(name, self.namespace, **kwargs)
                text = response.data.decode("utf-8", errors="replace")
            except Exception as exc:  # a log read never decides the task
                self.log.debug("no log from pod %s yet: %s", name, self._exception_text(exc))
                continue
            record.fetched_at = started
            for line in record.new_lines(text):
                self.log.info("[%s] %s", record.label, line)

    def _surface_logs(self, job: Any) -> None:
        try:
            self._stream_logs(job)
        except Exception as exc:
            self.log.warning("could not read the pods' logs: %s", self._exception_text(exc))

    # --- failure ----------------------------------------------------------------------
    @staticmethod
    def _condition_text(job: Any) -> str:
        condition = _condition(job, "Failed") or _condition(job, "Complete")
        if condition is None:
            return "no final condition"
        return ": ".join(x for x in (condition.reason, condition.message) if x) or condition.type

    def _failure_message(self, job: Any) -> str:
        text = f"Kubernetes Job {self.namespace}/{self.name} failed ({self._condition_text(job)})"
        try:
            pods = self._pods(job)
        except Exception as exc:
            return f"{text}; its pods could not be listed: {self._exception_text(exc)}"
        failed = []
        for pod in pods:
            status = _trainer_status(pod)
            terminated = status and status.state and status.state.terminated
            if (terminated and terminated.exit_code) or pod.status.phase == "Failed":
                finished = terminated and terminated.finished_at
                failed.append((str(finished or "~"), pod, terminated))
        if not failed:
            waiting = [f"{p.metadata.name}: {s.state.waiting.reason}" for p in pods
                       if (s := _trainer_status(p)) and s.state and s.state.waiting]
            return text + ("; pods waiting: " + "; ".join(waiting) if waiting
                           else "; no pod of it failed")
        failed.sort(key=lambda item: item[0])
        parts = [text]
        for _, pod, terminated in failed[:3]:
            name = pod.metadata.name
            index = _worker_index(pod)
            who = f"pod {name} (worker {index})" if index is not None else f"pod {name}"
            if terminated:
                why = f"{terminated.reason or 'terminated'}, exit code {terminated.exit_code}"
                if terminated.message:
                    why += f": {terminated.message.strip()}"
            else:
                why = ": ".join(x for x in (pod.status.reason, pod.status.message) if x)
            record = self.pod_logs.get(name)
            tail = list(record.tail) if record else []
            lines = ("; last log lines:\n" + "\n".join(f"    {line}" for line in tail)
                     if tail else "; no log lines")
            parts.append(f"{who} failed: {why or 'no reason given'}{lines}")
        if len(failed) > 3:
            parts.append(f"and {len(failed) - 3} more failed pod(s)")
        return "\n".join(parts)

    # --- stop -------------------------------------------------------------------------
    def stop(self) -> None:
        """Delete the Job (Kubernetes then stops its pods); safe to call more than once."""
        from kubernetes.client import BatchV1Api, V1DeleteOptions
        from kubernetes.client.exceptions import ApiException

        self.stopped = True
        # A fresh client: this runs in a signal handler, maybe inside a request.
        batch = BatchV1Api(api_client=self.hook.get_conn())
        try:
            batch.delete_namespaced_job(
                self.name, self.namespace,
                body=V1DeleteOptions(propagation_policy="Background"))
        except ApiException as exc:
            if exc.status == 404:
                self.log.info("no Job %s/%s to delete", self.namespace, self.name)
            else:
                self.log.error("could not delete Job %s/%s: %s", self.namespace, self.name,
                               self._exception_text(exc))
            return
        self.log.warning("deleted Job %s/%s; Kubernetes stops its pods", self.namespace,
                         self.name)

    # --- errors -----------------------------------------------------------------------
    @staticmethod
    def _exception_text(exc: BaseException) -> str:
        status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
        body = getattr(exc, "body", None)
        message = None
        if body:
            try:
                message = json.loads(body).get("message")
            except (ValueError, AttributeError):
                message = None
        if status is not None:
            return f"HTTP {status} {reason or ''}".strip() + (f": {message}" if message else "")
        return f"{type(exc).__name__}: {exc}"

    def _api_error(self, action: str, exc: BaseException) -> LaunchError:
        hint = ""
        if getattr(exc, "status", None) == 403:
            hint = (f"; the Airflow connection {self.settings.conn_id!r} needs, in namespace "
                    f"{self.namespace!r}: create and update on configmaps, create on "
                    "services, create and delete on jobs, get on jobs/status, get and list "
                    "on pods and pods/log")
        elif getattr(exc, "status", None) == 404:
            hint = f"; does namespace {self.namespace!r} exist?"
        return LaunchError(f"cannot {action} {self.namespace}/{self.name}: "
                                   f"{self._exception_text(exc)}{hint}")


def make_hook(conn_id: str) -> Any:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=conn_id)


def launch(operator: Any, cfg: Any, context: Any = None,
           env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Train ``cfg`` on Kubernetes; XCom: run id, run dir, Job name and namespace."""
    settings = settings_from_env(env)
    objects = render_objects(cfg, settings)
    if settings.shared_volume_claim is None:
        operator.log.warning(
            "no shared volume (%s): the pods write %s on their own disks, where the "
            "evaluate and publish tasks cannot read it", ENV_SHARED_PVC,
            cfg.storage.output_dir)
    runner = KubernetesTrainingJob(make_hook(settings.conn_id), settings, objects,
                                   operator.log)
    operator.stop = runner.stop
    runner.run()
    return {"run_id": cfg.run_id, "run_dir": os.fspath(cfg.run_dir()), "job": runner.name,
            "namespace": runner.namespace}
