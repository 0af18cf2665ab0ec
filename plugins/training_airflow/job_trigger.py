"""``TrainingJobTrigger``: a deferred ``train`` or ``trial`` task's Kubernetes Job,
followed in the triggerer, so the task holds no worker slot while it trains.

The task applies the run's objects (``TrainingJob.apply``: dry run, ConfigMap, Service,
the Job created or an earlier try's found) and defers here (``launchers.py``). The
trigger follows the Job with the very looks the task makes when it does not defer
(``training.launch.kubernetes.follow.JobFollower``: the Job's state, a Kueue wait logged
every minute, each pod's new lines as ``[worker i]``, a progress line when it changes,
transient API errors retried). Each look is the ``kubernetes`` client's, in a thread
(``asyncio.to_thread``), so the triggerer's event loop never waits on the API server; its
lines are logged from the loop, and in Airflow 3 a trigger's lines are the task's log.

One event ends it, the task resuming on it (``Step.resume``): ``succeeded`` or
``failed`` with each pod's last lines (the resumed task words the failure from them, as
the task does today: ``TrainingJob.conclude``), ``error`` (the Job is gone or cannot be
read), or ``timed_out`` (the task's ``execution_timeout`` passed: ``stop_at``; the Job was
deleted first, as ``on_kill`` deletes it in a task). Airflow 3.3 enforces no
``execution_timeout`` on a deferred task itself: the trigger does.

``on_kill`` (Airflow 3.3 calls it only when a person marks the deferred task failed or
succeeded, or clears it) deletes the Job, and a sweep trial's lane is let go.
``cleanup`` deletes nothing: it also runs when the triggerer stops or hands the trigger
to another one, which then follows the same Job again (its lines from the start: a new
trigger has read none of them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

CLASSPATH = "training_airflow.job_trigger.TrainingJobTrigger"


class _Lines:
    """A log for a thread: keeps (level, message, args) until the loop logs them."""

    def __init__(self) -> None:
        self.kept: list[tuple[str, str, tuple[Any, ...]]] = []

    def __getattr__(self, level: str) -> Any:
        if level not in ("debug", "info", "warning", "error"):
            raise AttributeError(level)
        return lambda message, *args: self.kept.append((level, message, args))

    def drain(self) -> list[tuple[str, str, tuple[Any, ...]]]:
        kept, self.kept = self.kept, []
        return kept


class TrainingJobTrigger(BaseTrigger):
    """Follows Job ``namespace/name`` through the Airflow connection ``conn_id`` (module
    doc). ``workers``, ``failure_lines``, ``kueue_queue`` and ``poll_interval`` are the
    launch's (``KubernetesOptions``); ``stop_at``: the epoch second the task's
    ``execution_timeout`` ends, if it has one."""

    def __init__(self, *, conn_id: str, namespace: str, name: str, workers: int,
                 failure_lines: int, poll_interval: float, kueue_queue: str | None = None,
                 stop_at: float | None = None, trial: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.trial = trial  # a sweep trial's Job: {"storage", "study_name", "run_id", "slot"}
        self.conn_id, self.namespace, self.name = conn_id, namespace, name
        self.workers, self.failure_lines = workers, failure_lines
        self.poll_interval, self.kueue_queue, self.stop_at = poll_interval, kueue_queue, stop_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"conn_id": self.conn_id, "namespace": self.namespace,
                           "name": self.name, "workers": self.workers,
                           "failure_lines": self.failure_lines,
                           "poll_interval": self.poll_interval,
                           "kueue_queue": self.kueue_queue, "stop_at": self.stop_at,
                           "trial": self.trial}

    def _clients(self) -> tuple[Any, Any]:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        hook = KubernetesHook(conn_id=self.conn_id)
        return hook.core_v1_client, hook.batch_v1_client

    def _emit(self, lines: _Lines) -> None:
        for level, message, args in lines.drain():
            getattr(self.log, level)(message, *args)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from training.errors import LaunchError
        from training.launch.kubernetes.follow import JobFollower, job_state

        where = f"{self.namespace}/{self.name}"
        self.log.info("following Job %s in the triggerer (the task holds no worker slot); "
                      "a look every %g s", where, self.poll_interval)
        core, batch = await asyncio.to_thread(self._clients)
        lines = _Lines()
        follower = JobFollower(core, batch, self.namespace, self.name, workers=self.workers,
                               failure_lines=self.failure_lines,
                               kueue_queue=self.kueue_queue, log=lines)
        while True:
            if self.stop_at is not None and time.time() >= self.stop_at:
                await self._delete(batch)
                yield TriggerEvent({
                    "kind": "job", "status": "timed_out", "job": self.name,
                    "message": f"the task's execution_timeout passed while it followed Job "
                               f"{where}; the Job was deleted"})
                return
            try:
                job = await asyncio.to_thread(follower.look)
            except LaunchError as exc:
                self._emit(lines)
                yield TriggerEvent({"kind": "job", "status": "error", "job": self.name,
                                    "message": str(exc)})
                return
            self._emit(lines)
            if job is not None and job_state(job) != "running":
                await asyncio.to_thread(follower.pods.surface, job)
                self._emit(lines)
                yield TriggerEvent({"kind": "job", "status": job_state(job), "job": self.name,
                                    "tails": follower.tails()})
                return
            await asyncio.sleep(self.poll_interval)

    async def _delete(self, batch: Any = None) -> None:
        from kubernetes.client.exceptions import ApiException

        from training.launch.kubernetes.job import DELETE_BACKGROUND

        where = f"{self.namespace}/{self.name}"
        try:
            if batch is None:
                batch = (await asyncio.to_thread(self._clients))[1]
            await asyncio.to_thread(batch.delete_namespaced_job, self.name, self.namespace,
                                    body=DELETE_BACKGROUND)
        except ApiException as exc:
            if exc.status == 404:
                self.log.info("no Job %s to delete", where)
                return
            self.log.error("could not delete Job %s: HTTP %s %s", where, exc.status,
                           exc.reason)
            return
        self.log.warning("deleted Job %s; Kubernetes stops its pods", where)

    async def on_kill(self) -> None:
        """A person marked the deferred task failed or succeeded, or cleared it: delete
        the Job (Kubernetes then stops its pods), as the task's ``on_kill`` does. A sweep
        trial's lane is let go too, as a trial stopped in its task lets it go (its retry,
        if any, resumes it)."""
        await self._delete()
        if self.trial:
            await asyncio.to_thread(self._let_go_lane)

    def _let_go_lane(self) -> None:
        from training.sweep.slots import let_go
        from training_airflow.lane_trigger import open_study

        trial = self.trial or {}
        storage, study = open_study(trial["storage"], trial["study_name"])
        if let_go(storage, study, trial["run_id"], trial["slot"],
                  f"stopped while deferred: Job {self.namespace}/{self.name} deleted"):
            self.log.info("trial %s of sweep %s no longer holds a lane", trial["slot"],
                          trial["run_id"])
