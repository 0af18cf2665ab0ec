"""``launcher=kubernetes``: the TrainOperator (``training_airflow.launchers``)
gets the API clients from the cncf-kubernetes provider's ``KubernetesHook`` and runs
``training.launch.kubernetes.TrainingJob``: a dry run of the Job, then the objects
applied, the Job followed, worker logs and failures surfaced, resumed on retry, and the
Job deleted on kill.

There is no cluster here. Only the Kubernetes API is faked: ``FakeKubernetes`` is a small
HTTP server on 127.0.0.1 that answers the few endpoints the launcher calls, keeps the
objects it is sent and plays a scripted Job (pods, logs with timestamps, conditions).
Everything else is real: the Airflow connection (from an ``AIRFLOW_CONN_*`` variable),
``KubernetesHook`` and the official ``kubernetes`` client over HTTP, ``RunConfig``,
``render`` and ``TrainOperator``.

What the fake cannot prove: that a real API server accepts the bodies (the launcher asks
one in a ``dryRun=All`` create; the fake only answers it, and the render tests check the
bodies against the client's models), RBAC, scheduling, DNS between workers, the
kubelet's log format in every edge case, or garbage collection timing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from training.config import RunConfig
from training.launch import kubernetes as k8s

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
TOKEN = f"fake-bearer-{uuid.uuid4().hex}"
AWS_SECRET = f"never-log-me-{uuid.uuid4().hex}"
NAMESPACE = "ml"
RUN_ID = "manual__2026-03-01T00-00-00"
# What stage_dataset hands over through XCom; the pods train on it.
STAGED = {"name": "digits", "version": "1.0.0", "path": "/data/datasets/digits/1.0.0",
          "staging_dir": "/data/datasets", "fingerprint": "0" * 64}


# --- a fake Kubernetes API over HTTP --------------------------------------------------
@dataclass
class Plan:
    """How the fake plays a Job: polls until the end, the outcome, each worker's log."""

    outcome: str = "succeeded"  # or "failed", or "never"
    polls: int = 3  # status reads before the Job ends
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
    reads: int = 0
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
        stored["status"] = {"active": body["spec"]["parallelism"]}
        job = self.jobs[name] = FakeJob(stored, plan, uid)
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
        return stored

    @staticmethod
    def _status(state: dict) -> dict:
        return {"name": "trainer", "image": "img", "imageID": "", "ready": "running" in state,
                "restartCount": 0, "state": state}

    def _advance(self, job: FakeJob) -> None:
        job.reads += 1
        plan = job.plan
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
@pytest.fixture
def cluster(monkeypatch):
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
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)  # the worker's own; never sent
    for key in ("TRAINING_K8S_OPTIONS", "TRAINING_K8S_IMAGE", "TRAINING_K8S_SERVICE_ACCOUNT",
                "TRAINING_K8S_SHARED_PVC", "TRAINING_K8S_SHARED_MOUNT"):
        monkeypatch.delenv(key, raising=False)
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


@pytest.fixture
def cfg() -> RunConfig:
    return RunConfig.from_flat({
        "launcher": "kubernetes", "workers": 2, "epochs": 3, "run_id": RUN_ID,
        "output_dir": "/data/training/runs", "staging_dir": "/data/training/datasets",
    })


@pytest.fixture
def operator():
    from training_airflow.tasks import TrainOperator

    return TrainOperator(task_id="train", staged=STAGED)


def launch(operator, cfg):
    from structlog.testing import capture_logs

    from training_airflow.launchers import LAUNCHERS

    with capture_logs() as logs:
        try:
            return LAUNCHERS["kubernetes"](operator, cfg, {}), logs, None
        except Exception as exc:  # handed to the test
            return None, logs, exc


def messages(logs) -> list[str]:
    return [entry["event"] for entry in logs]


def worker_messages(logs, index: int) -> list[str]:
    prefix = f"[worker {index}] "
    return [m[len(prefix):] for m in messages(logs) if m.startswith(prefix)]


