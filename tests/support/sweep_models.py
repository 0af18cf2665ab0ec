"""A team's own model for the sweep tests (``tests/integration/test_sweep_cli.py``),
referenced as ``support.sweep_models:dense`` with ``tests/`` on ``PYTHONPATH``.

It learns the digits within an epoch (as the built-in ``mlp`` does), and its ``dropout``
has no declared bounds: the config takes any number, and Keras refuses a rate outside
[0, 1) when the model is built, in the trial's child, as a team's model refuses values
it cannot build.
"""

from __future__ import annotations

from typing import Any


def dense(input_shape: tuple[int, ...], num_classes: int, *, units: int = 64,
          dropout: float = 0.1) -> Any:
    """Rescaling, Flatten, Dense ``units`` relu, Dropout ``dropout``, softmax."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")
    x = layers.Flatten()(layers.Rescaling(1.0 / 255)(inputs))
    x = layers.Dense(units, activation="relu")(x)
    x = layers.Dropout(dropout)(x)
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="dense")
