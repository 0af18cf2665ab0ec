"""A Job's pods seen from outside: their progress, their log lines (each printed once,
``[worker <index>] ...``) and, when the Job failed, which pod failed first, why, and its
last lines.

Works on a ``CoreV1Api`` and the client's models (``V1Pod``) as the API returns them;
imports nothing of the client itself.
"""

from __future__ import annotations

import collections
import json
import re
import time
from typing import Any

from training.launch.kubernetes.manifests import CONTAINER_NAME

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
FAILED_PODS_SHOWN = 3
# RFC 3339 with up to nine fraction digits, as the kubelet writes with timestamps=true.
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def worker_index(pod: Any) -> int | None:
    """The pod's completion index (its worker index), from its labels or annotations."""
    for source in (pod.metadata.labels or {}, pod.metadata.annotations or {}):
        value = source.get(INDEX_KEY)
        if value is not None and str(value).isdigit():
            return int(value)
    return None


def trainer_status(pod: Any) -> Any:
    """The training container's status in ``pod``; None before it has one."""
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


class PodLog:
    """One pod's log as read so far: what was printed, and its last lines.

    Reads overlap (``since_seconds`` with a margin, no clock compared); the kubelet's
    timestamps tell which lines were printed already, including repeats of a line that
    share one timestamp.
    """

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


def api_error_text(exc: BaseException) -> str:
    """``HTTP 403 Forbidden: <the API server's message>``, or the exception's own text."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    message = None
    if body := getattr(exc, "body", None):
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip() + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"


class PodWatch:
    """The pods of one Job, seen through a ``CoreV1Api``: progress, logs, failures."""

    def __init__(self, core: Any, namespace: str, job_name: str, keep: int, log: Any) -> None:
        self.core, self.namespace, self.job_name = core, namespace, job_name
        self.keep, self.log = keep, log
        self.pod_logs: dict[str, PodLog] = {}

    def pods(self, job: Any) -> list[Any]:
        """The Job's pods in worker order, by the Job's own selector (its controller uid,
        so the pods of a deleted earlier Job of the same name never mix in)."""
        labels = (job.spec and job.spec.selector and job.spec.selector.match_labels) or {}
        selector = (",".join(f"{k}={v}" for k, v in sorted(labels.items())) if labels
                    else f"job-name={self.job_name}")
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted(pods, key=lambda p: (worker_index(p) is None, worker_index(p) or 0,
                                           p.metadata.name))

    def progress(self, job: Any) -> str:
        """``2 active, 0 succeeded, 0 failed; waiting: ImagePullBackOff``."""
        status = job.status
        counts = (f"{(status and status.active) or 0} active, "
                  f"{(status and status.succeeded) or 0} succeeded, "
                  f"{(status and status.failed) or 0} failed")
        waiting = sorted({
            s.state.waiting.reason for pod in self.pods(job)
            if (s := trainer_status(pod)) is not None and s.state and s.state.waiting
            and s.state.waiting.reason
        })
        return counts + (f"; waiting: {', '.join(waiting)}" if waiting else "")

    def stream(self, job: Any) -> None:
        """Log the output each pod wrote since the last read, ``[worker i]`` first."""
        for pod in self.pods(job):
            if trainer_status(pod) is None or pod.status.phase == "Pending":
                continue
            name = pod.metadata.name
            record = self.pod_logs.get(name)
            if record is None:
                index = worker_index(pod)
                label = f"worker {index}" if index is not None else f"pod {name}"
                record = self.pod_logs[name] = PodLog(label, self.keep)
            kwargs: dict[str, Any] = {"container": CONTAINER_NAME, "timestamps": True,
                                      "_preload_content": False}
            started = time.monotonic()
            if record.fetched_at is not None:
                # Overlapping window (timestamps remove the repeats); no clock is compared.
                kwargs["since_seconds"] = int(started - record.fetched_at) + 30
            try:
                response = self.core.read_namespaced_pod_log(name, self.namespace, **kwargs)
                text = response.data.decode("utf-8", errors="replace")
            except Exception as exc:  # a log read never decides the launch
                self.log.debug("no log from pod %s yet: %s", name, api_error_text(exc))
                continue
            record.fetched_at = started
            for line in record.new_lines(text):
                self.log.info("[%s] %s", record.label, line)

    def surface(self, job: Any) -> None:
        """``stream``, once more at the end; a failure to read is only a warning."""
        try:
            self.stream(job)
        except Exception as exc:
            self.log.warning("could not read the pods' logs: %s", api_error_text(exc))

    def failure_message(self, headline: str, job: Any) -> str:
        """``headline``, then the pods that failed, first failed first: reason, exit code
        and last log lines of each (at most ``FAILED_PODS_SHOWN``)."""
        try:
            pods = self.pods(job)
        except Exception as exc:
            return f"{headline}; its pods could not be listed: {api_error_text(exc)}"
        failed = []
        for pod in pods:
            status = trainer_status(pod)
            terminated = status and status.state and status.state.terminated
            if (terminated and terminated.exit_code) or pod.status.phase == "Failed":
                finished = terminated and terminated.finished_at
                failed.append((str(finished or "~"), pod, terminated))
        if not failed:
            waiting = [f"{p.metadata.name}: {s.state.waiting.reason}" for p in pods
                       if (s := trainer_status(p)) and s.state and s.state.waiting]
            return headline + ("; pods waiting: " + "; ".join(waiting) if waiting
                               else "; no pod of it failed")
        failed.sort(key=lambda item: item[0])
        parts = [headline]
        for _, pod, terminated in failed[:FAILED_PODS_SHOWN]:
            parts.append(self._failed_pod(pod, terminated))
        if len(failed) > FAILED_PODS_SHOWN:
            parts.append(f"and {len(failed) - FAILED_PODS_SHOWN} more failed pod(s)")
        return "\n".join(parts)

    def _failed_pod(self, pod: Any, terminated: Any) -> str:
        name = pod.metadata.name
        index = worker_index(pod)
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
        return f"{who} failed: {why or 'no reason given'}{lines}"