# --- tests ----------------------------------------------------------------------------
def test_success_applies_configmap_service_job_and_logs_every_worker(cluster, cfg, operator):
    result, logs, error = launch(operator, cfg)

    assert error is None
    name = k8s.job_name(cfg.run_id)
    assert result == {"run_id": RUN_ID, "run_dir": f"/data/training/runs/{RUN_ID}",
                      "job": name, "namespace": NAMESPACE}
    expected = k8s.render(cfg, k8s.KubernetesOptions(namespace=NAMESPACE,
                                                     credentials_secret="training-s3"),
                          STAGED)
    assert cluster.created() == [("configmaps", NAMESPACE, expected[0]),
                                 ("services", NAMESPACE, expected[1]),
                                 ("jobs", NAMESPACE, expected[2])]
    # The API server was asked to admit the very same Job first, in a dry run.
    assert cluster.created(dry_run=True) == [("jobs", NAMESPACE, expected[2])]
    assert cluster.changes()[0] == ("POST", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
                                             "?dryRun=All")
    assert len(cluster.calls("GET", r"/jobs/[^/]+/status$")) >= 3  # followed, not fire-and-forget
    # Every line of every worker, once, in order, under its worker's prefix; the log was
    # read more than once (it grew while polling) and repeats were dropped.
    for index, pod in enumerate(cluster.jobs[name].pods):
        assert worker_messages(logs, index) == cluster.worker_lines(pod)
        assert len(cluster.calls("GET", rf"/pods/{pod}/log$")) > 1
    assert any("succeeded" in m for m in messages(logs))


def test_failure_names_the_failed_pod_its_reason_and_last_lines(cluster, cfg, operator):
    cluster.plans.append(Plan(outcome="failed", failing=1, reason="OOMKilled", exit_code=137))

    result, logs, error = launch(operator, cfg)

    from training.errors import LaunchError

    assert result is None and isinstance(error, LaunchError)
    name = k8s.job_name(cfg.run_id)
    failed_pod, other_pod = cluster.jobs[name].pods[1], cluster.jobs[name].pods[0]
    text = str(error)
    assert f"Kubernetes Job {NAMESPACE}/{name} failed (BackoffLimitExceeded" in text
    headline = text.splitlines()[1]  # the pod that failed first comes first
    assert headline.startswith(f"pod {failed_pod} (worker 1) failed: OOMKilled, exit code 137")
    assert "Traceback (most recent call last):\n    ValueError: boom" in text
    assert text.index(failed_pod) < text.index(other_pod)  # the other one was stopped later
    assert worker_messages(logs, 1)[-1] == "ValueError: boom"  # also in the task log


def test_retry_after_failure_deletes_and_recreates_the_job(cluster, cfg, operator):
    cluster.plans += [Plan(outcome="failed"), Plan(outcome="succeeded")]
    _, _, first_error = launch(operator, cfg)
    assert first_error is not None
    name = k8s.job_name(cfg.run_id)
    old_pods = list(cluster.pods)

    result, logs, error = launch(operator, cfg)  # the Airflow retry

    assert error is None and result["job"] == name
    (delete,) = cluster.calls("DELETE", rf"/jobs/{name}$")
    assert delete[3]["propagationPolicy"] == "Background"
    # The retry: ConfigMap replaced, Service reused, the Job deleted, then created again.
    jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    retry = cluster.changes()[4:]  # the first try: dry run, ConfigMap, Service, Job
    assert retry == [("POST", f"{jobs}?dryRun=All"),  # 409: the first try's Job exists
                     ("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps"),
                     ("PUT", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}"),
                     ("POST", f"/api/v1/namespaces/{NAMESPACE}/services"),
                     ("POST", jobs),  # 409: the failed Job of the first try
                     ("DELETE", f"{jobs}/{name}"),
                     ("POST", jobs)]
    # The old pods still exist (garbage collection is lazy) but are not the new Job's.
    new_pods = cluster.jobs[name].pods
    assert set(old_pods).isdisjoint(new_pods)
    uid = cluster.jobs[name].uid[:5]
    assert worker_messages(logs, 0) and all(f"uid {uid}" in m for m in worker_messages(logs, 0))


def test_retry_after_success_does_not_train_again(cluster, cfg, operator):
    first, _, _ = launch(operator, cfg)
    name = k8s.job_name(cfg.run_id)
    pods = list(cluster.jobs[name].pods)

    second, logs, error = launch(operator, cfg)

    assert error is None and second == first
    assert cluster.calls("DELETE", r"/jobs/") == []
    assert cluster.jobs[name].pods == pods  # the same Job: nothing recreated
    assert any("already succeeded" in m for m in messages(logs))


