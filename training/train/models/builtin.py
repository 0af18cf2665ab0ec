"""The built-in models: the seed's MLP and CIFAR CNN (registered by name in ``__init__``).

Keras is imported inside the builders, so importing this module stays cheap.
"""

from __future__ import annotations

from typing import Any

from training.train.models import register

# runtime.model_parallel under jax: every Dense kernel split by rows (its input
# features) over the mesh's model axis; the rest replicated. Rows, not columns: the
# classes (10) need not divide by the axis, the features (64, 784, 512, 1600) do.
DENSE_KERNELS = {r"dense(_\d+)?/kernel$": ("model", None)}


def _inputs(input_shape: tuple[int, ...]) -> tuple[Any, Any]:
    import keras

    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")
    return inputs, keras.layers.Rescaling(1.0 / 255, name="rescale")(inputs)


@register("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int) -> Any:
    """The seed's MNIST model: Dense 512 relu, Dropout 0.2, softmax; flattens any shape."""
    import keras
    from keras import layers

    inputs, x = _inputs(input_shape)
    x = layers.Flatten()(x)
    x = layers.Dense(512, activation="relu")(x)
    x = layers.Dropout(0.2)(x)
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="mlp")


mlp.layout_rules = DENSE_KERNELS


BN_MOMENTUM = 0.9


@register("cnn")
def cnn(input_shape: tuple[int, ...], num_classes: int) -> Any:
    """The seed's CIFAR-10 network, layer for layer.

    Two blocks of Conv-BN-Conv-BN-MaxPool-Dropout(0.25) with 32 then 64 filters (the
    first conv of each block ``padding='same'``), Flatten, Dense 512 relu + BN +
    Dropout 0.5, softmax. On images too small for a 2x2 valid pooling (8x8 digits reach
    the second pooling at 1x1), that pooling uses ``padding='same'``.

    BatchNormalization uses momentum 0.9 rather than Keras' 0.99: the moving statistics
    then settle within the few hundred steps a small dataset gives (digits has 20 steps
    an epoch; with 0.99 validation accuracy stays at chance for 15+ epochs), and on
    CIFAR-10's 780 steps an epoch the two are the same after the first epoch.
    """
    import keras
    from keras import layers

    inputs, x = _inputs(input_shape)
    for filters in (32, 64):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
        x = layers.Conv2D(filters, 3, activation="relu")(x)
        x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
        too_small = min(x.shape[1], x.shape[2]) < 2
        x = layers.MaxPooling2D(2, padding="same" if too_small else "valid")(x)
        x = layers.Dropout(0.25)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(512, activation="relu")(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="cnn")


cnn.layout_rules = DENSE_KERNELS
