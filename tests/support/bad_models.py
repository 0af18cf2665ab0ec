"""Model builders that break the plugin contract, for ``test_model_plugins.py`` and
``test_jax_training.py`` (``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

from typing import Any


def three_outputs(input_shape: tuple[int, ...], num_classes: int) -> Any:
    """Ignores the class count: always 3 outputs."""
    import keras

    inputs = keras.Input(shape=input_shape, dtype="uint8")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1.0 / 255)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def broken(input_shape: tuple[int, ...], num_classes: int, *, width: int = 8) -> Any:
    raise RuntimeError(f"no layer is {width} wide today")


def untyped(input_shape, num_classes, *, width=8):
    return None


def ruled(input_shape: tuple[int, ...], num_classes: int) -> Any:
    """Builds, but its layout rule names no variable of it: refused under model parallel
    once the model is built, in the training process."""
    import keras

    inputs = keras.Input(shape=input_shape, dtype="uint8")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1.0 / 255)(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


ruled.layout_rules = {r"no_such_layer/kernel$": ("model", None)}
