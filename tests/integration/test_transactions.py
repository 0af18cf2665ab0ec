"""Every run is a transaction: re-runs, races, bad data and bad models lose nothing and
stop with one clear line.

Each test drives ``python -m training`` in real subprocesses, as a user or the Airflow
``train`` task does; the S3 store is a bucket on the session's SeaweedFS over HTTP
behind a proxy whose link the test cuts (``support/cutproxy.py``), so the server keeps
its state while the network fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.cli import cli, one_error_line
from support.cutproxy import CutProxy

from training import produced
from training.registry import open_store
from training.registry.versions import ModelRegistry

pytestmark = pytest.mark.slow

FAST = ["--epochs", "3", "--backup-interval-s", "0"]


def history_rows(run_dir: Path) -> int:
    return len((run_dir / "model" / "history.csv").read_text().splitlines()) - 1


# --------------------------------------------------------------- 1. re-running a run


@pytest.fixture
def s3_behind_proxy(s3_server, tmp_path):
    proxy = CutProxy("127.0.0.1", s3_server.port)
    config = tmp_path / "aws-config"
    config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    env = {**s3_server.env(endpoint=proxy.endpoint),
           "AWS_CONFIG_FILE": os.fspath(config), "AWS_MAX_ATTEMPTS": "2"}
    try:
        yield proxy, f"s3://{s3_server.create_bucket()}/registry", env
    finally:
        proxy.close()


def test_a_rerun_finishes_a_promotion_the_network_lost_and_never_retrains(
        s3_behind_proxy, staging_dir, tmp_path, s3_server):
    proxy, store_uri, env = s3_behind_proxy
    args = ["run", *FAST, "--run-id", "nightly-1", "--model-name", "rerun",
            "--staging-dir", staging_dir, "--output-dir", os.fspath(tmp_path / "runs"),
            "--store-uri", store_uri]
    # The link to S3 goes down right after the version is published, before the
    # production pointer is written.
    proc = subprocess.Popen([sys.executable, "-m", "training", *args], cwd=tmp_path,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
    for line in proc.stdout:
        if line.startswith('{"published"'):
            proxy.cut()
    assert proc.wait(timeout=600) == 1, "".join(stderr)[-3000:]
    time.sleep(0.5)
    assert [line for line in stderr if line.startswith("error: ")], "".join(stderr)[-3000:]
    registry = ModelRegistry(open_store(store_uri, s3_server.options()))
    assert registry.production("rerun") is None  # the pointer write was lost
    run_dir = tmp_path / "runs" / "nightly-1"
    rows, model = history_rows(run_dir), (run_dir / "model" / "model.keras").read_bytes()

    proxy.restore()
    again = cli(tmp_path, *args, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "run nightly-1 is already trained" in again.stderr
    assert "Epoch 1/" not in again.stdout  # nothing was trained again
    assert history_rows(run_dir) == rows == 3
    assert (run_dir / "model" / "model.keras").read_bytes() == model
    assert registry.production("rerun") == "nightly-1"
    assert [h["to"] for h in registry.history("rerun")] == ["nightly-1"]

    # A third time there is nothing left to do, and it says so.
    third = cli(tmp_path, *args, env=env)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "already trained" in third.stderr and "already published" in third.stderr
    assert [h["to"] for h in registry.history("rerun")] == ["nightly-1"]


def test_a_finished_run_with_other_settings_is_refused_not_retrained(trained_run, tmp_path):
    cfg, _ = trained_run
    proc = cli(tmp_path, "train", "--run-id", cfg.run_id, "--epochs", "2",
               "--output-dir", cfg.storage.output_dir,
               "--staging-dir", cfg.dataset.staging_dir)
    assert proc.returncode == 2
    assert f"run {cfg.run_id} was already trained with other settings" in one_error_line(proc)


# ------------------------------------------------------- 2. the fingerprint is the data


def test_a_changed_shard_restaged_under_its_key_is_refused(tmp_path):
    staging = tmp_path / "staging"
    first = cli(tmp_path, "stage", "--staging-dir", os.fspath(staging))
    assert first.returncode == 0, first.stderr[-2000:]
    key = json.loads(first.stdout.splitlines()[-1])["staged"]["key"]
    root = staging / "digits" / "1.0.0"
    # Tamper with the data the way the report did: change the train shard, then let
    # staging rebuild the manifest over it.
    shard = next(root.glob("digits-train.tfrecord-*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard.write_bytes(bytes(data))
    (root / "staging-manifest.json").unlink()
    again = cli(tmp_path, "stage", "--staging-dir", os.fspath(staging))
    assert again.returncode == 1
    line = one_error_line(again)
    assert f"was staged before with fingerprint {key.split('@')[1]}" in line, line
    assert "the content changed under the same name and version" in line
    # And training refuses the tampered files without a manifest rebuild too.
    train = cli(tmp_path, "train", *FAST, "--staging-dir", os.fspath(staging),
                "--output-dir", os.fspath(tmp_path / "runs"))
    assert train.returncode == 1 and "digits" in one_error_line(train)


def test_a_corrupted_staging_manifest_is_one_line(tmp_path):
    staging = tmp_path / "staging"
    assert cli(tmp_path, "stage", "--staging-dir", os.fspath(staging)).returncode == 0
    (staging / "digits" / "1.0.0" / "staging-manifest.json").write_text('{"files": 3')
    proc = cli(tmp_path, "stage", "--staging-dir", os.fspath(staging))
    assert proc.returncode == 1
    assert "staging manifest" in one_error_line(proc) and "is corrupted" in proc.stderr


# ---------------------------------------------------------------- 3. one run at a time


def test_two_processes_with_one_run_id_one_trains_the_other_is_told_who(staging_dir,
                                                                         tmp_path):
    args = ["train", "--epochs", "12", "--backup-interval-s", "0", "--run-id", "same",
            "--staging-dir", staging_dir, "--output-dir", os.fspath(tmp_path / "runs")]
    first = subprocess.Popen([sys.executable, "-m", "training", *args], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "runs" / "same" / "run.lock"
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text().strip()) and time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.2)
    second = cli(tmp_path, *args)
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode == 1
    line = one_error_line(second)
    assert f"run directory {tmp_path / 'runs' / 'same'} (run same) is in use: process " \
           f"{first.pid} on " in line, line
    assert history_rows(tmp_path / "runs" / "same") == 12  # one run's epochs, not a mix


def test_a_staging_claim_held_elsewhere_names_its_holder(tmp_path, monkeypatch):
    from training.config import DatasetConfig
    from training.data.snapshot import staging
    from training.errors import BusyError

    staging_dir = tmp_path / "staging"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from training.locks import claim
        with claim({os.fspath(staging_dir / "digits" / "1.0.0.lock")!r}, "staging"):
            print("held", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(staging, "STAGING_WAIT_S", 1.0)
        with pytest.raises(BusyError, match=f"is in use: process {holder.pid} on "):
            staging.stage(DatasetConfig(staging_dir=os.fspath(staging_dir)))
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------- 4. promotion runs the model first


def _publish(registry: ModelRegistry, name: str, model_or_bytes, tmp_path: Path) -> None:
    out = tmp_path / name
    out.mkdir()
    if isinstance(model_or_bytes, bytes):
        (out / "model.keras").write_bytes(model_or_bytes)
    else:
        model_or_bytes.save(out / "model.keras")
    registry.publish(name, "v1", out, run_id="r1", created="2026-12-01T00:00:00+00:00")


def test_manual_promotion_refuses_a_model_that_does_not_load_or_run(tmp_path):
    import keras

    store = tmp_path / "store"
    registry = ModelRegistry(open_store(os.fspath(store)))
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    unsafe = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda x: x * 2),
                               keras.layers.Dense(3)])
    _publish(registry, "plain", plain, tmp_path)
    _publish(registry, "unsafe", unsafe, tmp_path)
    _publish(registry, "broken", b"PK\x03\x04 not really a keras file", tmp_path)

    def promote(name: str) -> subprocess.CompletedProcess:
        return cli(tmp_path, "models", "promote", "--store-uri", os.fspath(store), "--name",
                   name, "--version", "v1", "--reason", "by hand")

    for name, why in [("unsafe", "refused by Keras safe_mode"),
                      ("broken", "cannot be loaded by Keras")]:
        proc = promote(name)
        assert proc.returncode == 1, proc.stderr[-2000:]
        line = one_error_line(proc)
        assert f"refusing to promote model {name!r} version 'v1'" in line and why in line
        assert registry.production(name) is None
    ok = promote("plain")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert registry.production("plain") == "v1"


def test_a_lambda_challenger_fails_evaluate_in_one_line(staging_dir, tmp_path):
    import keras

    args = ["--run-id", "lam", "--staging-dir", staging_dir,
            "--output-dir", os.fspath(tmp_path / "runs"),
            "--store-uri", os.fspath(tmp_path / "store")]
    out = tmp_path / "runs" / "lam" / "model"
    out.mkdir(parents=True)
    keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Lambda(lambda x: x),
                      keras.layers.Flatten(), keras.layers.Dense(10)]).save(out / "model.keras")
    proc = cli(tmp_path, "evaluate", *args)
    assert proc.returncode == 1
    assert "was refused by Keras safe_mode" in one_error_line(proc)
    # publish without an evaluation says what to do first
    proc = cli(tmp_path, "publish", *args)
    assert proc.returncode == 1
    assert "run lam has no evaluation" in one_error_line(proc)


# ------------------------------------------------------------ 5. devices that exist


@pytest.mark.parametrize(("devices", "missing"), [
    (["/gpu:0", "/gpu:1"], "/gpu:0"),
    (["/cpu:0", "/cpu:1"], "/cpu:1"),
])
def test_devices_that_do_not_exist_are_refused_before_any_strategy(staging_dir, tmp_path,
                                                                   devices, missing):
    proc = cli(tmp_path, "train", "--strategy", "mirrored", "--devices", *devices,
               "--staging-dir", staging_dir, "--output-dir", os.fspath(tmp_path / "runs"),
               timeout=300)  # it used to hang here for ever
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert f"runtime.devices asks for {missing}, which this machine does not have" in line


def test_sigterm_ends_a_step_that_never_finishes(tmp_path):
    """A step stuck in TensorFlow never lets Python's SIGTERM handler run; the watchdog
    of ``stop_on_sigterm`` exits 143 after the grace period all the same."""
    script = textwrap.dedent("""
        import os, types
        from training.train.preemption import stop_on_sigterm
        read_end, _ = os.pipe()
        with stop_on_sigterm(types.SimpleNamespace(stop_signal=None), grace_s=2):
            print("stuck", flush=True)
            os.read(read_end, 1)  # never returns: the all-reduce that never completes
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "stuck"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert "SIGTERM 2 s ago and training has not reached the end of a batch" in \
        proc.stderr.read()