def test_retry_follows_a_job_that_is_still_running(cluster, cfg, operator):
    objects = k8s.render(cfg, k8s.KubernetesOptions(namespace=NAMESPACE,
                                                    credentials_secret="training-s3"))
    cluster.plans.append(Plan(polls=4))
    cluster.handle("POST", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", {}, objects[2])
    name = k8s.job_name(cfg.run_id)

    result, logs, error = launch(operator, cfg)

    assert error is None and result["job"] == name
    assert cluster.calls("DELETE", r"/jobs/") == []
    assert any("still running; following it" in m for m in messages(logs))
    assert worker_messages(logs, 1) == cluster.worker_lines(cluster.jobs[name].pods[1])


def test_transient_api_errors_while_following_are_retried(cluster, cfg, operator):
    cluster.faults += [("GET", r"/jobs/[^/]+/status$", 503), ("GET", r"/pods$", 500)]

    result, logs, error = launch(operator, cfg)

    assert error is None and result["job"] == k8s.job_name(cfg.run_id)
    assert cluster.faults == []
    assert any("HTTP 503" in m and "try 1 of" in m for m in messages(logs))


def test_a_refused_create_says_which_permissions_are_missing(cluster, cfg, operator):
    cluster.faults.append(("POST", r"/jobs$", 403))

    _, _, error = launch(operator, cfg)

    from training.errors import LaunchError

    assert isinstance(error, LaunchError)
    assert f"cannot create the Job {NAMESPACE}/{k8s.job_name(cfg.run_id)}: HTTP 403" in str(error)
    assert "the Airflow connection 'kubernetes_fake' needs, in namespace 'ml'" in str(error)
    assert "create and delete on jobs, get on jobs/status" in str(error)
    assert cluster.created() == []  # refused in the dry run: nothing half-applied


def test_a_job_the_api_server_refuses_creates_nothing(cluster, cfg, operator):
    cluster.faults.append(("POST", r"/jobs$", 422))

    _, _, error = launch(operator, cfg)

    from training.errors import LaunchError

    assert isinstance(error, LaunchError)
    name = k8s.job_name(cfg.run_id)
    assert str(error) == (f"cannot create the Job {NAMESPACE}/{name}: HTTP 422 "
                          "Unprocessable Entity: injected by the test; refused in a dry run, "
                          "nothing was created")
    assert cluster.created(dry_run=True) and cluster.created() == []


def test_a_job_of_another_config_is_not_reused(cluster, cfg, operator):
    other = RunConfig.from_flat({**cfg.to_flat(), "epochs": 9})
    assert k8s.job_name(other.run_id) == k8s.job_name(cfg.run_id)
    launch(operator, other)

    _, _, error = launch(operator, cfg)

    assert "config fingerprint" in str(error) and "kubectl -n ml delete job" in str(error)


def test_execute_and_on_kill_delete_the_job(cluster, monkeypatch):
    from structlog.testing import capture_logs

    from training.errors import LaunchError
    from training_airflow.params import config_for_run
    from training_airflow.tasks import TrainOperator

    monkeypatch.setenv("TRAINING_K8S_POLL_INTERVAL", "0.02")
    cluster.plans.append(Plan(outcome="never"))
    params = {"launcher": "kubernetes", "epochs": 2}
    name = k8s.job_name(config_for_run(params, RUN_ID).run_id)
    operator = TrainOperator(task_id="train", staged=STAGED)
    outcome: dict = {}

    def execute() -> None:
        try:
            outcome["result"] = operator.execute({"params": params, "run_id": RUN_ID})
        except Exception as exc:
            outcome["error"] = exc

    with capture_logs() as logs:
        thread = threading.Thread(target=execute, daemon=True)
        thread.start()
        deadline = time.monotonic() + 300  # a hang guard, not a measurement
        while len(cluster.calls("GET", rf"/jobs/{name}/status$")) < 3:
            assert time.monotonic() < deadline, "the Job was never followed"
            time.sleep(0.01)
        operator.on_kill()
        thread.join(10)

    assert not thread.is_alive()
    (delete,) = cluster.calls("DELETE", rf"/jobs/{name}$")
    assert delete[3]["propagationPolicy"] == "Background"
    assert isinstance(outcome.get("error"), LaunchError)
    assert any(f"deleted Job {NAMESPACE}/{name}" in m for m in messages(logs))


def test_execute_returns_the_launch_dict(cluster):
    from training_airflow.params import config_for_run
    from training_airflow.tasks import TrainOperator

    params = {"launcher": "kubernetes", "epochs": 2}
    cfg = config_for_run(params, RUN_ID)

    result = TrainOperator(task_id="train", staged=STAGED).execute({"params": params,
                                                                    "run_id": RUN_ID})

    assert result == {"run_id": cfg.run_id, "run_dir": str(cfg.run_dir()),
                      "job": k8s.job_name(cfg.run_id), "namespace": NAMESPACE}
    config_map = cluster.objects[("configmaps", result["job"])]
    assert RunConfig.from_json(config_map["data"]["config.json"]) == cfg


def test_no_secret_in_requests_logs_or_result(cluster, cfg, operator):
    cluster.plans.append(Plan(outcome="failed"))
    _, fail_logs, error = launch(operator, cfg)
    result, logs, _ = launch(operator, cfg)

    sent = json.dumps([body for _, _, _, body in cluster.requests])
    seen = json.dumps([messages(fail_logs), messages(logs), str(error), result])
    for secret in (AWS_SECRET, TOKEN):
        assert secret not in sent and secret not in seen
    env = {e["name"]: e for e in
           cluster.objects[("jobs", result["job"])]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
        "secretKeyRef": {"name": "training-s3", "key": "AWS_SECRET_ACCESS_KEY"}}}


