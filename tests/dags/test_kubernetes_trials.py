"""A sweep's trials under ``launcher=kubernetes``: each trial task runs a Job of its own.

``TrialOperator`` (``training_airflow.sweep_tasks``) hands each trial's config to
``LAUNCHERS["kubernetes"]`` against ``FakeKubernetes`` (no API server runs here; see
``test_kubernetes_launch_dag.py`` for what the fake cannot prove), with the study, the
trial configs and ``training.steps.sweep``'s plan, ask, tell and pick for real. The
fake's Job plays its pods' part by writing what a trial's training leaves on the shared
volume, its ``history.json``: an objective that depends on the learning rate the Job's
ConfigMap carries, so the pick can only be right if each Job trained its own trial.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fake_kubernetes import NAMESPACE, Plan, running_cluster

from training import layout
from training.config import RunConfig, frozen
from training.launch import kubernetes as k8s

RUN_ID = "manual__2026-03-02T00-00-00"
RATES = [0.003, 0.01]
STAGED = {"name": "digits", "version": "1.0.0", "path": "/data/datasets/digits/1.0.0",
          "staging_dir": "/data/datasets", "fingerprint": "1" * 64}


def val_loss(rate: float) -> list[float]:
    """What the fake pods 'train' to: the larger rate ends lower."""
    return [1.0, 0.5, 0.2 - rate]


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    monkeypatch.delenv("TRAINING_SWEEP_STORAGE", raising=False)
    with running_cluster(monkeypatch) as fake:
        def train(job: dict) -> None:  # the pods' work: the trial's history, written
            config = json.loads(fake.objects[("configmaps", job["metadata"]["name"])]
                                ["data"]["config.json"])
            run_dir = Path(config["storage"]["output_dir"]) / config["storage"]["run_id"]
            history = layout.model_dir(run_dir) / layout.HISTORY
            history.parent.mkdir(parents=True)
            history.write_text(json.dumps(
                {"metrics": {"val_loss": val_loss(config["fit"]["learning_rate"])}}))

        fake.on_start = train
        yield fake


def test_each_trial_is_a_job_of_its_own_and_the_pick_takes_the_best(cluster, tmp_path):
    from training.data.snapshot.staging import StagedDataset
    from training.deployment import Deployment
    from training.steps import sweep
    from training_airflow.sweep_tasks import LABEL, TrialOperator

    cfg = RunConfig.from_flat({
        "launcher": "kubernetes", "epochs": 3, "run_id": RUN_ID,
        "output_dir": str(tmp_path / "runs"), "staging_dir": "/data/training/datasets",
        "sweep_trials": len(RATES), "sweep_parallel": len(RATES), "sweep_sampler": "grid",
        "sweep_pruner": "none", "sweep_space": {"fit.learning_rate": {"choices": RATES}}})
    staged = StagedDataset.from_dict(STAGED)
    assert sweep.plan(cfg, staged) == [0, 1]
    cluster.plans = [Plan(polls=1), Plan(polls=1)]
    ended = {}
    for slot in (0, 1):
        operator = TrialOperator(task_id="trial", staged=STAGED, slot=slot)
        operator.deployment, operator.frozen = Deployment.from_env(), frozen.freeze(cfg)
        context: dict = {}
        ended[slot] = operator.work(cfg, context)
        assert context[LABEL] == ended[slot]["label"]  # the grid's name for the instance

    jobs = [body for kind, namespace, body in cluster.created() if kind == "jobs"]
    trial_runs = [f"{RUN_ID}-t{slot}" for slot in (0, 1)]
    assert [job["metadata"]["name"] for job in jobs] == [k8s.job_name(r) for r in trial_runs]
    assert {namespace for _, namespace, _ in cluster.created()} == {NAMESPACE}
    for slot, run_id in enumerate(trial_runs):
        config = json.loads(cluster.objects[("configmaps", k8s.job_name(run_id))]
                            ["data"]["config.json"])
        assert config["storage"]["run_id"] == run_id
        rate = ended[slot]["params"]["fit.learning_rate"]
        assert config["fit"]["learning_rate"] == rate  # the Job trains its own trial's values
        assert config.get("sweep", {}).get("trials", 0) == 0  # a trial is no sweep itself
        assert ended[slot]["state"] == "complete"
        assert ended[slot]["value"] == pytest.approx(min(val_loss(rate)))
    assert sorted(e["params"]["fit.learning_rate"] for e in ended.values()) == RATES

    best = max(RATES)  # the lower val_loss
    chosen = sweep.pick(cfg, staged)
    assert chosen.fit.learning_rate == best
    assert chosen.run_id in trial_runs


def test_deferred_trials_hold_no_lane_they_do_not_train_on(cluster, tmp_path, monkeypatch):
    """``TRAINING_DEFERRABLE``: a trial defers while its Job trains (its lane kept), and a
    trial that finds every lane taken defers to a ``LaneTrigger`` that fires only once the
    lane is free; each resumes where a task that never deferred would be."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    from training.data.snapshot.staging import StagedDataset
    from training.deployment import Deployment
    from training.steps import sweep
    from training.sweep import slots
    from training_airflow import sweep_tasks
    from training_airflow.job_trigger import TrainingJobTrigger
    from training_airflow.lane_trigger import LaneTrigger
    from training_airflow.sweep_tasks import TrialOperator

    monkeypatch.setattr(sweep_tasks, "LANE_POLL_S", 0.02)
    cfg = RunConfig.from_flat({
        "launcher": "kubernetes", "epochs": 3, "run_id": RUN_ID,
        "output_dir": str(tmp_path / "runs"), "staging_dir": "/data/training/datasets",
        "sweep_trials": 2, "sweep_parallel": 1, "sweep_sampler": "grid",
        "sweep_pruner": "none", "sweep_space": {"fit.learning_rate": {"choices": RATES}}})
    staged = StagedDataset.from_dict(STAGED)
    sweep.plan(cfg, staged)
    cluster.plans = [Plan(polls=2), Plan(polls=2)]
    operators = {}
    for slot in (0, 1):
        operators[slot] = TrialOperator(task_id="trial", staged=STAGED, slot=slot)
        operators[slot].deployment, operators[slot].frozen = (Deployment.from_env(),
                                                              frozen.freeze(cfg))
        operators[slot].deferrable = True

    def deferred(slot: int):
        with pytest.raises(TaskDeferred) as handed:
            operators[slot].work(cfg, {})
        return handed.value.trigger

    def training_now() -> list[int]:
        study = sweep.open_sweep(cfg, staged).study
        return [t.user_attrs["slot"] for t in slots.training(study, RUN_ID)]

    async def first(trigger, within: float | None = None):
        return (await asyncio.wait_for(anext(trigger.run()), within)).payload

    job_0 = deferred(0)
    assert isinstance(job_0, TrainingJobTrigger) and training_now() == [0]  # lane kept
    lane_1 = deferred(1)
    assert isinstance(lane_1, LaneTrigger) and lane_1.lanes == 1
    assert len(cluster.created()) == 3  # slot 1 created nothing while it waits
    with pytest.raises(TimeoutError):  # slot 0 trains: no lane for slot 1
        asyncio.run(first(lane_1, within=0.3))

    operators[0].event = asyncio.run(first(job_0))  # slot 0's Job succeeds; it resumes
    ended_0 = operators[0].work(cfg, {})
    assert ended_0["state"] == "complete" and training_now() == []

    operators[1].event = asyncio.run(first(lane_1, within=30))  # now the lane is free
    job_1 = deferred(1)  # it claims the lane and defers again, on its own Job
    assert isinstance(job_1, TrainingJobTrigger) and training_now() == [1]
    operators[1].event = asyncio.run(first(job_1))
    ended_1 = operators[1].work(cfg, {})

    assert ended_1["state"] == "complete"
    assert {ended_0["params"]["fit.learning_rate"], ended_1["params"]["fit.learning_rate"]} == (
        set(RATES))
    jobs = [body["metadata"]["name"] for kind, _, body in cluster.created() if kind == "jobs"]
    assert jobs == [k8s.job_name(f"{RUN_ID}-t{slot}") for slot in (0, 1)]  # one Job each
    study = sweep.open_sweep(cfg, staged).study
    first_trial, second = sorted(slots.tonight(study, RUN_ID), key=lambda t: t.datetime_start)
    assert first_trial.datetime_complete <= second.datetime_start  # never two at once
    assert sweep.pick(cfg, staged).fit.learning_rate == max(RATES)


