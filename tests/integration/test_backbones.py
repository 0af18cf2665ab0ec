"""The keras.applications backbones trained on tfds mock data of real shapes.

* MobileNetV3Small, through ``python -m training train``: pretrained weights from
  ``s3://`` (the S3 API over HTTP), the backbone frozen for one epoch, then its top
  layers fine-tuned at a tenth of the rate; the training process is SIGKILLed after the
  frozen epoch and a re-run (in the test's process) finishes the schedule. The stored
  model's SavedModel serves raw uint8 images as its ``.keras`` file predicts them.
* EfficientNetB0 and ResNet50: one epoch each on the product's input pipeline
  (``models.build``, ``make_dataset``). Their full ``train`` (checkpoints, backups,
  export) is the same code as MobileNet's; a stored backbone model loading with
  ``safe_mode=True`` is checked in ``tests/unit/test_models.py``. They
  run eagerly: tracing their train step costs 40-50 s each on two cores, the two
  steps of the epoch 2-3 s.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.output import tail

from training.files import sha256_file
from training.train import models
from training.train.resume import STATE_FILE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MOCK_CLI = ROOT / "tests" / "support" / "mock_cli.py"
UNFREEZE = 12  # top layers of MobileNetV3Small's backbone that fine-tune
MOCK_EXAMPLES = 64  # a split


def _mock_train(config: Path, env: dict[str, str], on_line=None) -> tuple[int, list[str]]:
    """``python -m training train --config FILE`` on mock examples."""
    proc = subprocess.Popen(
        [sys.executable, os.fspath(MOCK_CLI), str(MOCK_EXAMPLES), "train", "--config",
         os.fspath(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
             "CUDA_VISIBLE_DEVICES": "", **env})
    lines = []
    try:
        for raw in proc.stdout:
            lines.append(raw.rstrip("\n"))
            if on_line is not None:
                on_line(proc, lines[-1])
        return proc.wait(timeout=600), lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pretrained_backbone_fine_tunes_on_schedule_across_a_sigkill(
        s3_server, tmp_path, monkeypatch, caplog):
    import keras
    import tensorflow as tf

    from training.config import RunConfig

    # Pretrained weights: a backbone with other weights than the run's seed gives, in S3.
    keras.utils.set_random_seed(7)
    source = models.build("mobilenet_v3_small", (28, 28, 1), 10, {"image_size": 32})
    weights_file = tmp_path / "mnv3.weights.h5"
    source.get_layer("backbone").save_weights(weights_file)
    pretrained = [np.array(w) for w in source.get_layer("backbone").weights]
    bucket = s3_server.create_bucket()
    s3_server.client().upload_file(os.fspath(weights_file), bucket,
                                   "pretrained/mnv3.weights.h5")
    aws_config = tmp_path / "aws-config"
    aws_config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    env = {**s3_server.env(), "AWS_CONFIG_FILE": os.fspath(aws_config)}

    cfg = RunConfig.from_flat({
        "dataset": "mnist", "staging_dir": os.fspath(tmp_path / "staged"),
        "output_dir": os.fspath(tmp_path / "runs"), "run_id": "fine-tune",
        "model": "mobilenet_v3_small", "model_args": {"image_size": 32},
        "model_weights": f"s3://{bucket}/pretrained/mnv3.weights.h5",
        "freeze_epochs": 1, "unfreeze_layers": UNFREEZE, "fine_tune_lr_factor": 0.1,
        "epochs": 3, "batch_size": 16, "learning_rate": 0.001, "backup_interval_s": 0,
        "restore_best_weights": False, "early_stopping_patience": 10,
        "strategy": "one_device"})
    config = cfg.write(tmp_path)
    backup = cfg.run_dir() / "backup"
    killed: list[dict] = []

    def kill_after_the_frozen_epoch(proc, line):
        if not killed and " - loss: " in line:  # printed after the epoch's backup
            killed.append(json.loads((backup / STATE_FILE).read_text()))
            proc.send_signal(signal.SIGKILL)

    code, lines = _mock_train(config, env, kill_after_the_frozen_epoch)
    assert code == -signal.SIGKILL, tail(lines)
    assert "epoch 1: backbone frozen (0 of its layers train, 0 weights)" in "\n".join(lines)
    (state,) = killed
    assert state["epochs_completed"] == 1
    # The backup of the frozen epoch already holds the lowered rate.
    assert state["callbacks"]["learning_rate"] == pytest.approx(1e-4)

    # The re-run (what an Airflow retry runs), in this process: the same CLI on the same
    # mock data, without a second TensorFlow start-up.
    import tensorflow_datasets as tfds

    from training.cli import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO)
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        code = main(["train", "--config", os.fspath(config)])
    text = caplog.text
    assert code == 0, text[-3000:]
    assert "resuming at epoch 2 from its start" in text
    assert "epoch 2: backbone fine-tuning (" in text and "unfreezes next epoch" not in text
    out = cfg.run_dir() / "model"
    history = json.loads((out / "history.json").read_text())
    assert history["epochs"] == [1, 2, 3]
    assert history["metrics"]["learning_rate"] == pytest.approx([1e-3, 1e-4, 1e-4])
    run = json.loads((out / "run.json").read_text())
    assert run["pretrained_weights"] == {"uri": cfg.model.weights,
                                         "sha256": sha256_file(weights_file)}

    # The stored model: frozen layers are the pretrained weights, bit for bit (their
    # BatchNormalization statistics too); the top layers moved.
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    backbone = model.get_layer("backbone")
    tuned = {id(v) for layer in backbone.layers[-UNFREEZE:]
             if not isinstance(layer, keras.layers.BatchNormalization)
             for v in layer.weights}
    moved = still = 0
    for variable, before in zip(backbone.weights, pretrained, strict=True):
        same = np.array_equal(np.array(variable), before)
        if id(variable) in tuned:
            moved += not same
        else:
            assert same, variable.path
            still += 1
    assert moved >= 1 and still > 100, (moved, still)

    # Served from the SavedModel: raw uint8 images in, the .keras model's predictions out
    # (Keras's own model.export would run BatchNormalization in training mode here:
    # training.train.export).
    images = np.random.default_rng(0).integers(0, 256, (8, 28, 28, 1), dtype=np.uint8)
    served = tf.saved_model.load(os.fspath(out / "saved_model"))
    signature = served.signatures["serving_default"]
    (output,) = signature(**{next(iter(signature.structured_input_signature[1])):
                             tf.constant(images)}).values()
    np.testing.assert_allclose(output.numpy(), np.asarray(model(images, training=False)),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("name", "dataset"), [("efficientnet_b0", "cifar10"),
                                               ("resnet50", "mnist")])
def test_a_backbone_trains_an_epoch_on_mock_data(name, dataset, tmp_path):
    import keras
    import tensorflow_datasets as tfds

    from training.config.data import DatasetConfig
    from training.data.input.choose import load_builder, make_dataset
    from training.data.snapshot import staging
    from training.data.sources.catalog import dataset_info

    with tfds.testing.mock_data(num_examples=32):
        staged = staging.stage(DatasetConfig(name=dataset, staging_dir=os.fspath(tmp_path)))
        builder = load_builder(staged)
        info = dataset_info(builder)
        data = make_dataset(builder, "train", global_batch_size=16, shuffle=True, seed=0)
        model = models.build(name, info["input_shape"], info["num_classes"],
                             {"image_size": 32, "flip": True, "zoom": 0.1})
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      run_eagerly=True)
        before = [np.array(w) for w in model.get_layer("backbone").trainable_weights[:3]]
        history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = model.get_layer("backbone").trainable_weights[:3]
    assert any(not np.array_equal(b, np.array(a)) for b, a in zip(before, after, strict=True))
    images = np.random.default_rng(0).integers(
        0, 256, (4, *info["input_shape"]), dtype=np.uint8)
    probabilities = np.asarray(model(images, training=False))
    assert probabilities.shape == (4, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
