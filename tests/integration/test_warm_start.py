"""``model.warm_start`` on real trained models and a local store: the night's model
begins at production's weights, says so in ``run.json``, the report and the promotion
history; another architecture is refused with the reason and nothing stored changes; a
retry keeps its first try's start and a resumed run restores its own backup.

Production is the session's trained digits mlp (``trained_run``), evaluated, published
and promoted as ``night-1``; each warm run trains 1 to 3 epochs.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import keras
import numpy as np
import pytest
from support.cli import cli, one_error_line

from training.errors import CONFIG_ERROR_EXIT, ConfigError
from training.layout import BACKUP_DIR, HISTORY, REPORT_DIR, REPORT_INDEX, RUN, model_dir
from training.registry.versions import open_registry
from training.steps import evaluate, promote, publish
from training.train.fit import train
from training.train.warm_start import NO_PRODUCTION

pytestmark = pytest.mark.slow

AT = "2026-12-01T03:00:00+00:00"


class FirstWeights(keras.callbacks.Callback):
    """The model's weights when training begins, after every restore (it runs last)."""

    weights: list[np.ndarray] | None = None

    def on_train_begin(self, logs=None):
        self.weights = self.model.get_weights()


class Crash(RuntimeError):
    pass


class CrashAt(keras.callbacks.Callback):
    """Crashes the run at the start of ``epoch`` (0-based), after the backup of the
    epoch before it; keeps the weights that backup holds."""

    def __init__(self, epoch: int):
        super().__init__()
        self.epoch, self.weights = epoch, None

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.weights = self.model.get_weights()
            raise Crash(f"crashed at the start of epoch {epoch + 1}")


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _production(trained_run, staged, tmp_path: Path):
    """The trained mlp as production version ``night-1`` of a fresh local store."""
    cfg, result = trained_run
    night1 = cfg.with_overrides({"run_id": "night-1", "store_uri": str(tmp_path / "store"),
                                 "output_dir": str(tmp_path / "runs"), "min_accuracy": 0.5,
                                 "backup_interval_s": 0})
    shutil.copytree(result.run_dir, night1.run_dir())
    registry = open_registry(night1.storage.store_uri)
    evaluate.evaluate(night1, staged, registry)
    publish.publish(night1, registry, created=AT)
    assert promote.promote(night1, registry, at=AT)["promoted"]
    return night1, registry


def _weights_of(registry, name: str, version: str) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        return registry.load_model(name, version, tmp).get_weights()


def _run_record(cfg) -> dict:
    return json.loads((model_dir(cfg.run_dir()) / RUN).read_text())


def test_a_warm_start_begins_at_production_and_the_report_and_history_say_so(
        trained_run, staged_digits, tmp_path):
    night1, registry = _production(trained_run, staged_digits, tmp_path)
    name = night1.model_name
    night2 = night1.with_overrides({"run_id": "night-2", "warm_start": True, "epochs": 2,
                                    "min_improvement": -1.0})
    first = FirstWeights()
    train(night2, staged_digits, extra_callbacks=[first])

    assert _same(first.weights, _weights_of(registry, name, "night-1"))
    warm = _run_record(night2)["warm_start"]
    model_file = next(f for f in registry.show(name, "night-1")["files"]
                      if f["path"] == "model.keras")
    assert warm["from_version"] == "night-1" and warm["model_sha256"] == model_file["sha256"]
    # Then it trains as any run does: every epoch with its learning rate, early stopping.
    history = json.loads((model_dir(night2.run_dir()) / HISTORY).read_text())
    assert history["epochs"] == [1, 2] and len(history["metrics"]["learning_rate"]) == 2
    assert history["early_stopping"]["monitor"] == "val_loss"
    assert not _same(first.weights, keras.saving.load_model(
        model_dir(night2.run_dir()) / "model.keras").get_weights())

    evaluate.evaluate(night2, staged_digits, registry)
    report = (model_dir(night2.run_dir()) / REPORT_DIR / REPORT_INDEX).read_text()
    assert "warm-started from night-1" in report
    publish.publish(night2, registry, created=AT)
    assert promote.promote(night2, registry, at=AT)["promoted"]
    last = registry.history(name)[-1]
    assert (last["from"], last["to"], last["warm_started_from"]) == (
        "night-1", "night-2", "night-1")
    assert "warm_started_from" not in registry.history(name)[0]  # night-1 was cold
    published = registry.store.get_bytes(
        f"models/{name}/versions/night-2/{REPORT_DIR}/{REPORT_INDEX}").decode()
    assert "warm-started from night-1" in published


