"""The Kubernetes Job's pods, as rendered, trained for real in the project's image.

Why it exists: the unit tests check the rendered objects against the API schemas and the
launch runs against a fake API, but nothing else runs what a pod runs. Here
``tests/support/pods.py`` plays the cluster for ``render(cfg, options, staged)``'s
ConfigMap, headless Service and Indexed Job: each pod is a container of the built
training image with the pod's command, env and mounts, named and resolvable as the
Service names it. Two such pods train the offline ``digits`` dataset, staged on the
shared volume, under MultiWorkerMirroredStrategy with the ``TF_CONFIG`` the ``exec``
wrapper derives from ``JOB_COMPLETION_INDEX``: they end with the same weights, the ones
the chief saved, and the chief alone logs each epoch to an MLflow server beside them on
their network (``support/pods_mlflow.py``), as the launch hands it to them. A pod
killed mid-run fails the Job, naming it; the retried Job (same run id, so the same
names) resumes from the backup on the shared volume.

No assertion is about time: exit codes, what the pods printed and what is on the shared
volume say what happened.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.output import tail
from support.pods import JobPods, JobResult
from support.pods_mlflow import URL, mlflow_beside

from training.config import DatasetConfig, RunConfig
from training.launch.kubernetes import KubernetesOptions, job_name, render
from training.launch.kubernetes.options import with_tracking
from training.launch.worker import DIGEST_MARK

CLAIM = "training-shared"
DIGEST = re.compile(re.escape(DIGEST_MARK) + r"([0-9a-f]{64})")
EPOCH = re.compile(r"^Epoch (\d+)/\d+$", re.MULTILINE)
# What TensorFlow logs when it builds the strategy from the TF_CONFIG it was given.
CLUSTER = re.compile(r"MultiWorkerMirroredStrategy with cluster_spec = (\{.*?\}), "
                     r"task_type = 'worker', task_id = (\d+)")



@dataclass
class Shared:
    """The shared volume's host directory, the staged dataset on it and the run's objects."""

    root: Path
    cfg: RunConfig
    objects: list[dict]

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir()


def _shared(tmp_path: Path, image: str, run_id: str, tracking_uri: str = "",
            **settings) -> Shared:
    """digits staged on the host into the directory the pods mount as the shared claim."""
    from training.data.snapshot import staging

    root = tmp_path / "shared"
    staged = staging.stage(DatasetConfig(staging_dir=os.fspath(root / "datasets")))
    cfg = RunConfig.from_flat({
        "run_id": run_id, "staging_dir": staged.staging_dir,
        "output_dir": os.fspath(root / "runs"), "workers": 2, "strategy": "multi_worker",
        "epochs": 3, "batch_size": 32, "backup_interval_s": 0, **settings,
    })
    (root / "runs").mkdir()
    for path in [root, *root.rglob("*")]:  # the image's user (uid 50000) writes here
        path.chmod(0o777 if path.is_dir() else 0o666)
    options = with_tracking(KubernetesOptions(image=image, image_pull_policy="Never",
                                              shared_volume_claim=CLAIM), tracking_uri)
    return Shared(root, cfg, render(cfg, options, staged.to_dict()))


def _story(result: JobResult) -> str:
    return "\n".join([result.reason, *(f"--- {p.name} (exit {p.exit_code}) ---\n"
                                       f"{tail(p.log)}" for p in result.pods)])


def _digests(result: JobResult) -> list[str]:
    return [m[1] for p in result.pods for m in [DIGEST.search(p.log)] if m]


def _model_digest(run_dir: Path) -> str:
    import keras

    from training.train.callbacks.weights_report import weights_digest

    model = keras.saving.load_model(run_dir / "model" / "model.keras", safe_mode=True)
    return weights_digest(model)


@pytest.mark.slow
def test_two_pods_train_in_lockstep_on_the_shared_volume(tmp_path, images):
    # The deployment's MLflow server, as the pods reach it on their network: the launch
    # hands it to them (``with_tracking``), and the chief alone logs the epochs.
    shared = _shared(tmp_path, images.training, "pods-lockstep", tracking_uri=URL)
    job = job_name(shared.cfg.run_id)
    with JobPods(images, shared.objects, claims={CLAIM: shared.root},
                 workdir=tmp_path) as pods, \
            mlflow_beside(pods, images.airflow, tmp_path) as server:
        # Nothing hands the pods a TF_CONFIG: each derives its own in the exec wrapper.
        assert all("TF_CONFIG" not in dict(p.env) for p in pods.pods)
        assert all(dict(p.env)["TRAINING_MLFLOW_TRACKING_URI"] == URL for p in pods.pods)
        assert [p.dns_name for p in pods.pods] == [
            f"{job}-{i}.{job}.default.svc" for i in range(2)]
        result = pods.run()
        subnet = ipaddress.ip_network(pods.subnet)
        server.stop()
    assert result.succeeded, _story(result)
    assert result.exit_codes == {f"{job}-0": 0, f"{job}-1": 0}
    # Each pod's TF_CONFIG, as its wrapper derived it: the Service's two DNS names, and
    # its own completion index as its task.
    hosts = [f"{job}-{i}.{job}.default.svc:2222" for i in range(2)]
    for pod in result.pods:
        found = CLUSTER.search(pod.log)
        assert found, _story(result)
        assert ast.literal_eval(found[1]) == {"worker": hosts}
        assert int(found[2]) == pod.index
    # Two hosts, two addresses on the Job's network.
    addresses = [p.address for p in result.pods]
    assert len(set(addresses)) == 2 and all(ipaddress.ip_address(a) in subnet
                                            for a in addresses), addresses

    # Both pods ended with the same weights (all-reduced), and the chief saved them.
    digests = _digests(result)
    assert len(digests) == 2 and digests[0] == digests[1], _story(result)
    assert _model_digest(shared.run_dir) == digests[0]
    run = json.loads((shared.run_dir / "model" / "run.json").read_text())
    assert run["strategy"]["kind"] == "multi_worker"
    assert run["strategy"]["replicas_in_sync"] == 2  # one CPU per pod: the two pods
    assert run["strategy"]["global_batch_size"] == 64
    losses = json.loads((shared.run_dir / "model" / "history.json").read_text()
                        )["metrics"]["loss"]
    assert len(losses) == 3 and losses[-1] < losses[0]  # it learned
    for pod in result.pods:
        assert [int(e) for e in EPOCH.findall(pod.log)] == [1, 2, 3], _story(result)
    # Only the chief wrote to the shared volume: one run directory, its own.
    assert [p.name for p in (shared.root / "runs").iterdir()] == [shared.run_dir.name]

    # The chief pod logged each epoch to the server, once: one run, tagged with the run
    # id, the epochs' losses as history.json has them (a second worker logging would
    # have doubled each step).
    import mlflow

    client = mlflow.MlflowClient(server.uri)
    experiment = client.get_experiment_by_name(shared.cfg.model_name)
    assert experiment is not None, _story(result)
    [mlflow_run] = client.search_runs([experiment.experiment_id])
    assert mlflow_run.data.tags["pipeline.run_id"] == shared.cfg.run_id
    logged = client.get_metric_history(mlflow_run.info.run_id, "loss")
    assert [m.step for m in logged] == [0, 1, 2], logged
    assert [m.value for m in logged] == pytest.approx(losses, rel=1e-6)
    assert mlflow_run.data.params["fit.epochs"] == "3"


@pytest.mark.slow
def test_a_killed_pod_fails_the_job_and_the_retried_job_resumes(tmp_path, images):
    shared = _shared(tmp_path, images.training, "pods-resume")
    job = job_name(shared.cfg.run_id)
    metadata = shared.run_dir / "backup" / "training_metadata.json"
    with JobPods(images, shared.objects, claims={CLAIM: shared.root},
                 workdir=tmp_path) as pods:
        killed: list[int] = []

        def on_line(index: int, line: str) -> None:
            # The chief prints an epoch's summary after BackupAndRestore saved that epoch.
            if index == 0 and " - loss: " in line and not killed:
                pods.kill(1)
                killed.append(1)

        failed = pods.run(on_line=on_line)
        assert killed, _story(failed)
        assert not failed.succeeded and failed.failed_pod == f"{job}-1", _story(failed)
        assert failed.reason.startswith(f"pod {job}-1 (worker 1) failed: exit code 137")
        assert failed.exit_codes[f"{job}-1"] == 137
        assert failed.exit_codes[f"{job}-0"] != 0  # stopped, or its collective aborted
        assert not (shared.run_dir / "model" / "model.keras").exists()
        assert metadata.exists(), _story(failed)
        saved_epoch = json.loads(metadata.read_text())["epoch"]
        assert 1 <= saved_epoch < shared.cfg.fit.epochs

        # The retried Job: same run id, same names, the old pods replaced.
        result = pods.run()
    assert result.succeeded, _story(result)
    resumed = list(range(saved_epoch + 1, shared.cfg.fit.epochs + 1))
    for pod in result.pods:  # both resumed from the chief's backup, in step
        assert [int(e) for e in EPOCH.findall(pod.log)] == resumed, _story(result)
    digests = _digests(result)
    assert len(digests) == 2 and digests[0] == digests[1], _story(result)
    assert _model_digest(shared.run_dir) == digests[0]
    assert not (shared.run_dir / "backup").exists()


@pytest.mark.slow
def test_two_pods_train_on_jax_and_the_chiefs_model_is_published(tmp_path, images):
    """The same Job under ``backend: jax``: the pods join through ``jax.distributed``
    (pod 0's Service name, from the same TF_CONFIG, is the coordinator), train the same
    weights, and the chief's model, with the SavedModel its TensorFlow child made, is
    published to a store as any version is."""
    from training.data.snapshot import staging
    from training.registry.versions import open_registry
    from training.steps import evaluate, publish

    shared = _shared(tmp_path, images.training, "pods-jax", backend="jax")
    job = job_name(shared.cfg.run_id)
    with JobPods(images, shared.objects, claims={CLAIM: shared.root},
                 workdir=tmp_path) as pods:
        assert all(dict(p.env)["KERAS_BACKEND"] == "jax" for p in pods.pods)
        result = pods.run()
    assert result.succeeded, _story(result)
    for pod in result.pods:
        assert f"Connecting to JAX distributed service on {job}-0.{job}.default.svc:2222" \
            in pod.log, _story(result)
    digests = _digests(result)
    assert len(digests) == 2 and digests[0] == digests[1], _story(result)
    assert _model_digest(shared.run_dir) == digests[0]
    run = json.loads((shared.run_dir / "model" / "run.json").read_text())
    assert run["strategy"]["backend"] == "jax" and run["strategy"]["processes"] == 2
    assert "tensorflow" not in run["software"]
    assert (shared.run_dir / "model" / "saved_model" / "saved_model.pb").is_file()

    cfg = shared.cfg.with_overrides({"store_uri": os.fspath(tmp_path / "store"),
                                     "min_accuracy": 0.0})
    staged = staging.stage(DatasetConfig(staging_dir=cfg.dataset.staging_dir))  # cached
    registry = open_registry(cfg.storage.store_uri)
    evaluation = evaluate.evaluate(cfg, staged, registry)
    assert evaluation["backend"] == "jax"
    published = publish.publish(cfg, registry, created="2026-12-04T00:00:00+00:00")
    manifest = registry.verify(cfg.model_name, published["version"])
    assert "saved_model/saved_model.pb" in {f["path"] for f in manifest["files"]}
