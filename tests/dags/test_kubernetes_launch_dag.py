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

import pytest
from support.fake_kubernetes import (
    AWS_SECRET,
    NAMESPACE,
    TOKEN,
    Plan,
    running_cluster,
    two_pod_config,
)

from training.config import RunConfig
from training.launch import kubernetes as k8s

RUN_ID = "manual__2026-03-01T00-00-00"
# What stage_dataset hands over through XCom; the pods train on it.
STAGED = {"name": "digits", "version": "1.0.0", "path": "/data/datasets/digits/1.0.0",
          "staging_dir": "/data/datasets", "fingerprint": "0" * 64}


@pytest.fixture
def cluster(monkeypatch):
    with running_cluster(monkeypatch) as fake:
        yield fake


@pytest.fixture
def cfg() -> RunConfig:
    return two_pod_config(RUN_ID)


@pytest.fixture
def operator():
    from training_airflow.tasks import TrainOperator

    return TrainOperator(task_id="train", staged=STAGED)


def launch(operator, cfg):
    from structlog.testing import capture_logs

    from training.deployment import Deployment
    from training_airflow.launchers import LAUNCHERS

    operator.deployment = Deployment.from_env()  # as the task does when it starts
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
    monkeypatch.setenv("TRAINING_DEFERRABLE", "false")  # followed in the task (deferred:
    cluster.plans.append(Plan(outcome="never"))  # test_kubernetes_deferral.py)
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


def test_execute_returns_the_launch_dict(cluster, monkeypatch):
    from training_airflow.params import config_for_run
    from training_airflow.tasks import TrainOperator

    monkeypatch.setenv("TRAINING_DEFERRABLE", "false")

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
    from training.deployment import Deployment

    def conn_id(env):
        return Deployment.from_env(env).kubernetes_conn_id

    assert conn_id({"TRAINING_K8S_CONN_ID": "k8s_prod"}) == "k8s_prod"
    assert conn_id({"TRAINING_K8S_CONN_ID": ""}) == "kubernetes_default"
    assert conn_id({}) == "kubernetes_default"


def test_settings_are_checked_before_any_connection(cluster, cfg, operator, monkeypatch):
    monkeypatch.setenv("TRAINING_K8S_POLL_INTERVAL", "-1")
    monkeypatch.setenv("TRAINING_K8S_CONN_ID", "no_such_connection")

    _, _, error = launch(operator, cfg)

    from training.errors import ConfigError

    assert isinstance(error, ConfigError)
    assert str(error).startswith("TRAINING_K8S_POLL_INTERVAL: KubernetesOptions.poll_interval")
    assert cluster.requests == []