def test_another_architecture_is_refused_with_the_reason_and_nothing_stored_is_lost(
        trained_run, staged_digits, tmp_path):
    night1, registry = _production(trained_run, staged_digits, tmp_path)
    store = Path(night1.storage.store_uri)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    history = registry.history(night1.model_name)

    # The cnn under the mlp's model name, as a user runs it.
    proc = cli(tmp_path, "train", "--model", "cnn", "--model-name", night1.model_name,
               "--warm-start", "--epochs", "1", "--strategy", "one_device",
               "--staging-dir", night1.dataset.staging_dir, "--output-dir",
               str(tmp_path / "runs"), "--store-uri", str(store), "--run-id", "night-2")
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stderr[-3000:]
    error = one_error_line(proc)
    # (Keras numbers layer names per process: production was built in this one.)
    assert re.match(r"error: model\.warm_start is true, but this run's model does not fit "
                    r"production version 'night-1' of model 'digits-mlp': layer 2 is "
                    r"Flatten 'flatten(_\d+)?' in production, Conv2D 'conv2d' in this run's "
                    r"model; ", error), error
    assert "or set model.warm_start false to train from fresh weights" in error

    after = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    assert after == before  # the pointer, its history and every version, byte for byte
    assert registry.production(night1.model_name) == "night-1"
    assert registry.history(night1.model_name) == history
    refused = tmp_path / "runs" / "night-2"
    assert not (model_dir(refused) / "trained.json").exists()
    assert not (refused / BACKUP_DIR).exists()


def test_with_nothing_in_production_it_trains_cold_and_says_so(staged_digits, tmp_path):
    from training.config import RunConfig

    cfg = RunConfig.from_flat({"staging_dir": staged_digits.staging_dir, "epochs": 1,
                               "output_dir": str(tmp_path / "runs"), "run_id": "first",
                               "store_uri": str(tmp_path / "store"), "warm_start": True,
                               "strategy": "one_device"})
    train(cfg, staged_digits)
    warm = _run_record(cfg)["warm_start"]
    assert warm["from_version"] is None and warm["note"].startswith(
        f"{NO_PRODUCTION}: model 'digits-mlp' has nothing in production in ")
    assert warm["note"].endswith("; trained from fresh weights")
    registry = open_registry(cfg.storage.store_uri)
    evaluate.evaluate(cfg.with_overrides({"min_accuracy": 0.0}), staged_digits, registry)
    report = (model_dir(cfg.run_dir()) / REPORT_DIR / REPORT_INDEX).read_text()
    assert f"Starting weights: {NO_PRODUCTION}" in report


