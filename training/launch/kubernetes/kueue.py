"""Queueing on a shared cluster with Kueue: what the Job carries, and a queued Job seen
from outside.

With ``options.kueue_queue`` the Job is labelled ``kueue.x-k8s.io/queue-name: <queue>``
(a LocalQueue in the Job's namespace) and created suspended (``spec.suspend: true``):
no pod exists until Kueue admits the whole Job against its ClusterQueue's quota and
unsuspends it, so all the workers of a multi-worker run start together or not at all.

``QueueWatch`` is the follower's view of that wait: it says once that the Job is queued,
again every ``QUEUED_LOG_EVERY`` seconds, and when it was admitted. Suspended is not
failing: nothing that watches pods or deadlines of an admitted Job applies before then
(Kubernetes itself stops and resets ``activeDeadlineSeconds`` while a Job is suspended).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
QUEUED_LOG_EVERY = 60.0  # seconds between two "still queued" lines


def is_suspended(job: Any) -> bool:
    """Whether the Job (a ``V1Job``) is suspended: queued, or preempted back into its queue."""
    return bool(job.spec and job.spec.suspend)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


class QueueWatch:
    """Logs a suspended Job's wait: once when it is queued, then every
    ``QUEUED_LOG_EVERY`` seconds, and once when it is admitted."""

    def __init__(self, queue: str | None, job: str, workers: int, log: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.queue, self.job, self.workers, self.log, self.clock = queue, job, workers, log, clock
        self.since: float | None = None  # when it was first seen suspended, this wait
        self.logged_at = 0.0

    def _where(self) -> str:
        if self.queue:
            return f"in Kueue LocalQueue {self.queue!r}"
        return "(spec.suspend is true, no Kueue queue named)"

    def update(self, job: Any) -> bool:
        """Look at the Job as just read; True while it is suspended (queued)."""
        now = self.clock()
        if is_suspended(job):
            if self.since is None:
                self.since = self.logged_at = now
                self.log.info("Job %s is queued %s: suspended until it is admitted, then "
                              "its %d pod(s) start together", self.job, self._where(),
                              self.workers)
            elif now - self.logged_at >= QUEUED_LOG_EVERY:
                self.logged_at = now
                self.log.info("Job %s is still queued %s, for %s", self.job, self._where(),
                              _duration(now - self.since))
            return True
        if self.since is not None:
            self.log.info("Job %s was admitted after %s queued %s; following it", self.job,
                          _duration(now - self.since), self._where())
            self.since = None
        return False
