"""Issue 46 through the CLI, for real: a real ``mlflow server`` process, the store a bucket
on the session's S3 server, ``python -m training run`` as a user runs it.

One walk, its checks in order (each night's facts are read where the next night needs
them, so no training is paid twice):

1. night-1, a 3-trial sweep: one parent MLflow run with 3 children (values, per-epoch
   objective, end state), the config as params without a secret, the test metrics,
   the report and sweep.json; the version registered with its store prefix as source
   and ``champion`` on it; ``serving/<name>/1/`` loads with ``tf.saved_model.load`` and
   predicts like the ``.keras`` model; ``models:/<name>@champion`` loads with
   ``mlflow.pyfunc`` and predicts the same;
2. night-2 (forced) moves champion and adds folder 2; ``models rollback`` to night-1
   moves champion back and pushes night-1 as folder 3, the highest; ``mlflow models
   serve -m models:/<name>@champion`` answers ``/invocations`` with night-1's
   predictions;
3. night-3 with the server killed during its first epoch succeeds, its log says why
   tracking stopped; ``models sync-mlflow`` then registers night-3 and puts champion
   on production;
4. the Models page's task promotes night-2 with no server at the tracking URI: it
   stands, and one alert says what MLflow did not get.

Beside the walk: ``train --workers 2`` through a slow link to the server, where the
launcher's run exists before its workers start and the chief alone logs each epoch.

Bad input (no training): a malformed URI, a URI with a password: exit 2, one line,
naming the setting, nothing staged.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from support.cli import cli, last_json, one_error_line, streamed
from support.cutproxy import CutProxy
from support.mlflow_fixture import mlflow_s3_environment
from support.mlflow_fixture import mlflow_server as mlflow_server  # the fixture

from tools.services import free_port_block
from training import layout

pytestmark = pytest.mark.slow

NAME = "tracked-mlp"
SPACE = {"fit.learning_rate": {"choices": [0.003, 0.01, 0.03]}}
QUICK = ["--backup-interval-s", "0", "--min-accuracy", "0", "--epochs", "2"]


@pytest.fixture(scope="module")
def walk(mlflow_server, s3_server, staged_digits, tmp_path_factory):
    """Where the walk happens: (working dir, store URI, the environment of every
    command, the images of the test split to predict on)."""
    work = tmp_path_factory.mktemp("tracked")
    config = work / "aws-config"
    config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    store = f"s3://{s3_server.create_bucket()}/team"
    env = {**s3_server.env(), "AWS_CONFIG_FILE": os.fspath(config),
           "TRAINING_MLFLOW_TRACKING_URI": mlflow_server.url,
           "MLFLOW_TRACKING_URI": mlflow_server.url}
    images = np.load(_test_images(staged_digits, work))
    (work / "datasets").symlink_to(staged_digits.staging_dir)
    return work, store, env, images


def _test_images(staged, work: Path) -> Path:
    """The test split's first 16 images, as an .npy file."""
    import tensorflow_datasets as tfds

    from training.data.snapshot.snapshot_reader import staged_builder

    dataset = staged_builder(staged).as_dataset("test", as_supervised=True).take(16)
    images = np.stack([image for image, _ in tfds.as_numpy(dataset)])
    path = work / "images.npy"
    np.save(path, images)
    return path


def _common(walk) -> list[str]:
    work, store, _, _ = walk
    return ["--staging-dir", os.fspath(work / "datasets"), "--output-dir",
            os.fspath(work / "runs"), "--store-uri", store, "--model-name", NAME, *QUICK]


def _client(server):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=server.url, registry_uri=server.url)


def _runs(client) -> list:
    experiment = client.get_experiment_by_name(NAME)
    return client.search_runs([experiment.experiment_id], max_results=100)


def _keras_predictions(store_env: dict, store: str, version: str, images) -> np.ndarray:
    """What the version's ``.keras`` file predicts, loaded from the store."""
    import keras

    from training.registry.versions import open_registry

    with pytest.MonkeyPatch.context() as patch:
        for key, value in store_env.items():
            patch.setenv(key, value)
        with_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"keras-{version}-{os.getpid()}"
        open_registry(store).download(NAME, version, with_dir)
    model = keras.saving.load_model(with_dir / layout.MODEL_FILE, safe_mode=True)
    return np.asarray(model.predict(images, verbose=0))