def test_a_retry_keeps_its_first_start_and_a_resumed_run_restores_its_own_backup(
        trained_run, staged_digits, tmp_path):
    night1, registry = _production(trained_run, staged_digits, tmp_path)
    name = night1.model_name
    production = _weights_of(registry, name, "night-1")
    resumed = night1.with_overrides({"run_id": "resumed", "warm_start": True, "epochs": 3})
    retried = night1.with_overrides({"run_id": "retried", "warm_start": True, "epochs": 1})
    after_one = CrashAt(1)  # a backup after epoch 1
    with pytest.raises(Crash):
        train(resumed, staged_digits, extra_callbacks=[after_one])
    with pytest.raises(Crash):
        train(retried, staged_digits, extra_callbacks=[CrashAt(0)])  # before any backup
    assert (resumed.run_dir() / BACKUP_DIR).is_dir()
    assert not (retried.run_dir() / BACKUP_DIR).exists()

    # Production moves to a model of another architecture under the same name.
    other = night1.with_overrides({"run_id": "cnn-1", "model": "cnn", "model_name": name,
                                   "epochs": 1, "force_promote": True})
    train(other, staged_digits)
    evaluate.evaluate(other, staged_digits, registry)
    publish.publish(other, registry, created=AT)
    promote.promote(other, registry, at=AT)
    assert registry.production(name) == "cnn-1"

    # The retry starts where its first try did: night-1, not the cnn now in production.
    first = FirstWeights()
    train(retried, staged_digits, extra_callbacks=[first])
    assert _same(first.weights, production)
    assert _run_record(retried)["warm_start"]["from_version"] == "night-1"
    # A new run is decided against production now, and refused.
    with pytest.raises(ConfigError, match="does not fit production version 'cnn-1'"):
        train(night1.with_overrides({"run_id": "new", "warm_start": True}), staged_digits)

    # The resumed run restores its backup and reads nothing from the store: it resumes
    # even after night-1 is cleaned out of it.
    shutil.rmtree(Path(night1.storage.store_uri, "models", name, "versions", "night-1"))
    first = FirstWeights()
    train(resumed, staged_digits, extra_callbacks=[first])
    assert _same(first.weights, after_one.weights)
    assert not _same(first.weights, production)
    assert _run_record(resumed)["warm_start"]["from_version"] == "night-1"
    history = json.loads((model_dir(resumed.run_dir()) / HISTORY).read_text())
    assert history["epochs"] == [1, 2, 3]


def test_either_backend_warm_starts_from_the_other_and_each_evaluates_the_other(
        trained_run, staged_digits, tmp_path):
    """Production trained on TensorFlow; night 2 trains on JAX (its own process, as
    ``train`` runs it) warm from it, is evaluated there against it on the same test
    split, published and promoted here; night 3 trains on TensorFlow warm from the
    JAX-trained night 2."""
    night1, registry = _production(trained_run, staged_digits, tmp_path)
    name = night1.model_name
    night2 = night1.with_overrides({"run_id": "night-2", "warm_start": True, "epochs": 2,
                                    "min_improvement": -1.0, "backend": "jax"})
    staged = tmp_path / "staged.json"
    staged.write_text(json.dumps(staged_digits.to_dict()))
    proc = cli(tmp_path, "train", "--config", str(night2.write(tmp_path)), "--staged",
               str(staged), "--evaluate")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = _run_record(night2)
    assert record["strategy"]["backend"] == "jax"
    assert record["warm_start"]["from_version"] == "night-1"
    evaluation = json.loads((model_dir(night2.run_dir()) / "evaluation.json").read_text())
    assert evaluation["backend"] == "jax"
    assert evaluation["champion"]["version"] == "night-1"  # TF-trained, evaluated on JAX
    assert evaluation["champion"]["accuracy"] == pytest.approx(
        json.loads(registry.store.get_bytes(
            f"models/{name}/versions/night-1/evaluation.json"))["challenger"]["accuracy"])
    publish.publish(night2, registry, created=AT)
    assert registry.verify(name, "night-2")["version"] == "night-2"
    assert promote.promote(night2, registry, at=AT)["promoted"]
    assert registry.history(name)[-1]["warm_started_from"] == "night-1"

    night3 = night1.with_overrides({"run_id": "night-3", "warm_start": True, "epochs": 1,
                                    "min_improvement": -1.0})
    first = FirstWeights()
    train(night3, staged_digits, extra_callbacks=[first])
    assert _same(first.weights, _weights_of(registry, name, "night-2"))
    assert _run_record(night3)["strategy"]["backend"] == "tensorflow"
