"""Following a Job one look at a time: its state, its queue, its pods' new lines.

``JobFollower.look()`` reads the Job once (``read_namespaced_job_status``), tells a Kueue
wait (``kueue.QueueWatch``), copies each pod's new output into the log as ``[worker i]``
lines (``logs.PodWatch``), logs a progress line when it changes, and counts transient API
errors (``TRANSIENT_STATUS``, at most ``MAX_TRANSIENT_ERRORS`` in a row). It never
sleeps: whoever follows paces the looks, ``TrainingJob`` in the task (``time.sleep``) or
the deferred task's trigger in the triggerer (``asyncio.sleep``, each look in a thread),
so both follow a Job the same way and say the same things.

``tails()`` and ``seed()`` carry the pods' last lines from the follower that read them to
the one that words a failure (the trigger hands them to the resumed task in its event).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from training.errors import LaunchError
from training.launch.kubernetes.kueue import QueueWatch
from training.launch.kubernetes.logs import PodLog, PodWatch, api_error_text

TRANSIENT_STATUS = (429, 500, 502, 503, 504)
MAX_TRANSIENT_ERRORS = 5


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


def condition_text(job: Any) -> str:
    condition = _condition(job, "Failed") or _condition(job, "Complete")
    if condition is None:
        return "no final condition"
    return ": ".join(x for x in (condition.reason, condition.message) if x) or condition.type


def read_job(batch: Any, namespace: str, name: str) -> Any:
    """The Job's status; LaunchError when it is gone (stopped, or deleted by someone)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return batch.read_namespaced_job_status(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise LaunchError(
                f"Job {namespace}/{name} was deleted while the task followed it (the task "
                "was stopped, or someone deleted the Job)") from None
        raise


class JobFollower:
    """One Job followed look by look (module doc); ``log`` takes ``info``/``warning``/
    ``debug`` with %-style arguments."""

    def __init__(self, core: Any, batch: Any, namespace: str, name: str, *, workers: int,
                 failure_lines: int, kueue_queue: str | None, log: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.batch, self.namespace, self.name, self.log = batch, namespace, name, log
        self.pods = PodWatch(core, namespace, name, failure_lines, log)
        self.queue = QueueWatch(kueue_queue, f"{namespace}/{name}", workers, log, clock)
        self.errors = 0
        self.last_progress: str | None = None

    def start(self, job: Any) -> None:
        """The Job as created or found (a new Job of a queue is suspended from the start)."""
        self.queue.update(job)

    def look(self) -> Any | None:
        """Read the Job and its pods' new lines once; the Job, or None after a transient
        error (logged, counted). LaunchError when the Job is gone or cannot be read."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            job = read_job(self.batch, self.namespace, self.name)
            queued = self.queue.update(job)
            # While queued there are no pods (preempted ones may still be stopping: their
            # last lines are kept), and no progress to tell.
            self.pods.stream(job)
            progress = None if queued else self.pods.progress(job)
        except (ApiException, HTTPError, OSError) as exc:
            status = getattr(exc, "status", None)
            self.errors += 1
            if (status is not None and status not in TRANSIENT_STATUS) or (
                self.errors > MAX_TRANSIENT_ERRORS
            ):
                raise LaunchError(f"cannot read Job {self.namespace}/{self.name}: "
                                  f"{api_error_text(exc)}") from None
            self.log.warning("reading Job %s/%s failed (%s), try %d of %d", self.namespace,
                             self.name, api_error_text(exc), self.errors,
                             MAX_TRANSIENT_ERRORS)
            return None
        self.errors = 0
        if progress is not None and progress != self.last_progress:
            self.log.info("Job %s/%s: %s", self.namespace, self.name, progress)
        self.last_progress = progress
        return job

    def tails(self) -> dict[str, list[str]]:
        """Each pod's last lines as read so far (``failure_lines`` of them)."""
        return {name: list(record.tail) for name, record in self.pods.pod_logs.items()}


def seed(pods: PodWatch, tails: Mapping[str, list[str]]) -> None:
    """Give ``pods`` the last lines another follower read (for ``failure_message``)."""
    for name, lines in tails.items():
        record = pods.pod_logs.setdefault(name, PodLog(name, pods.keep))
        record.tail.extend(lines)
