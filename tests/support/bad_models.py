"""Model builders that break the plugin contract, for ``test_model_plugins.py``."""

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
