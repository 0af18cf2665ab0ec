"""A fake Kubernetes API over HTTP, for the Kubernetes launch tests (no API server can run
here): ``FakeKubernetes`` is a small server on 127.0.0.1 that answers the few endpoints
the launcher calls, keeps the objects it is sent and plays a scripted Job (``Plan``:
pods, logs with timestamps, conditions, a time suspended in a Kueue queue).
``running_cluster`` starts one and points the launcher's deployment settings at it.
What a Job's pods would leave behind (a trial's history on the shared volume) is the
test's to write, in ``on_start``."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlparse

if TYPE_CHECKING:
    from training.config import RunConfig

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
TOKEN = f"fake-bearer-{uuid.uuid4().hex}"
AWS_SECRET = f"never-log-me-{uuid.uuid4().hex}"
NAMESPACE = "ml"


@dataclass
class Plan:
    """How the fake plays a Job: polls until the end, the outcome, each worker's log."""

    outcome: str = "succeeded"  # or "failed", or "never"
    polls: int = 3  # status reads before the Job ends (counted from when it starts)
    queued: int = 0  # status reads a Job created suspended stays so, before Kueue admits it
    lines: int = 4  # log lines per worker
    failing: int = 1  # the worker that fails first
    reason: str = "Error"
    exit_code: int = 1
    tail: tuple[str, ...] = ("Traceback (most recent call last):", "ValueError: boom")


@dataclass
class FakeJob:
    body: dict
    plan: Plan
    uid: str
    reads: int = 0  # status reads since it started (was admitted)
    queued_reads: int = 0  # status reads while it was suspended
    pods: list[str] = field(default_factory=list)


def _stamp(second: int, fraction: str) -> str:
    return f"2026-03-01T00:{second // 60:02d}:{second % 60:02d}{fraction}Z"


