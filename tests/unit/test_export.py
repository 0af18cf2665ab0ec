"""The SavedModel export (``training.train.export``) on a small model shaped like a
backbone model: an image preprocessing layer, then a nested model with
BatchNormalization whose moving statistics are far from a batch's."""

from __future__ import annotations

import numpy as np
import pytest


def _model():
    import keras

    inner = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.BatchNormalization()],
                             name="backbone")
    bn = inner.layers[0]
    bn.moving_mean.assign(np.full((1,), 50.0, dtype="float32"))
    bn.moving_variance.assign(np.full((1,), 4.0, dtype="float32"))
    inputs = keras.Input((4, 4, 1), dtype="uint8", name="image")
    x = keras.layers.Rescaling(1.0)(inputs)
    x = keras.layers.Resizing(6, 6)(x)
    outputs = keras.layers.GlobalAveragePooling2D()(inner(x))
    return keras.Model(inputs, outputs)


def _serve(path, images):
    import tensorflow as tf

    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    (output,) = signature(image=tf.constant(images)).values()
    return output.numpy()


IMAGES = np.random.default_rng(0).integers(0, 256, (8, 4, 4, 1), dtype=np.uint8)


def test_the_saved_model_serves_raw_images_as_the_model_predicts(tmp_path):
    from training.train.export import export

    model = _model()
    export(model, tmp_path / "saved_model")
    served = _serve(tmp_path / "saved_model", IMAGES)
    np.testing.assert_allclose(served, np.asarray(model(IMAGES, training=False)), rtol=1e-5)


def test_probe_keras_export_runs_layers_after_a_resizing_layer_in_training_mode(tmp_path):
    """When this fails, Keras's ``model.export`` calls the model in inference mode again
    and ``training.train.export`` can go back to it."""
    model = _model()
    model.export(str(tmp_path / "keras_export"), format="tf_saved_model", verbose=False)
    served = _serve(tmp_path / "keras_export", IMAGES)
    inference = np.asarray(model(IMAGES, training=False))
    training = np.asarray(model(IMAGES, training=True))
    assert not np.allclose(served, inference, rtol=1e-3)
    assert served == pytest.approx(training, rel=1e-3, abs=1e-3)