# --- a Job waiting in a Kueue queue ---------------------------------------------------
def test_a_queued_job_is_logged_as_queued_then_followed_once_admitted(cluster, cfg, operator,
                                                                      monkeypatch):
    monkeypatch.setenv("TRAINING_K8S_KUEUE_QUEUE", "team-a")
    monkeypatch.setenv("TRAINING_K8S_SHARED_PVC", "training-data")
    cluster.plans.append(Plan(queued=6))

    result, logs, error = launch(operator, cfg)

    assert error is None
    name = k8s.job_name(cfg.run_id)
    expected = k8s.render(cfg, k8s.KubernetesOptions.from_env(os.environ), STAGED)[2]
    assert expected["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert expected["spec"]["suspend"] is True
    assert cluster.created(dry_run=True)[-1][2] == cluster.created()[-1][2] == expected
    assert cluster.jobs[name].queued_reads == 6  # it stayed suspended for six looks
    text = messages(logs)
    queued = [i for i, m in enumerate(text) if "is queued in Kueue LocalQueue 'team-a'" in m]
    admitted = [i for i, m in enumerate(text) if f"Job {NAMESPACE}/{name} was admitted" in m]
    first_worker_line = min(i for i, m in enumerate(text) if m.startswith("[worker "))
    assert len(queued) == 1 and len(admitted) == 1  # well under a minute in the queue
    assert queued[0] < admitted[0] < first_worker_line
    assert "its 2 pod(s) start together" in text[queued[0]]
    # then followed as any Job: every line of every worker, and success
    for index, pod in enumerate(cluster.jobs[name].pods):
        assert worker_messages(logs, index) == cluster.worker_lines(pod)
    assert result["job"] == name and any(m.endswith("succeeded") for m in text)
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []
    assert cluster.calls("DELETE", r"/jobs/") == []


class RecordedLog:
    """The ``log`` a ``TrainingJob`` writes to, as (level, message) pairs."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def _add(self, level: str, message: str, *args) -> None:
        self.lines.append((level, message % args))

    def debug(self, *args) -> None:
        self._add("debug", *args)

    def info(self, *args) -> None:
        self._add("info", *args)

    def warning(self, *args) -> None:
        self._add("warning", *args)

    def error(self, *args) -> None:
        self._add("error", *args)


def test_a_long_wait_in_the_queue_is_logged_every_minute_and_never_fails(cluster, cfg):
    from kubernetes import client

    from training.launch.kubernetes.kueue import QUEUED_LOG_EVERY

    api = client.ApiClient(client.Configuration(host=cluster.url))
    now = [0.0]

    def sleep(seconds: float) -> None:  # 25 s between looks, on a clock of the test's
        assert seconds == 25
        now[0] += seconds

    cluster.plans.append(Plan(queued=10))  # admitted on the tenth look, after 250 s
    options = k8s.KubernetesOptions(namespace=NAMESPACE, kueue_queue="team-a",
                                    shared_volume_claim="training-data", poll_interval=25)
    log = RecordedLog()
    job = k8s.TrainingJob(cfg, options, log, sleep=sleep, clock=lambda: now[0])

    result = job.run(client.CoreV1Api(api), client.BatchV1Api(api))

    assert result["job"] == job.name and now[0] > 250
    queued = [m for _, m in log.lines if re.search(r" is (still )?queued in Kueue", m)]
    assert QUEUED_LOG_EVERY == 60
    assert queued == [  # at 0 s, then at the first look a minute or more after the last
        f"Job {NAMESPACE}/{job.name} is queued in Kueue LocalQueue 'team-a': suspended "
        "until it is admitted, then its 2 pod(s) start together",
        *(f"Job {NAMESPACE}/{job.name} is still queued in Kueue LocalQueue 'team-a', for "
          f"{after}" for after in ("1 min 15 s", "2 min 30 s", "3 min 45 s")),
    ]
    assert (f"Job {NAMESPACE}/{job.name} was admitted after 4 min 10 s queued in Kueue "
            "LocalQueue 'team-a'; following it") in [m for _, m in log.lines]
    assert [m for level, m in log.lines if level in ("warning", "error")] == []
    assert worker_messages_of(log, 1) == cluster.worker_lines(cluster.jobs[job.name].pods[1])


def worker_messages_of(log: RecordedLog, index: int) -> list[str]:
    prefix = f"[worker {index}] "
    return [m[len(prefix):] for _, m in log.lines if m.startswith(prefix)]


@pytest.mark.parametrize(("uri", "handed"), [
    ("http://mlflow.mlops.svc:5000", "http://mlflow.mlops.svc:5000"),  # a server: handed on
    ("sqlite:////data/mlflow/mlflow.db", None),  # the worker's own disk: no pod sees it
])
def test_the_pods_track_to_the_deployments_mlflow_server(cluster, cfg, operator, monkeypatch,
                                                         uri, handed):
    """The chief pod logs each epoch as the local launcher's child does: the Job's pods
    get the deployment's tracking URI when it is a server, and the MLflow login from the
    credentials Secret (optional keys), never a value."""
    monkeypatch.setenv("TRAINING_MLFLOW_TRACKING_URI", uri)
    _, _, error = launch(operator, cfg)
    assert error is None
    [job] = [body for kind, _, body in cluster.created() if kind == "jobs"]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env.get("TRAINING_MLFLOW_TRACKING_URI", {}).get("value") == handed
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert env[key]["valueFrom"]["secretKeyRef"] == {
            "name": "training-s3", "key": key, "optional": True}