def test_a_person_stopping_a_deferred_trial_deletes_its_job_and_frees_its_lane(
        cluster, tmp_path):
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    from training.data.snapshot.staging import StagedDataset
    from training.deployment import Deployment
    from training.steps import sweep
    from training.sweep import slots
    from training_airflow.sweep_tasks import TrialOperator

    cfg = RunConfig.from_flat({
        "launcher": "kubernetes", "epochs": 3, "run_id": RUN_ID,
        "output_dir": str(tmp_path / "runs"), "staging_dir": "/data/training/datasets",
        "sweep_trials": 1, "sweep_parallel": 1, "sweep_pruner": "none",
        "sweep_space": {"fit.learning_rate": {"choices": RATES}}})
    staged = StagedDataset.from_dict(STAGED)
    sweep.plan(cfg, staged)
    cluster.plans = [Plan(outcome="never")]
    operator = TrialOperator(task_id="trial", staged=STAGED, slot=0)
    operator.deployment, operator.frozen = Deployment.from_env(), frozen.freeze(cfg)
    operator.deferrable = True
    with pytest.raises(TaskDeferred) as handed:
        operator.work(cfg, {})

    def training_now() -> int:
        return len(slots.training(sweep.open_sweep(cfg, staged).study, RUN_ID))

    assert training_now() == 1
    asyncio.run(handed.value.trigger.on_kill())  # what the triggerer calls (Airflow's own
    # cancellation path: test_kubernetes_deferral.py)

    name = k8s.job_name(f"{RUN_ID}-t0")
    assert len(cluster.calls("DELETE", rf"/jobs/{name}$")) == 1
    assert training_now() == 0  # the lane is free; the trial is left for a retry to resume
    (trial,) = slots.tonight(sweep.open_sweep(cfg, staged).study, RUN_ID)
    assert trial.user_attrs["error"] == f"stopped while deferred: Job {NAMESPACE}/{name} deleted"