# -------------------------------------------------- 6. one error line, every path


@pytest.mark.parametrize("case", ["dataset-version", "not-utf8", "deep-json", "tpu",
                                  "abbreviation"])
def test_bad_inputs_end_in_one_error_line(case, staging_dir, tmp_path):
    proxy = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
             "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
             "NO_PROXY": "", "no_proxy": ""}  # nothing leaves this machine
    common = ["--staging-dir", staging_dir, "--output-dir", os.fspath(tmp_path / "runs")]
    if case == "dataset-version":
        args, expected = ["stage", "--dataset-version", "9.9.9", *common], \
            "dataset.version '9.9.9' is not available for 'digits'"
    elif case == "not-utf8":
        (tmp_path / "c.json").write_bytes(b'{"fit": {"epochs": 3}} \xff\xfe')
        args, expected = ["train", "--config", os.fspath(tmp_path / "c.json")], \
            "is not UTF-8 text"
    elif case == "deep-json":
        (tmp_path / "c.json").write_text("[" * 100_000 + "]" * 100_000)
        args, expected = ["train", "--config", os.fspath(tmp_path / "c.json")], \
            "config is nested too deeply"
    elif case == "tpu":
        args, expected = ["train", "--strategy", "tpu", "--tpu", "no-such-tpu",
                          "--accelerator", "tpu", *common], \
            "runtime.strategy is 'tpu' but no TPU answered for runtime.tpu='no-such-tpu'"
    else:
        args, expected = ["train", "--epoch", "3", *common], "unrecognized arguments: --epoch"
    proc = cli(tmp_path, *args, env=proxy, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    if case == "abbreviation":  # argparse's own usage error, exit 2, no training
        assert expected in proc.stderr and "Epoch" not in proc.stdout
    else:
        assert expected in one_error_line(proc)


@pytest.mark.parametrize("pointer", [b"", b"[]", b'{"version": "v1"}', b"not json"])
def test_a_damaged_production_pointer_is_one_line(tmp_path, pointer):
    store = tmp_path / "store"
    (store / "models" / "m").mkdir(parents=True)
    (store / "models" / "m" / "production.json").write_bytes(pointer)
    proc = cli(tmp_path, "models", "list", "--store-uri", os.fspath(store), "--name", "m")
    assert proc.returncode == 1
    assert "production pointer of model 'm'" in one_error_line(proc)


def promoted_copy(trained_run, tmp_path: Path):
    """The session's trained run, copied, published as version ``run`` of a local store
    and promoted: (its config, the store's root, the registry)."""
    from training.steps.publish import publish

    cfg, _ = trained_run
    store = tmp_path / "store"
    registry = ModelRegistry(open_store(os.fspath(store)))
    shutil.copytree(cfg.run_dir(), tmp_path / "run")
    cfg = cfg.with_overrides({"output_dir": os.fspath(tmp_path), "run_id": "run",
                              "store_uri": os.fspath(store)})
    (tmp_path / "run" / "model" / "evaluation.json").write_text(json.dumps(
        {"challenger": {"accuracy": 0.9, "loss": 0.3, "macro_f1": 0.9}}))
    produced.record(tmp_path / "run", "evaluate", produced.EVALUATE)  # as evaluate does
    publish(cfg, registry, created="2026-12-01T00:00:00+00:00")
    registry.promote(cfg.model_name, "run", run_id="run", at="2026-12-01T00:00:00+00:00",
                     reason="first")
    return cfg, store, registry


def test_a_pointer_changed_outside_the_registry_is_refused(trained_run, tmp_path):
    cfg, store, _ = promoted_copy(trained_run, tmp_path)
    pointer = store / "models" / cfg.model_name / "production.json"
    # Same JSON shape, another version: a hand edit the checksum catches.
    pointer.write_text(pointer.read_text().replace('"version": "run"', '"version": "other"', 1))
    proc = cli(tmp_path, "models", "list", "--store-uri", os.fspath(store))
    assert proc.returncode == 1
    assert "does not match its SHA-256" in one_error_line(proc)


# ------------------------------------------------------------------ 7. the small ones


def test_models_list_flags_a_pointer_to_a_deleted_version(trained_run, tmp_path):
    from training.steps.publish import publish

    cfg, store, registry = promoted_copy(trained_run, tmp_path)
    shutil.rmtree(store / "models" / cfg.model_name / "versions" / "run")
    proc = cli(tmp_path, "models", "list", "--store-uri", os.fspath(store))
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = json.loads(proc.stdout)[cfg.model_name]
    assert "production points at version 'run', which is not a complete version" in \
        listed["warning"]

    # A version over the size limit is refused with the sizes, and nothing is written.
    (tmp_path / "run" / "model" / "weights.bin").write_bytes(os.urandom(3 << 20))
    produced.record(tmp_path / "run", "train", [*produced.TRAIN, "weights.bin"])
    bigger = cfg.with_overrides({"run_id": "run", "max_version_mb": 2})
    with pytest.raises(Exception, match=r"is \d+\.\d MiB, over the limit of 2 MiB "
                                         r"\(max_version_mb\); largest files: weights.bin 3.0"):
        publish(bigger, registry, created="2026-12-01T00:00:00+00:00")
    assert not (store / "models" / cfg.model_name / "versions" / "run").exists()


def test_a_full_disk_leaves_no_temporary_file(tmp_path):
    """RLIMIT_FSIZE makes the write fail half-way as a full disk does (EFBIG)."""
    store = tmp_path / "store"
    script = textwrap.dedent(f"""
        import resource, signal
        from training.registry.local import FileStore
        from training.errors import StorageError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            FileStore({os.fspath(store)!r}).put_bytes("models/m/big", b"x" * 100_000)
        except StorageError as exc:
            print("refused:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert "refused: cannot write 'models/m/big'" in done.stdout, done.stderr[-2000:]
    assert [p.name for p in store.rglob("*") if p.is_file()] == []


def test_a_download_that_fails_is_one_error_and_leaves_no_partial_files(tmp_path):
    """What tfds does offline (ConnectionError after its retries), without the minutes
    of retries: a real builder whose download raises at once."""
    import tensorflow_datasets as tfds

    from training.config import DatasetConfig
    from training.data.snapshot import staging
    from training.errors import DatasetError

    class OfflineImages(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(4, 4, 1)),
                    "label": tfds.features.ClassLabel(num_classes=2)}),
                supervised_keys=("image", "label"))

        def _split_generators(self, dl_manager):
            partial = tmp_path / "staging" / "downloads" / "offline_images" / "d.zip.tmp.1"
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(b"half a download")
            raise ConnectionError("Failed to resolve 'example.org' (offline)")

        def _generate_examples(self):
            yield from ()

    staging_dir = tmp_path / "staging"
    with pytest.raises(DatasetError, match=r"cannot prepare dataset 'offline_images' into "
                                           r".*: ConnectionError: Failed to resolve"):
        staging.stage(DatasetConfig(name="offline_images", staging_dir=os.fspath(staging_dir)))
    left = [p.relative_to(staging_dir).as_posix() for p in staging_dir.rglob("*") if p.is_file()]
    assert left == [], left