class FakeKubernetes:
    """The objects, pods and logs of one namespace-scoped fake cluster."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict, dict | None]] = []  # method, path, query, body
        self.objects: dict[tuple[str, str], dict] = {}  # (kind, name) -> body
        self.jobs: dict[str, FakeJob] = {}
        self.pods: dict[str, dict] = {}
        self.logs: dict[str, list[str]] = {}  # pod -> timestamped lines
        self.plans: list[Plan] = []  # the next Jobs' plans, in creation order
        self.faults: list[tuple[str, str, int]] = []  # (method, path regex, status), once each
        self.on_start: Callable[[dict], None] | None = None  # the pods' work, given the Job
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)

    # --- what a test reads ------------------------------------------------------------
    def created(self, dry_run: bool = False) -> list[tuple[str, str, dict]]:
        """(kind path, namespace, body) of every POST (or every dry-run POST), in order."""
        out = []
        for method, path, query, body in self.requests:
            match = re.fullmatch(r"/api(?:s/batch)?/v1/namespaces/([^/]+)/(\w+)", path)
            if method == "POST" and match and ("dryRun" in query) == dry_run:
                out.append((match.group(2), match.group(1), body))
        return out

    def changes(self) -> list[tuple[str, str]]:
        """(method, path) of every request but reads; dry runs marked ``?dryRun=All``."""
        return [(m, p + ("?dryRun=" + q["dryRun"][0] if "dryRun" in q else ""))
                for m, p, q, _ in self.requests if m != "GET"]

    def calls(self, method: str, pattern: str) -> list[tuple[str, str, dict, dict | None]]:
        return [r for r in self.requests if r[0] == method and re.search(pattern, r[1])]

    def worker_lines(self, pod: str) -> list[str]:
        return [line.split(" ", 1)[1] for line in self.logs[pod]]

    # --- the cluster's side -----------------------------------------------------------
    def _create_job(self, body: dict) -> dict:
        name = body["metadata"]["name"]
        plan = self.plans.pop(0) if self.plans else Plan()
        uid = uuid.uuid4().hex
        stored = json.loads(json.dumps(body))
        stored["metadata"]["uid"] = uid
        stored["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        job = self.jobs[name] = FakeJob(stored, plan, uid)
        if body["spec"].get("suspend"):  # as the Job controller does: no pods yet
            stored["status"] = {"conditions": [{"type": "Suspended", "status": "True",
                                                "reason": "JobSuspended"}]}
        else:
            self._start(job)
        return stored

    def _start(self, job: FakeJob) -> None:
        """The Job's pods and their logs, as when it starts (or Kueue admits it)."""
        body, plan, uid, name = job.body, job.plan, job.uid, job.body["metadata"]["name"]
        body["status"] = {"active": body["spec"]["parallelism"]}
        template = body["spec"]["template"]
        for index in range(body["spec"]["completions"]):
            pod = f"{name}-{index}-{uid[:5]}"
            job.pods.append(pod)
            labels = {**template["metadata"]["labels"], "job-name": name,
                      "batch.kubernetes.io/job-name": name, "controller-uid": uid,
                      "batch.kubernetes.io/controller-uid": uid, INDEX_KEY: str(index)}
            self.pods[pod] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": body["metadata"]["namespace"],
                             "labels": labels, "annotations": {INDEX_KEY: str(index)}},
                "spec": {"containers": [{"name": "trainer",
                                         "image": template["spec"]["containers"][0]["image"]}]},
                "status": {"phase": "Running", "containerStatuses": [self._status(
                    {"running": {"startedAt": _stamp(0, "")}})]},
            }
            # Fraction digits vary as with RFC 3339 nano; two lines share a timestamp.
            lines = [f"{_stamp(j + 1, '.5' if j % 2 else '.123456789')} "
                     f"uid {uid[:5]} worker {index} line {j}" for j in range(plan.lines)]
            lines.insert(1, lines[0].replace(" line 0", " line 0 again"))
            if plan.outcome == "failed" and index == plan.failing:
                lines += [f"{_stamp(50, '.25')} {text}" for text in plan.tail]
            self.logs[pod] = lines
        if self.on_start is not None:
            self.on_start(body)

    @staticmethod
    def _status(state: dict) -> dict:
        return {"name": "trainer", "image": "img", "imageID": "", "ready": "running" in state,
                "restartCount": 0, "state": state}

    def _advance(self, job: FakeJob) -> None:
        plan = job.plan
        if job.body["spec"].get("suspend"):
            job.queued_reads += 1
            if job.queued_reads < plan.queued:
                return
            job.body["spec"]["suspend"] = False  # what Kueue does once it admits the Job
            self._start(job)
            return
        job.reads += 1
        if plan.outcome == "never" or job.reads < plan.polls or job.body["status"].get(
            "conditions"
        ):
            return
        for index, pod in enumerate(job.pods):
            failed = plan.outcome == "failed"
            code = (plan.exit_code if index == plan.failing else 143) if failed else 0
            finished = 60 if index == plan.failing else 65
            self.pods[pod]["status"] = {
                "phase": "Failed" if code else "Succeeded",
                "containerStatuses": [self._status({"terminated": {
                    "exitCode": code, "reason": plan.reason if code else "Completed",
                    "startedAt": _stamp(0, ""), "finishedAt": _stamp(finished, "")}})],
            }
        kind, reason = (("Failed", "BackoffLimitExceeded") if plan.outcome == "failed"
                        else ("Complete", "CompletionsReached"))
        job.body["status"] = {
            "succeeded" if kind == "Complete" else "failed": len(job.pods),
            "conditions": [{"type": kind, "status": "True", "reason": reason,
                            "message": "Job has reached the specified backoff limit"
                            if kind == "Failed" else "Reached expected number of succeeded pods",
                            "lastTransitionTime": _stamp(70, "")}],
        }

    def _visible_lines(self, pod: str) -> list[str]:
        """Logs grow as the Job is polled: line k appears after k status reads."""
        job = next(j for j in self.jobs.values() if pod in j.pods) if any(
            pod in j.pods for j in self.jobs.values()) else None
        lines = self.logs[pod]
        if job is None or job.body["status"].get("conditions"):
            return lines
        return lines[: job.reads + 1]

    # --- HTTP -------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict | None):
        with self.lock:
            self.requests.append((method, path, query, body))
            for fault in self.faults:
                if fault[0] == method and re.search(fault[1], path):
                    self.faults.remove(fault)
                    return fault[2], _status_body(fault[2], "Injected", "injected by the test")
            parts = path.strip("/").split("/")
            # /api/v1/namespaces/{ns}/{kind}[/{name}[/{sub}]]
            # /apis/batch/v1/namespaces/{ns}/{kind}[/{name}[/{sub}]]
            rest = parts[3:] if parts[0] == "api" else parts[4:]
            kind, name, sub = rest[1], (rest[2] if len(rest) > 2 else None), (
                rest[3] if len(rest) > 3 else None)
            if kind in ("configmaps", "services", "jobs") and method == "POST":
                key = (kind, body["metadata"]["name"])
                if key in self.objects:
                    return 409, _status_body(409, "AlreadyExists",
                                             f'{kind} "{key[1]}" already exists')
                if query.get("dryRun") == ["All"]:  # checked, answered, not stored
                    return 201, body
                stored = self._create_job(body) if kind == "jobs" else body
                self.objects[key] = stored
                return 201, stored
            if kind in ("configmaps", "services") and method == "PUT":
                self.objects[(kind, name)] = body
                return 200, body
            if kind == "jobs" and name is not None:
                job = self.jobs.get(name)
                if job is None or ("jobs", name) not in self.objects:
                    return 404, _status_body(404, "NotFound", f'jobs "{name}" not found')
                if method == "GET":
                    self._advance(job)
                    return 200, job.body
                if method == "DELETE":
                    # Background propagation: the Job goes now, its pods stay a while.
                    del self.objects[("jobs", name)]
                    del self.jobs[name]
                    return 200, _status_body(200, "", "deleted")
            if kind == "pods" and name is None and method == "GET":
                wanted = dict(p.split("=", 1) for p in query["labelSelector"][0].split(","))
                items = [p for p in self.pods.values()
                         if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {},
                             "items": items}
            if kind == "pods" and sub == "log":
                if name not in self.pods:
                    return 404, _status_body(404, "NotFound", f'pods "{name}" not found')
                lines = self._visible_lines(name)
                if query.get("timestamps", [""])[0].lower() != "true":  # Go ParseBool
                    lines = [line.split(" ", 1)[1] for line in lines]
                if "tailLines" in query:
                    lines = lines[-int(query["tailLines"][0]):]
                return 200, "".join(line + "\n" for line in lines)  # ignores sinceSeconds
        return 404, _status_body(404, "NotFound", f"no fake for {method} {path}")

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                status, payload = fake.handle(self.command, url.path, parse_qs(url.query), body)
                data = payload.encode() if isinstance(payload, str) else json.dumps(
                    payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str)
                                 else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args) -> None:
                pass

        return Handler


