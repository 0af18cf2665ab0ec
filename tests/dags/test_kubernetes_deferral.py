"""A deferred Kubernetes launch (``TRAINING_DEFERRABLE``, on by default): the task applies
the Job and defers to ``training_airflow.job_trigger.TrainingJobTrigger``, which follows
the Job in the triggerer and hands the task its outcome.

Only the Kubernetes API is faked (``support.fake_kubernetes``, as in
``test_kubernetes_launch_dag.py``); Airflow is real: ``dag.test()`` defers the task and
runs the trigger in line, as a triggerer would, and Airflow's own ``TriggerRunner`` cancels
a trigger the way a person marking the task failed does (``on_kill``), or the way a
triggerer that stops does (nothing deleted).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.fake_kubernetes import NAMESPACE, Plan, running_cluster, two_pod_config

from training.config import RunConfig
from training.launch import kubernetes as k8s

RUN_ID = "manual__2026-03-03T00-00-00"
STAGED = {"name": "digits", "version": "1.0.0", "path": "/data/datasets/digits/1.0.0",
          "staging_dir": "/data/datasets", "fingerprint": "0" * 64}


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.delenv("TRAINING_DEFERRABLE", raising=False)  # the default: on
    with running_cluster(monkeypatch) as fake:
        yield fake


@pytest.fixture
def cfg() -> RunConfig:
    return two_pod_config(RUN_ID)


class Recorded:
    """A trigger's log: each line, and whether the fake Job had ended when it was logged."""

    def __init__(self, cluster, name: str) -> None:
        self.cluster, self.name, self.lines = cluster, name, []

    def _add(self, level: str, message: str, *args) -> None:
        job = self.cluster.jobs.get(self.name)
        ended = job is not None and bool(job.body.get("status", {}).get("conditions"))
        self.lines.append((level, message % args, ended))

    def __getattr__(self, level: str):
        return lambda message, *args: self._add(level, message, *args)

    def workers(self, index: int, *, while_running: bool = False) -> list[str]:
        prefix = f"[worker {index}] "
        return [m[len(prefix):] for _, m, ended in self.lines
                if m.startswith(prefix) and not (while_running and ended)]


def applied(cluster, cfg):
    """The task's part before it defers: the objects applied; its operator and trigger."""
    from airflow.sdk.exceptions import TaskDeferred

    from training.deployment import Deployment
    from training_airflow.launchers import launch_kubernetes
    from training_airflow.tasks import TrainOperator

    operator = TrainOperator(task_id="train", staged=STAGED)
    operator.deployment, operator.deferrable = Deployment.from_env(), True
    with pytest.raises(TaskDeferred) as deferred:
        launch_kubernetes(operator, cfg, {})
    trigger = deferred.value.trigger
    trigger._log = Recorded(cluster, trigger.name)  # LoggingMixin keeps its logger there
    return operator, trigger, deferred.value


def first_event(trigger):
    async def run():
        return await anext(trigger.run())

    return asyncio.run(run()).payload


def test_the_task_defers_after_applying_and_the_trigger_streams_lines_while_it_trains(
        cluster, cfg):
    from airflow.sdk._shared.module_loading import import_string
    from airflow.sdk.serde import deserialize, serialize

    cluster.plans.append(Plan(polls=4, lines=6))
    operator, trigger, deferred = applied(cluster, cfg)
    name = k8s.job_name(cfg.run_id)

    # The task applied everything and read the Job no further: the wait is the trigger's.
    assert [kind for kind, _, _ in cluster.created()] == ["configmaps", "services", "jobs"]
    assert cluster.calls("GET", r"/status$") == [] and deferred.method_name == "resume"
    assert deferred.timeout.total_seconds() == 86_400 + 600  # the Job's deadline, and a margin
    # The triggerer rebuilds it from serialize(): an importable class path, its kwargs
    # through Airflow's serde (as the task runner sends them).
    path, kwargs = trigger.serialize()
    rebuilt = import_string(path)(**deserialize(serialize(kwargs)))
    assert rebuilt.serialize() == (path, kwargs)
    rebuilt._log = trigger._log

    event = first_event(rebuilt)

    assert event == {"kind": "job", "status": "succeeded", "job": name,
                     "tails": {pod: cluster.worker_lines(pod)[-20:]
                               for pod in cluster.jobs[name].pods}}
    log = trigger._log
    for index, pod in enumerate(cluster.jobs[name].pods):
        assert log.workers(index) == cluster.worker_lines(pod)  # each line once, in order
        assert len(log.workers(index, while_running=True)) >= 3  # not only at the end
    assert any(m == f"Job {NAMESPACE}/{name}: 2 active, 0 succeeded, 0 failed"
               for _, m, _ in log.lines)

    operator.event = event  # Airflow resumes the task with it (Step.resume)
    from training_airflow.launchers import launch_kubernetes

    assert launch_kubernetes(operator, cfg, {}) == {
        "run_id": RUN_ID, "run_dir": f"/data/training/runs/{RUN_ID}", "job": name,
        "namespace": NAMESPACE}
    assert len(cluster.calls("POST", r"/jobs$")) == 2  # the dry run and the Job: no other


