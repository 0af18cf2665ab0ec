"""``TrainingJob``: apply a run's objects, follow its Job to the end, and stop it.

``TrainingJob(cfg, options, log)`` renders (and so checks) the objects; ``run(core,
batch)`` takes plain ``kubernetes`` API clients (``CoreV1Api``, ``BatchV1Api``),
wherever they came from (the Airflow launcher gets them from the cncf-kubernetes
provider's ``KubernetesHook``), and:

1. asks the API server to admit the Job in a **dry run** (``dryRun=All``: validated,
   defaulted and passed through admission, not stored), so a Job the cluster would
   refuse fails the launch before anything is created;
2. creates the ConfigMap (replaced when it exists) and the headless Service (reused);
3. creates the Job, or finds the one of an earlier try (the names derive from the run
   id only): one that **succeeded** ends the launch at once (the model is written);
   one that **failed** is deleted (propagation ``Background``) and created again, and
   the training resumes from its backup; one still **running** is followed again; one
   of another config (fingerprint annotation) is refused;
4. polls the Job every ``options.poll_interval`` seconds, copying its pods' output into
   the log as ``[worker <index>] ...`` (pods selected by the Job's own selector, its
   controller uid, so the pods of a deleted earlier try never mix in) and retrying
   transient API errors. A suspended Job (``options.kueue_queue``: waiting for Kueue to
   admit it) is queued, not failing: the log says so once and then every minute
   (``kueue.QueueWatch``), and it is followed as above once Kueue unsuspends it;
5. returns ``{"run_id", "run_dir", "job", "namespace"}``, or raises ``LaunchError``
   naming the pod that failed first, its reason and exit code, and its last lines.

``stop()`` deletes the Job (Kubernetes then stops the pods); safe from a signal handler.

A deferred task splits ``run``: ``apply`` (1-3) in the task, the looks of step 4 in its
trigger (``follower()``: a ``follow.JobFollower``, the same looks ``run`` makes), and
``conclude`` (5) when the task resumes, with the pods' last lines the trigger read.

Just over 300 lines on purpose: applying, following and stopping share the Job's state
(its name, its clients, whether it was stopped) and are one idea; one look at a Job is
``follow.py``'s, pod logs and the failure message are ``logs.py``'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from training.config import RunConfig
from training.errors import LaunchError
from training.launch.kubernetes.follow import (
    JobFollower,
    condition_text,
    job_state,
    read_job,
    seed,
)
from training.launch.kubernetes.logs import PodWatch, api_error_text
from training.launch.kubernetes.manifests import FINGERPRINT_KEY, render
from training.launch.kubernetes.options import ENV_SHARED_PVC, KubernetesOptions

DELETE_BACKGROUND = {"propagationPolicy": "Background"}
PERMISSIONS = ("create and update on configmaps, create on services, create and delete on "
               "jobs, get on jobs/status, get and list on pods and pods/log")


class TrainingJob:
    """One run's objects on a cluster; ``run()`` follows them, ``stop()`` deletes the Job."""

    def __init__(self, cfg: RunConfig, options: KubernetesOptions, log: Any, *,
                 identity: str = "the Kubernetes identity in use",
                 staged: Mapping[str, Any] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Render (and so check) the run's objects; nothing touches a cluster before
        ``run``. ``identity`` names who calls the API, in permission errors; ``staged``
        is the staged dataset the pods train on (``manifests.render``); ``sleep`` and
        ``clock`` pace the polls and the "still queued" lines."""
        self.cfg, self.options = cfg, options
        self.config_map, self.service, self.job = render(cfg, options, staged)
        self.name = self.job["metadata"]["name"]
        self.namespace = options.namespace
        self.log, self.identity, self.sleep, self.clock = log, identity, sleep, clock
        self.core: Any = None
        self.batch: Any = None
        self.new_batch: Callable[[], Any] | None = None
        self.pods: Any = None  # PodWatch of the run's pods, once run() has clients
        self.stopped = False

    # --- apply ------------------------------------------------------------------------
    def run(self, core: Any, batch: Any,
            new_batch: Callable[[], Any] | None = None) -> dict[str, Any]:
        """Apply the objects with ``core``/``batch`` (``CoreV1Api``/``BatchV1Api``) and
        follow the Job; raise ``LaunchError`` if it fails. ``new_batch`` makes the fresh
        ``BatchV1Api`` that ``stop()`` uses (default: a new client of ``batch``'s
        configuration)."""
        job = self.apply(core, batch, new_batch)
        if job_state(job) != "succeeded":
            job = self._follow(job)
        self.pods.surface(job)
        return self.conclude(job)

    def apply(self, core: Any, batch: Any,
              new_batch: Callable[[], Any] | None = None) -> Any:
        """Dry run, ConfigMap, Service, then the Job created or found (``run``'s first
        part, all a deferred task does before it hands the wait to its trigger)."""
        self.attach(core, batch, new_batch)
        if self.stopped:
            raise LaunchError(f"Job {self.namespace}/{self.name} was stopped before it started")
        if self.options.shared_volume_claim is None:
            self.log.warning(
                "no shared volume (%s): the pods write %s on their own disks, where the "
                "evaluate and publish tasks cannot read it", ENV_SHARED_PVC,
                self.cfg.storage.output_dir)
        self._dry_run_job()
        self._apply_config_map()
        self._apply_service()
        return self._create_or_reuse_job()

    def attach(self, core: Any, batch: Any,
               new_batch: Callable[[], Any] | None = None) -> None:
        """Use these clients (``run`` and ``apply`` do; a resumed task, to conclude)."""
        self.core, self.batch, self.new_batch = core, batch, new_batch or self._new_batch
        self.pods = PodWatch(core, self.namespace, self.name, self.options.failure_lines,
                             self.log)

    def conclude(self, job: Any, tails: Mapping[str, list[str]] | None = None
                 ) -> dict[str, Any]:
        """The launch's XCom for a Job that succeeded; LaunchError naming the pod that
        failed first, its reason, exit code and last lines (``tails``: those another
        follower read, the trigger's) for one that failed."""
        if tails:
            seed(self.pods, tails)
        if job_state(job) == "failed":
            headline = (f"Kubernetes Job {self.namespace}/{self.name} failed "
                        f"({condition_text(job)})")
            raise LaunchError(self.pods.failure_message(headline, job))
        if job_state(job) != "succeeded":
            raise LaunchError(f"Job {self.namespace}/{self.name} has not ended "
                              f"({condition_text(job)})")
        self.log.info("Job %s/%s succeeded", self.namespace, self.name)
        return {"run_id": self.cfg.run_id, "run_dir": os.fspath(self.cfg.run_dir()),
                "job": self.name, "namespace": self.namespace}

    def read(self) -> Any:
        """The Job as it is now; LaunchError when it is gone."""
        return read_job(self.batch, self.namespace, self.name)

    def _dry_run_job(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.batch.create_namespaced_job(self.namespace, self.job, dry_run="All")
        except ApiException as exc:
            if exc.status != 409:  # 409: an earlier try's Job, handled below
                raise self._api_error("create the Job", exc, "; refused in a dry run, "
                                      "nothing was created") from None

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
        self.log.info("created Job %s/%s: %d worker(s), image %s%s", self.namespace, self.name,
                      spec["completions"], spec["template"]["spec"]["containers"][0]["image"],
                      f", for Kueue LocalQueue {self.options.kueue_queue!r}"
                      if self.options.kueue_queue else "")
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
                             self.namespace, self.name, condition_text(existing))
            self.batch.delete_namespaced_job(self.name, self.namespace, body=DELETE_BACKGROUND)
            self._wait_deleted()
            return self._create_job()
        theirs = (existing.metadata.annotations or {}).get(FINGERPRINT_KEY)
        ours = self.job["metadata"]["annotations"][FINGERPRINT_KEY]
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
        return read_job(self.batch, self.namespace, self.name)

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
            self.sleep(min(max(self.options.poll_interval, 0.1), 5.0))

    # --- follow -----------------------------------------------------------------------
    def _follow(self, job: Any) -> Any:
        """Poll the Job until it succeeds or fails, copying pod output into the log."""
        follower = self.follower(self.clock)
        self.pods = follower.pods  # its lines' tails word a failure (conclude)
        follower.start(job)
        while True:
            if self.stopped:
                raise LaunchError(f"Job {self.namespace}/{self.name} was stopped")
            if job_state(job) != "running":
                return job
            self.sleep(self.options.poll_interval)
            job = follower.look() or job

    def follower(self, clock: Callable[[], float] = time.monotonic,
                 log: Any = None) -> JobFollower:
        """A ``JobFollower`` of this Job on this launch's clients."""
        return JobFollower(self.core, self.batch, self.namespace, self.name,
                           workers=self.job["spec"]["completions"],
                           failure_lines=self.options.failure_lines,
                           kueue_queue=self.options.kueue_queue, log=log or self.log,
                           clock=clock)

    # --- stop -------------------------------------------------------------------------
    def _new_batch(self) -> Any:
        from kubernetes.client import ApiClient, BatchV1Api

        return BatchV1Api(api_client=ApiClient(self.batch.api_client.configuration))

    def stop(self) -> None:
        """Delete the Job (Kubernetes then stops its pods); safe to call more than once."""
        from kubernetes.client.exceptions import ApiException

        self.stopped = True
        if self.new_batch is None:  # run() has not started: there is no Job to delete
            self.log.info("stopped before Job %s/%s was created", self.namespace, self.name)
            return
        # A fresh client: this runs in a signal handler, maybe inside a request.
        try:
            self.new_batch().delete_namespaced_job(self.name, self.namespace,
                                                   body=DELETE_BACKGROUND)
        except ApiException as exc:
            if exc.status == 404:
                self.log.info("no Job %s/%s to delete", self.namespace, self.name)
            else:
                self.log.error("could not delete Job %s/%s: %s", self.namespace, self.name,
                               api_error_text(exc))
            return
        self.log.warning("deleted Job %s/%s; Kubernetes stops its pods", self.namespace,
                         self.name)

    def _api_error(self, action: str, exc: BaseException, note: str = "") -> LaunchError:
        hint = ""
        if getattr(exc, "status", None) == 403:
            hint = f"; {self.identity} needs, in namespace {self.namespace!r}: {PERMISSIONS}"
        elif getattr(exc, "status", None) == 404:
            hint = f"; does namespace {self.namespace!r} exist?"
        return LaunchError(f"cannot {action} {self.namespace}/{self.name}: "
                           f"{api_error_text(exc)}{hint}{note}")