def test_shared_volume_claim_is_mounted_over_output_and_staging_dirs(cluster, cfg, operator,
                                                                     monkeypatch):
    monkeypatch.setenv("TRAINING_K8S_SHARED_PVC", "training-data")

    result, logs, error = launch(operator, cfg)

    assert error is None
    pod = cluster.objects[("jobs", result["job"])]["spec"]["template"]["spec"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "training-data"}} in (
        pod["volumes"])
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "shared", "mountPath": "/data/training"} in mounts
    assert {"name": "config", "mountPath": "/etc/training", "readOnly": True} in mounts
    assert not any("no shared volume" in m for m in messages(logs))
    # stage_dataset's XCom travels in the ConfigMap; the pods train on it (--staged)
    config_map = cluster.objects[("configmaps", result["job"])]
    assert json.loads(config_map["data"]["staged.json"]) == STAGED
    assert pod["containers"][0]["command"][-2:] == ["--staged", "/etc/training/staged.json"]

    monkeypatch.setenv("TRAINING_K8S_SHARED_MOUNT", "/data")
    job = k8s.render(cfg, k8s.KubernetesOptions.from_env(os.environ))[2]
    assert {"name": "shared", "mountPath": "/data"} in (
        job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"])


def test_without_a_shared_volume_the_launch_warns(cluster, cfg, operator):
    _, logs, _ = launch(operator, cfg)
    assert any("no shared volume (TRAINING_K8S_SHARED_PVC)" in m for m in messages(logs))


def test_the_connection_comes_from_training_k8s_conn_id():
    from training_airflow.launchers import conn_id_from_env

    assert conn_id_from_env({"TRAINING_K8S_CONN_ID": "k8s_prod"}) == "k8s_prod"
    assert conn_id_from_env({"TRAINING_K8S_CONN_ID": ""}) == "kubernetes_default"
    assert conn_id_from_env({}) == "kubernetes_default"


def test_settings_are_checked_before_any_connection(cluster, cfg, operator, monkeypatch):
    monkeypatch.setenv("TRAINING_K8S_POLL_INTERVAL", "-1")
    monkeypatch.setenv("TRAINING_K8S_CONN_ID", "no_such_connection")

    _, _, error = launch(operator, cfg)

    from training.errors import ConfigError

    assert isinstance(error, ConfigError)
    assert str(error).startswith("TRAINING_K8S_POLL_INTERVAL: KubernetesOptions.poll_interval")
    assert cluster.requests == []