def test_a_failed_pod_is_worded_when_the_task_resumes_as_without_deferral(cluster, cfg):
    from training.errors import LaunchError
    from training_airflow.launchers import launch_kubernetes

    cluster.plans.append(Plan(outcome="failed", failing=1, reason="OOMKilled", exit_code=137))
    operator, trigger, _ = applied(cluster, cfg)
    operator.event = first_event(trigger)
    name = k8s.job_name(cfg.run_id)

    with pytest.raises(LaunchError) as failed:
        launch_kubernetes(operator, cfg, {})

    failed_pod, other_pod = cluster.jobs[name].pods[1], cluster.jobs[name].pods[0]
    text = str(failed.value)
    assert text.startswith(f"Kubernetes Job {NAMESPACE}/{name} failed (BackoffLimitExceeded")
    assert text.splitlines()[1].startswith(
        f"pod {failed_pod} (worker 1) failed: OOMKilled, exit code 137; last log lines:")
    assert "Traceback (most recent call last):\n    ValueError: boom" in text
    assert text.index(failed_pod) < text.index(other_pod)
    assert trigger._log.workers(1)[-1] == "ValueError: boom"  # also in the task log


def test_a_retry_finds_the_running_job_by_name_and_defers_to_it_again(cluster, cfg):
    cluster.plans.append(Plan(outcome="never"))
    applied(cluster, cfg)  # the first try deferred; then its worker or triggerer was lost
    name = k8s.job_name(cfg.run_id)
    uid = cluster.jobs[name].uid

    _, trigger, _ = applied(cluster, cfg)  # the retry

    assert trigger.name == name and cluster.jobs[name].uid == uid  # the same Job
    assert [m for m, p in cluster.changes() if p.endswith("/jobs")] == ["POST", "POST"]
    assert cluster.calls("DELETE", r"/jobs/") == []
    assert len(cluster.calls("GET", rf"/jobs/{name}/status$")) == 1  # read, found running


def run_until_cancelled(cluster, trigger, message: str | None) -> list:
    """The trigger in Airflow's own ``TriggerRunner``, cancelled after three looks at the
    Job, as the triggerer cancels it (``message``: a person's action, or none)."""
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    runner = TriggerRunner()
    runner.triggers[1] = {"name": "train", "events": 0}

    async def main() -> None:
        task = asyncio.create_task(runner.run_trigger(1, trigger))
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while len(cluster.calls("GET", r"/status$")) < 3:
            assert time.monotonic() < deadline and not task.done(), "the Job was never followed"
            await asyncio.sleep(0.01)
        task.cancel(message)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return list(runner.events)


def test_marking_the_deferred_task_failed_deletes_the_job(cluster, cfg, monkeypatch):
    from airflow.jobs.triggerer_job_runner import _USER_ACTION_CANCEL_MSG

    monkeypatch.setenv("AIRFLOW_DISABLE_GREENBACK_PORTAL", "true")
    cluster.plans.append(Plan(outcome="never"))
    _, trigger, _ = applied(cluster, cfg)
    name = trigger.name

    events = run_until_cancelled(cluster, trigger, _USER_ACTION_CANCEL_MSG)

    assert events == []
    (delete,) = cluster.calls("DELETE", rf"/jobs/{name}$")
    assert delete[3]["propagationPolicy"] == "Background"
    assert ("warning", f"deleted Job {NAMESPACE}/{name}; Kubernetes stops its pods",
            False) in trigger._log.lines


def test_a_triggerer_that_stops_leaves_the_job_to_the_next_one(cluster, cfg, monkeypatch):
    monkeypatch.setenv("AIRFLOW_DISABLE_GREENBACK_PORTAL", "true")
    cluster.plans.append(Plan(polls=8))
    _, trigger, _ = applied(cluster, cfg)

    run_until_cancelled(cluster, trigger, None)  # shutdown, or handed to another triggerer

    assert cluster.calls("DELETE", r"/jobs/") == []
    assert ("jobs", trigger.name) in cluster.objects
    path, kwargs = trigger.serialize()  # what the next triggerer rebuilds it from
    from airflow.sdk._shared.module_loading import import_string

    assert first_event(import_string(path)(**kwargs))["status"] == "succeeded"
    assert len(cluster.calls("POST", r"/jobs$")) == 2  # the dry run and the one Job


def test_the_execution_timeout_deletes_the_job_and_times_the_task_out(cluster, cfg):
    from airflow.sdk.exceptions import AirflowTaskTimeout

    from training_airflow.launchers import launch_kubernetes

    cluster.plans.append(Plan(outcome="never"))
    operator, trigger, _ = applied(cluster, cfg)
    trigger.stop_at = time.time() + 0.2  # what execution_timeout sets (launchers._defer)

    operator.event = first_event(trigger)

    assert operator.event["status"] == "timed_out"
    assert len(cluster.calls("DELETE", rf"/jobs/{trigger.name}$")) == 1
    with pytest.raises(AirflowTaskTimeout, match="execution_timeout passed"):
        launch_kubernetes(operator, cfg, {})