def test_a_sweep_night_is_one_parent_run_its_trials_children_and_its_version_the_champion(
        walk, mlflow_server):
    work, store, env, images = walk
    proc = cli(work, "run", *_common(walk), "--run-id", "night-1", "--sweep-trials", "3",
               "--sweep-parallel", "3", "--sweep-sampler", "grid", "--sweep-pruner", "none",
               "--sweep-space", json.dumps(SPACE), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    picked = last_json(proc.stdout, "sweep")["sweep"]["picked"]
    client = _client(mlflow_server)
    runs = {run.data.tags["pipeline.run_id"]: run for run in _runs(client)}
    parent = runs["night-1"]
    children = [r for r in runs.values()
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["pipeline.run_id"] for r in children) == [
        "night-1-t0", "night-1-t1", "night-1-t2"], proc.stderr[-6000:]
    for child in children:  # its values, its objective per epoch, its end state
        assert child.data.params["fit.learning_rate"] in {"0.003", "0.01", "0.03"}
        history = client.get_metric_history(child.info.run_id, "val_loss")
        assert [m.step for m in history] == [0, 1]
        assert child.data.tags["pipeline.state"] == "complete"
        assert child.info.status == "FINISHED"
        assert {"loss", "accuracy", "val_accuracy", "learning_rate",
                "images_per_s"} <= set(child.data.metrics)
    assert len({c.data.params["fit.learning_rate"] for c in children}) == 3
    # The parent: the config, the Airflow-free tags, the test metrics, the decision.
    assert parent.info.status == "FINISHED"
    assert parent.data.params["sweep.trials"] == "3"
    assert parent.data.tags["backend"] == "tensorflow"
    assert parent.data.tags["published.version"] == picked
    assert parent.data.tags["decision.promote"] == "True"
    assert "no model in production" in parent.data.tags["decision.reasons"]
    assert 0 < parent.data.metrics["test_accuracy"] <= 1
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report", "sweep.json"} <= artifacts, artifacts
    for run in runs.values():  # no secret in any param or tag
        text = json.dumps([run.data.params, run.data.tags])
        assert env["AWS_SECRET_ACCESS_KEY"] not in text
    # The registry mirrored: the version's folder is the source, champion on it.
    champion = client.get_model_version_by_alias(NAME, "champion")
    assert champion.source == f"{store}/models/{NAME}/versions/{picked}"
    assert champion.tags["pipeline.version"] == picked
    # The serving layout, by TF Serving's rule, and MLflow's own loading.
    with mlflow_s3_environment(env):
        import mlflow
        import tensorflow as tf

        from training.registry import open_store
        from training.registry.serving import ServingLayout

        serving = ServingLayout(open_store(store))
        assert serving.numbers(NAME) == [1] and serving.served(NAME) == 1
        local = work / "served-1"
        for key in serving.store.list(f"serving/{NAME}/1/"):
            target = local / key.removeprefix(f"serving/{NAME}/1/")
            target.parent.mkdir(parents=True, exist_ok=True)
            serving.store.get_file(key, target)
        signature = tf.saved_model.load(os.fspath(local)).signatures["serving_default"]
        (input_name,) = signature.structured_input_signature[1]
        from_serving = signature(**{input_name: tf.constant(images)})
        from_serving = np.asarray(next(iter(from_serving.values())))
        from_mlflow = np.asarray(mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
                                 .predict(images))
    expected = _keras_predictions(env, store, picked, images)
    np.testing.assert_allclose(from_serving, expected, atol=1e-5)
    np.testing.assert_allclose(from_mlflow, expected, atol=1e-5)


def test_a_promotion_and_a_rollback_move_champion_and_the_served_model(walk, mlflow_server):
    work, store, env, images = walk
    first = _client(mlflow_server).get_model_version_by_alias(NAME, "champion")
    proc = cli(work, "run", *_common(walk), "--run-id", "night-2", "--force-promote",
               env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = _client(mlflow_server)
    assert client.get_model_version_by_alias(NAME, "champion").tags[
        "pipeline.version"] == "night-2"
    proc = cli(work, "models", "rollback", "--store-uri", store, "--name", NAME,
               "--version", first.tags["pipeline.version"], "--reason", "night-2 is worse",
               env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert client.get_model_version_by_alias(NAME, "champion").version == first.version
    from training.registry import open_store
    from training.registry.serving import ServingLayout

    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        serving = ServingLayout(open_store(store))
        assert serving.numbers(NAME) == [1, 2, 3] and serving.served(NAME) == 3
        assert serving.index(NAME)[-1] == {"number": 3,
                                           "version": first.tags["pipeline.version"]}
    # Served for real: MLflow's scoring server on the champion, after the rollback, run as
    # docs/tracking.md says (the environment's bin/ on PATH: it starts its uvicorn).
    port = free_port_block(1)
    venv_bin = os.fspath(Path(sys.executable).parent)
    server = subprocess.Popen(
        ["mlflow", "models", "serve", "-m", f"models:/{NAME}@champion", "--env-manager",
         "local", "--host", "127.0.0.1", "-p", str(port)], cwd=work,
        env={**os.environ, **env, "PATH": f"{venv_bin}:{os.environ['PATH']}"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        answer = None
        for _ in range(240):  # a hang guard, not a measure
            if server.poll() is not None:
                break
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/invocations",
                    data=json.dumps({"inputs": images.tolist()}).encode(),
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=30) as response:
                    answer = json.loads(response.read())
                break
            except OSError:
                time.sleep(0.5)
        assert answer is not None, server.stdout.read().decode()[-3000:] \
            if server.poll() is not None else "no answer"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, 15)
        server.wait(timeout=30)
    expected = _keras_predictions(env, store, first.tags["pipeline.version"], images)
    np.testing.assert_allclose(np.asarray(answer["predictions"]), expected, atol=1e-5)


def test_mlflow_down_during_a_run_does_not_fail_it_and_sync_repairs_the_mirror(
        walk, mlflow_server):
    work, store, env, _ = walk

    def kill_at_the_first_epoch(proc, line: str) -> None:
        if "Epoch 1/" in line and mlflow_server.alive():
            mlflow_server.kill()

    status, lines = streamed(["run", *_common(walk), "--run-id", "night-3",
                              "--force-promote"], cwd=work, env=env,
                             on_line=kill_at_the_first_epoch)
    assert status == 0, "\n".join(lines[-40:])
    stopped = [line for line in lines if "MLflow tracking stopped" in line]
    assert len(stopped) == 1, "\n".join(lines[-40:])
    assert mlflow_server.url in stopped[0]
    mlflow_server.start()
    client = _client(mlflow_server)
    assert client.get_model_version_by_alias(NAME, "champion").tags[
        "pipeline.version"] != "night-3"  # the mirror missed the promotion
    proc = cli(work, "models", "sync-mlflow", "--store-uri", store, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)[NAME]["champion"] == "night-3"
    assert client.get_model_version_by_alias(NAME, "champion").tags[
        "pipeline.version"] == "night-3"
    versions = {v.tags["pipeline.version"] for v in
                client.search_model_versions(f"name = '{NAME}'")}
    assert {"night-2", "night-3"} <= versions
    again = cli(work, "models", "sync-mlflow", "--store-uri", store, env=env)  # idempotent
    assert again.returncode == 0
    assert len(client.search_model_versions(f"name = '{NAME}'")) == len(versions)


@pytest.mark.parametrize("uri, says", [
    ("htp:/nowhere", "must be an http(s)://host[:port] tracking server"),
    ("http://127.0.0.1:notaport", "is not a URI"),
    ("https://team:hunter2@mlflow.example:5000", "must not hold a password"),
])
def test_a_tracking_uri_that_cannot_work_is_refused_before_staging(tmp_path, uri, says):
    proc = cli(tmp_path, "run", "--staging-dir", os.fspath(tmp_path / "datasets"),
               "--output-dir", os.fspath(tmp_path / "runs"), "--epochs", "1",
               env={"TRAINING_MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "TRAINING_MLFLOW_TRACKING_URI" in line and says in line, line
    assert "hunter2" not in proc.stderr + proc.stdout
    assert not (tmp_path / "datasets").exists() and not (tmp_path / "runs").exists()


def test_a_move_mlflow_does_not_get_stands_and_sends_one_alert(walk, mlflow_server,
                                                                s3_server, monkeypatch):
    """The Models page's task (``move_pointer``) promotes night-2 with no MLflow server
    at the tracking URI: production and the serving layout move, champion stays, and
    one alert (a real webhook receiver) says what MLflow did not get and how to repair
    it, besides the promotion's own."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from support.receivers import webhook_connection, webhook_receiver

    from training.registry import open_store
    from training.registry.serving import ServingLayout
    from training.tracking import forget_tracker
    from training_airflow.manual_promotion import move_pointer

    work, store, env, _ = walk
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    down = socket.socket()  # bound and never listening: nothing else takes its port
    down.bind(("127.0.0.1", 0))
    monkeypatch.setenv("TRAINING_MLFLOW_TRACKING_URI",
                       f"http://127.0.0.1:{down.getsockname()[1]}")
    monkeypatch.setenv("TRAINING_STORE_URI", store)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(s3_server.connection()))
    run = SimpleNamespace(dag_id="promote_model", triggering_user_name="alice",
                          run_after=datetime(2026, 12, 7, tzinfo=UTC))
    with webhook_receiver() as webhook:
        monkeypatch.setenv("AIRFLOW_CONN_TRAINING_ALERTS_WEBHOOK",
                           webhook_connection(webhook.server_address[1], "/hook"))
        forget_tracker()
        try:
            moved = move_pointer({"model_name": NAME, "version": "night-2",
                                  "action": "promote", "reason": "night-2 after all"},
                                 run, "manual__2026-12-07")
        finally:
            forget_tracker()
            down.close()
        sent = [request["json"] for request in webhook.requests if request["path"] == "/hook"]
    assert moved["moved"] and moved["from"] == "night-3", moved
    assert ServingLayout(open_store(store)).index(NAME)[-1]["version"] == "night-2"
    assert [alert["kind"] for alert in sent] == ["mlflow_mirror_failed", "promoted"], sent
    mirror = sent[0]
    assert mirror["subject"].startswith(f"MLflow did not follow {NAME}: night-2"), mirror
    assert any(line.startswith(f"not sent: registering {NAME} version night-2")
               for line in mirror["lines"]), mirror
    assert "models sync-mlflow" in mirror["text"]
    assert _client(mlflow_server).get_model_version_by_alias(NAME, "champion").tags[
        "pipeline.version"] == "night-3"  # MLflow's champion did not move


def test_a_two_worker_run_is_one_run_made_before_its_workers_start(
        tmp_path: Path, staged_digits, mlflow_server):
    """``train --workers 2``: the launcher starts the MLflow run and waits until it exists
    before it starts the workers; then the chief worker (``training.launch.worker``)
    logs each epoch into it, the other worker nothing. Each request to the server waits
    3 s on its way, so a launcher that does not wait starts its workers seconds before
    its run exists, and a chief that finds no run makes a second one (CI's run of stop
    52: the launcher's sender, slow on a busy machine, lost that race). The client waits
    60 s for an answer here, not 10: each chunk a request sends waits 3 s (urllib3 sends
    a POST's headers and body apart), and on a busy machine a 10-s wait ran out, which
    stopped the launcher's tracking before its run existed. And it retries 5 times, not
    once: the server closes a connection idle for 5 s, and a request the proxy still
    holds then finds it closed (RemoteDisconnected), a window the delay makes seconds
    wide."""
    slow = CutProxy("127.0.0.1", int(mlflow_server.url.rsplit(":", 1)[1]), latency_s=3.0)
    try:
        done = cli(tmp_path, "train", "--staging-dir", staged_digits.staging_dir,
                   "--workers", "2", "--epochs", "2", "--backup-interval-s", "0",
                   "--output-dir", str(tmp_path / "runs"), "--run-id", "two-workers",
                   env={"TRAINING_MLFLOW_TRACKING_URI": slow.endpoint,
                        "MLFLOW_TRACKING_URI": "", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
                        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "5"})
    finally:
        slow.close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MLflow tracking stopped" not in done.stderr, done.stderr[-3000:]
    launched = next(line for line in done.stderr.splitlines() if "launching 2 workers" in line)
    launched_at = datetime.strptime(launched[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    history = json.loads(next((tmp_path / "runs").rglob("history.json")).read_text())
    client = _client(mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("digits-mlp").experiment_id],
                               filter_string="tags.`pipeline.run_id` = 'two-workers'")
    assert run.info.start_time / 1000 < launched_at, (run.info.start_time, launched)
    logged = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in logged] == [0, 1], (logged, done.stderr[-6000:])
    assert [m.value for m in logged] == pytest.approx(history["metrics"]["loss"], rel=1e-6)
