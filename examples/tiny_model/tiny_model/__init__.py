"""An example model plugin: a team's own architecture, found by its entry point.

Installed (``pip install examples/tiny_model``), it is the model ``tiny_convnet``; not
installed, the reference ``tiny_model:tiny_convnet`` finds it on ``PYTHONPATH``. The
pipeline calls ``tiny_convnet(input_shape, num_classes, filters=..., dropout=...)`` with
``model_args`` from the config, then compiles and trains the model itself.
"""

from __future__ import annotations

from typing import Any


def tiny_convnet(input_shape: tuple[int, ...], num_classes: int, *, filters: int = 16,
                 dropout: float = 0.2) -> Any:
    """Rescaling, two 3x3 convolutions with ``filters`` and ``2 * filters`` channels,
    global average pooling, dropout, softmax. Input: raw uint8 pixels."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(2 * filters, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(dropout)(x)
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="tiny_convnet")
