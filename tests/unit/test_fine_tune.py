"""The fine-tuning schedule (``training.train.callbacks.fine_tune``) and the backbone's
pretrained weights (``training.train.models.pretrained``) on small Keras models."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest

from training.config import RunConfig
from training.errors import ConfigError
from training.train import models
from training.train.callbacks.fine_tune import FINE_TUNING, FROZEN, FineTuning
from training.train.models import pretrained


def _model() -> keras.Model:
    """A head on a four-layer ``backbone``: Dense a, Dense b, BatchNormalization, Dense c."""
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="a"),
                                 keras.layers.Dense(8, name="b"),
                                 keras.layers.BatchNormalization(name="bn"),
                                 keras.layers.Dense(8, name="c")], name="backbone")
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(backbone(inputs))
    return keras.Model(inputs, outputs)


def _weights(layer) -> list[np.ndarray]:
    return [np.array(w) for w in layer.weights]


def test_the_backbone_trains_only_after_the_frozen_epochs_and_only_its_top_layers():
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy")
    backbone = model.get_layer("backbone")
    tuning = FineTuning(backbone, freeze_epochs=1, unfreeze_layers=2, lr_factor=0.1)
    assert [layer.name for layer in tuning.tuned_layers()] == ["c"]  # BN stays frozen
    snapshots, rates = [], []
    watched = [*backbone.layers, model.get_layer("head")]  # a, b, bn, c, head
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: (
        snapshots.append({layer.name: _weights(layer) for layer in watched}),
        rates.append(float(model.optimizer.learning_rate))))
    before = {layer.name: _weights(layer) for layer in backbone.layers}
    head_before = _weights(model.get_layer("head"))
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = np.arange(64) % 3
    model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[tuning, record])

    # Epoch 1: the backbone, BatchNormalization's moving statistics included, is frozen.
    for name in ("a", "b", "bn", "c"):
        for now, then in zip(snapshots[0][name], before[name], strict=True):
            np.testing.assert_array_equal(now, then)
    assert not np.allclose(snapshots[0]["head"][0], head_before[0])
    # Epochs 2 and 3: only c, the top layer that is not BatchNormalization, trains.
    for name in ("a", "b", "bn"):
        for now, then in zip(snapshots[2][name], before[name], strict=True):
            np.testing.assert_array_equal(now, then)
    assert not np.allclose(snapshots[2]["c"][0], before["c"][0])
    # The rate is lowered once, at the end of the last frozen epoch.
    assert rates == pytest.approx([0.001, 0.001, 0.001])
    # When training ends the flags are as built, so the saved model matches its optimizer.
    assert all(layer.trainable for layer in backbone.layers) and backbone.trainable
    assert tuning.phase == FINE_TUNING


def test_the_flags_follow_the_epoch_a_run_resumes_at():
    model = _model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    backbone = model.get_layer("backbone")
    tuning = FineTuning(backbone, freeze_epochs=2, unfreeze_layers=0)
    tuning.set_model(model)
    tuning.on_train_begin()
    tuning.on_epoch_begin(3)  # resumed after the frozen epochs: straight to fine-tuning
    assert tuning.phase == FINE_TUNING
    assert [layer.trainable for layer in backbone.layers] == [True, True, False, True]
    tuning.on_epoch_begin(0)
    assert tuning.phase == FROZEN and not backbone.trainable_weights
    rate = float(model.optimizer.learning_rate)
    tuning.on_epoch_end(0)  # not the last frozen epoch: the rate stays
    assert float(model.optimizer.learning_rate) == pytest.approx(rate)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"freeze_epochs": 0}, "freeze_epochs must be an integer >= 1, got 0"),
    ({"freeze_epochs": 1, "unfreeze_layers": -1}, "unfreeze_layers must be an integer >= 0, "
                                                  "got -1"),
    ({"freeze_epochs": 1, "lr_factor": 0}, "lr_factor must be a number greater than 0 and at "
                                           "most 1, got 0"),
    ({"freeze_epochs": True}, "freeze_epochs must be an integer >= 1, got True"),
])
def test_fine_tuning_settings_are_checked(kwargs, message):
    with pytest.raises(ConfigError) as err:
        FineTuning(_model().get_layer("backbone"), **kwargs)
    assert str(err.value) == message


def test_a_model_without_a_backbone_is_refused_naming_the_setting_and_the_model():
    with pytest.raises(ConfigError) as err:
        pretrained.backbone_of(models.build("mlp", (8, 8, 1), 10), "mlp",
                               "model.freeze_epochs 2")
    # (Keras numbers layer names per process: dense_3 ...)
    assert re.fullmatch(
        r"model.freeze_epochs 2 needs a layer named 'backbone', and model 'mlp' has none "
        r"\(its layers: image, rescale, flatten\w*, dense\w*, dropout\w*, dense\w*\); the "
        r"built-in backbones are mobilenet_v3_small, efficientnet_b0 and resnet50",
        str(err.value)), str(err.value)


def test_weights_load_into_the_backbone_and_a_file_of_another_backbone_is_refused(tmp_path):
    source = models.build("mobilenet_v3_small", (28, 28, 1), 10, {"image_size": 32})
    path = tmp_path / "mnv3.weights.h5"
    source.get_layer("backbone").save_weights(path)
    keras.utils.set_random_seed(1)
    target = models.build("mobilenet_v3_small", (28, 28, 1), 10, {"image_size": 32})
    loaded = pretrained.load(target, "mobilenet_v3_small", str(path))
    assert loaded["uri"] == str(path) and len(loaded["sha256"]) == 64
    for a, b in zip(source.get_layer("backbone").weights,
                    target.get_layer("backbone").weights, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))

    other = models.build("efficientnet_b0", (28, 28, 1), 10, {"image_size": 32})
    with pytest.raises(ConfigError, match=r"^model.weights '.*mnv3.weights.h5' does not fit "
                                          "the backbone of model 'efficientnet_b0' "):
        pretrained.load(other, "efficientnet_b0", str(path))
    with pytest.raises(ConfigError, match="^model.weights: there is no file '.*/nope.weights"):
        pretrained.load(other, "efficientnet_b0", str(tmp_path / "nope.weights.h5"))


@pytest.mark.parametrize(("flat", "message"), [
    ({"unfreeze_layers": 5}, "model.unfreeze_layers is 5 but model.freeze_epochs is 0: set "
                             "freeze_epochs to the epochs the backbone stays frozen first, "
                             "or unfreeze_layers to 0"),
    ({"model_weights": "imagenet"}, "model.weights must be empty, or a path or s3:// URI of a "
                                    ".weights.h5 file, got 'imagenet'"),
])
def test_fine_tuning_config_is_checked(flat, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flat({"model": "mobilenet_v3_small", **flat})
    assert str(err.value) == message