def _status_body(code: int, reason: str, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure" if code >= 400 else
            "Success", "reason": reason, "message": message, "code": code}


# --- fixtures -------------------------------------------------------------------------


def two_pod_config(run_id: str) -> RunConfig:
    """The run the Kubernetes DAG tests launch: two pods, three epochs, the paths a pod
    sees on its volume."""
    from training.config import RunConfig

    return RunConfig.from_flat({
        "launcher": "kubernetes", "workers": 2, "epochs": 3, "run_id": run_id,
        "output_dir": "/data/training/runs", "staging_dir": "/data/training/datasets",
    })


@contextlib.contextmanager
def running_cluster(monkeypatch) -> Iterator[FakeKubernetes]:
    """A ``FakeKubernetes`` serving, named by the Airflow connection ``kubernetes_fake``
    (``TRAINING_K8S_CONN_ID``, namespace ``NAMESPACE``, its bearer ``TOKEN``), the other
    ``TRAINING_K8S_*`` settings unset; the worker's own ``AWS_SECRET_ACCESS_KEY`` is
    ``AWS_SECRET`` (never to be sent)."""
    fake = FakeKubernetes()
    fake.thread.start()
    kube_config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "airflow"}}],
        "users": [{"name": "airflow", "user": {"token": TOKEN}}],
    }
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_FAKE", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config": kube_config}}))
    monkeypatch.setenv("TRAINING_K8S_CONN_ID", "kubernetes_fake")
    monkeypatch.setenv("TRAINING_K8S_NAMESPACE", NAMESPACE)
    monkeypatch.setenv("TRAINING_K8S_CREDENTIALS_SECRET", "training-s3")
    monkeypatch.setenv("TRAINING_K8S_POLL_INTERVAL", "0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    for key in ("TRAINING_K8S_OPTIONS", "TRAINING_K8S_IMAGE", "TRAINING_K8S_SERVICE_ACCOUNT",
                "TRAINING_K8S_SHARED_PVC", "TRAINING_K8S_SHARED_MOUNT",
                "TRAINING_K8S_KUEUE_QUEUE"):
        monkeypatch.delenv(key, raising=False)
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
