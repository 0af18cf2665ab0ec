"""Real Keras training on the staged digits dataset (CPU)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from training.config import RunConfig
from training.data.input.choose import load_builder, make_dataset
from training.train.fit import train

pytestmark = pytest.mark.slow


def test_run_directory_holds_every_output(trained_run):
    cfg, result = trained_run
    run_dir = Path(result.run_dir)
    out = run_dir / "model"
    for name in ("model/config.json", "model/run.json", "model/model.keras",
                 "checkpoints/best.keras", "model/saved_model/saved_model.pb",
                 "model/history.json", "model/history.csv"):
        assert (run_dir / name).exists(), name
    assert RunConfig.from_file(out / "config.json") == cfg
    run = json.loads((out / "run.json").read_text())
    assert run["strategy"]["global_batch_size"] == cfg.fit.batch_size
    assert run["strategy"]["devices"] == ["/cpu:0"]  # the devices used, not asked for
    assert run["software"]["keras"].startswith("3.")
    history = json.loads((out / "history.json").read_text())
    assert history["epochs"] == list(range(1, cfg.fit.epochs + 1))
    assert set(history["metrics"]) >= {"loss", "accuracy", "val_loss", "val_accuracy",
                                       "learning_rate"}
    assert not (run_dir / "backup").exists()  # removed by BackupAndRestore after success


def test_the_run_says_how_fast_it_went_and_on_what(trained_run):
    cfg, result = trained_run
    out = Path(result.run_dir) / "model"
    history = json.loads((out / "history.json").read_text())["metrics"]
    for key in ("images_per_s", "step_ms", "peak_memory_mb"):
        assert len(history[key]) == cfg.fit.epochs and all(v > 0 for v in history[key]), key
    run = json.loads((out / "run.json").read_text())
    speed = run["throughput"]
    assert speed["images_per_s"] == sorted(history["images_per_s"])[cfg.fit.epochs // 2]
    assert speed["peak_memory_mb"] == max(history["peak_memory_mb"])
    assert speed["memory_measured"] == "process RSS"  # a CPU run
    assert speed["accelerator"]["platform"] == "cpu" and speed["accelerator"]["count"] == 1
    assert run["precision"] == {"policy": "float32",
                                "why": "auto: cpu has no bf16 matrix units"}


def test_tensorboard_has_every_epoch_of_loss_accuracy_and_learning_rate(trained_run):
    import tensorflow as tf

    cfg, result = trained_run
    board = Path(result.run_dir) / "model" / "tensorboard"  # published with the version
    history = json.loads((Path(result.run_dir) / "model" / "history.json").read_text())
    scalars: dict[str, dict[str, dict[int, float]]] = {}
    for split in ("train", "validation"):
        [events] = sorted((board / split).glob("events.out.tfevents.*"))
        for event in tf.compat.v1.train.summary_iterator(os.fspath(events)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor))
                scalars.setdefault(split, {}).setdefault(value.tag, {})[event.step] = number
    steps = list(range(cfg.fit.epochs))  # TensorBoard counts epochs from 0
    for tag in ("epoch_loss", "epoch_accuracy", "epoch_learning_rate"):
        assert sorted(scalars["train"][tag]) == steps, tag
    for tag in ("epoch_loss", "epoch_accuracy"):
        assert sorted(scalars["validation"][tag]) == steps, tag
    # The same numbers as the run's history.
    np.testing.assert_allclose([scalars["validation"]["epoch_loss"][s] for s in steps],
                               history["metrics"]["val_loss"], rtol=1e-5)
    np.testing.assert_allclose([scalars["train"]["epoch_learning_rate"][s] for s in steps],
                               history["metrics"]["learning_rate"], rtol=1e-5)


def test_saved_model_predicts_the_same_classes_as_the_keras_model(trained_run, staged_digits):
    import keras
    import tensorflow as tf

    _, result = trained_run
    model = keras.saving.load_model(result.model_path, safe_mode=True)
    served = tf.saved_model.load(result.saved_model_path)
    builder = load_builder(staged_digits)
    test = make_dataset(builder, "test", global_batch_size=128, shuffle=False, seed=0)
    keras_classes, served_classes = [], []
    for images, _ in test:
        keras_classes.append(np.argmax(model.predict(images, verbose=0), axis=1))
        served_classes.append(np.argmax(served.serve(images).numpy(), axis=1))
    keras_classes = np.concatenate(keras_classes)
    assert len(keras_classes) == 359
    assert np.array_equal(keras_classes, np.concatenate(served_classes))


def test_plateau_fires_early_stopping_and_lr_reduction_and_restores_the_best_epoch(
    staged_digits, tmp_path
):
    import keras

    # A large learning rate makes the validation loss bounce around a plateau quickly.
    cfg = RunConfig.from_flat({
        "staging_dir": staged_digits.staging_dir, "output_dir": os.fspath(tmp_path),
        "epochs": 40, "learning_rate": 0.05, "early_stopping_patience": 3,
        "reduce_lr_patience": 1, "reduce_lr_factor": 0.5, "strategy": "one_device",
    })
    result = train(cfg, staged_digits)
    history = json.loads((Path(result.run_dir) / "model" / "history.json").read_text())
    val_loss = history["metrics"]["val_loss"]
    es = history["early_stopping"]

    assert es["stopped_epoch"] is not None and es["stopped_epoch"] < cfg.fit.epochs
    assert len(val_loss) == es["stopped_epoch"]
    assert es["best_epoch"] == int(np.argmin(val_loss)) + 1
    assert es["stopped_epoch"] - es["best_epoch"] == cfg.fit.early_stopping_patience
    assert history["lr_reduced_at_epochs"], "ReduceLROnPlateau never fired"
    lrs = history["metrics"]["learning_rate"]
    assert min(lrs) < cfg.fit.learning_rate

    # The saved model carries the best epoch's weights: its validation loss is the best one.
    model = keras.saving.load_model(result.model_path, safe_mode=True)
    builder = load_builder(staged_digits)
    val = make_dataset(builder, "validation", global_batch_size=64, shuffle=False,
                       seed=0)
    loss, _ = model.evaluate(val, verbose=0)
    assert loss == pytest.approx(min(val_loss), rel=1e-3)
    assert loss < val_loss[-1]


def test_cnn_trains_on_digits(staged_digits, tmp_path):
    cfg = RunConfig.from_flat({
        "staging_dir": staged_digits.staging_dir, "output_dir": os.fspath(tmp_path),
        "model": "cnn", "epochs": 5, "strategy": "one_device",
    })
    result = train(cfg, staged_digits)
    history = json.loads((Path(result.run_dir) / "model" / "history.json").read_text())
    acc = history["metrics"]["val_accuracy"]
    assert max(acc) > 0.9, acc


def test_mirrored_strategy_over_two_cpu_devices_trains(staged_digits, tmp_path):
    """With the input pipeline's augmentation and no cache: the zipped seed stream and
    the parallel map go through the strategy's distribution of the dataset."""
    cfg = RunConfig.from_flat({
        "staging_dir": staged_digits.staging_dir, "output_dir": os.fspath(tmp_path),
        "epochs": 2, "strategy": "mirrored", "devices": ["/cpu:0", "/cpu:1"], "batch_size": 32,
        "augment": "flip_crop", "input_cache": "none",
    })
    result = train(cfg, staged_digits)
    run = json.loads((Path(result.run_dir) / "model" / "run.json").read_text())
    assert run["strategy"]["replicas_in_sync"] == 2
    assert run["strategy"]["global_batch_size"] == 64
    assert Path(result.model_path).exists()


def test_mirrored_steps_per_execution_10_trains_exactly_as_1(staged_digits, tmp_path):
    """Keras 3.15 fails under MirroredStrategy with more than 1 step per execution
    ("You must feed a value for placeholder tensor"); ``keras_patches/steps_in_cond.py`` fixes its
    loop. 17 steps an epoch: one execution of 10, one of 7."""
    import keras

    weights = {}
    for steps in (1, 10):
        cfg = RunConfig.from_flat({
            "staging_dir": staged_digits.staging_dir, "output_dir": os.fspath(tmp_path),
            "run_id": f"spe-{steps}", "epochs": 2, "strategy": "mirrored",
            "devices": ["/cpu:0", "/cpu:1"], "batch_size": 32,
            "steps_per_execution": steps, "backup_interval_s": 0,
        })
        result = train(cfg, staged_digits)
        weights[steps] = keras.saving.load_model(result.model_path).get_weights()
        history = json.loads((Path(result.run_dir) / "model" / "history.json").read_text())
        assert len(history["metrics"]["loss"]) == 2
    for once, tenfold in zip(weights[1], weights[10], strict=True):
        np.testing.assert_allclose(once, tenfold, rtol=0, atol=1e-6)