def test_a_job_waiting_in_kueue_waits_in_the_trigger(cluster, cfg, monkeypatch):
    monkeypatch.setenv("TRAINING_K8S_KUEUE_QUEUE", "team-a")
    cluster.plans.append(Plan(queued=4))
    _, trigger, deferred = applied(cluster, cfg)

    event = first_event(trigger)

    assert deferred.timeout is None  # the deadline does not run while Kueue holds the Job
    assert event["status"] == "succeeded"
    text = [m for _, m, _ in trigger._log.lines]
    queued = [i for i, m in enumerate(text) if "is queued in Kueue LocalQueue 'team-a'" in m]
    admitted = [i for i, m in enumerate(text) if " was admitted after " in m]
    assert len(queued) == 1 and len(admitted) == 1
    assert queued[0] < admitted[0] < min(i for i, m in enumerate(text)
                                         if m.startswith("[worker "))


def test_a_word_that_is_no_boolean_fails_the_task_without_retries_naming_it(cluster,
                                                                           monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from training_airflow.tasks import TrainOperator

    monkeypatch.setenv("TRAINING_DEFERRABLE", "sometimes")
    operator = TrainOperator(task_id="train", staged=STAGED)

    with pytest.raises(AirflowFailException) as failed:
        operator.execute({"params": {"launcher": "kubernetes"}, "run_id": RUN_ID})

    assert str(failed.value).startswith("TRAINING_DEFERRABLE must be a boolean (")
    assert str(failed.value).endswith("got 'sometimes'")
    assert cluster.requests == []  # before anything was applied


# --- a DAG run: Airflow defers the task, runs the trigger, resumes the task -----------
def one_task_dag(dag_id: str):
    """A DAG of ``train`` alone, written to the metadata database as the dag processor
    writes a parsed file's DAGs (``dag.test()`` runs only serialized DAGs)."""
    from types import SimpleNamespace

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import sync_bag_to_db
    from airflow.sdk import DAG

    from training_airflow.tasks import TrainOperator

    with DAG(dag_id, schedule=None, params={"launcher": "kubernetes", "workers": 2,
                                            "epochs": 2}) as dag:
        TrainOperator(task_id="train", staged=STAGED, validated={}, retries=0)
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(SimpleNamespace(dags={dag_id: dag}, import_errors={}, bundle_path=None,
                                   dag_warnings=set()), "dags-folder", None)
    return dag


@pytest.mark.slow  # dag.test(): about 40 s each on 2 cores, most of it Airflow's start
@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_a_dag_run_defers_train_and_resumes_it_on_the_jobs_outcome(cluster, airflow_db,
                                                                    outcome):
    from pathlib import Path

    from structlog.testing import capture_logs

    from training.deployment import Deployment
    from training_airflow import records
    from training_airflow.params import run_id_for

    cluster.plans.append(Plan(outcome=outcome, polls=4, failing=0, reason="OOMKilled",
                              exit_code=137))
    dag = one_task_dag(f"k8s_deferral_{outcome}")

    with capture_logs() as logs:
        run = dag.test()

    (ti,) = run.get_task_instances()
    name = k8s.job_name(run_id_for(run.run_id))
    text = [entry["event"] for entry in logs]

    def at(line: str) -> int:
        return next(i for i, m in enumerate(text) if m.startswith(line))

    # Applied in the task, deferred, followed in the trigger while it trained, resumed.
    assert (at(f"created Job {NAMESPACE}/{name}") < at("deferred: the wait goes on")
            < at("Pausing task as DEFERRED") < at(f"following Job {NAMESPACE}/{name} in "
                                                  "the triggerer")
            < at("[worker 0] ") < at(f"Job {NAMESPACE}/{name}: 2 active")
            < at(f"Job {NAMESPACE}/{name}: 0 active"))
    running = range(at(f"Job {NAMESPACE}/{name}: 2 active"),
                    at(f"Job {NAMESPACE}/{name}: 0 active"))
    assert sum(text[i].startswith("[worker ") for i in running) >= 4  # while it trained
    for index, pod in enumerate(cluster.jobs[name].pods):
        prefix = f"[worker {index}] "
        assert [m[len(prefix):] for m in text if m.startswith(prefix)] == (
            cluster.worker_lines(pod))
    assert len(cluster.calls("POST", r"/jobs$")) == 2  # the dry run and the Job, once
    record = records.read_run(Path(Deployment.from_env().output_dir)
                              / run_id_for(run.run_id))["train"]
    if outcome == "succeeded":
        assert run.state == ti.state == "success"
        assert record["state"] == "success" and record["value"]["job"] == name
        return
    assert run.state == ti.state == "failed"
    failed_pod = cluster.jobs[name].pods[0]
    assert record["state"] == "failed"
    assert record["value"].startswith(f"LaunchError: Kubernetes Job {NAMESPACE}/{name} failed "
                                      "(BackoffLimitExceeded")
    assert (f"pod {failed_pod} (worker 0) failed: OOMKilled, exit code 137; last log lines:"
            in record["value"])
    assert ("    Traceback (most recent call last):\n    ValueError: boom\n"
            f"pod {cluster.jobs[name].pods[1]} (worker 1) failed") in record["value"]
