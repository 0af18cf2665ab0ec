"""Image backbones from ``keras.applications`` as built-in models.

``mobilenet_v3_small``, ``efficientnet_b0`` and ``resnet50`` share one builder and its
arguments (``model_args``)::

    uint8 image -> float -> Resizing(image_size) -> [grey: 3 channels] -> [augment] ->
    [resnet50: caffe input] -> backbone (no top, average pooled) -> Dropout -> softmax

* ``image_size``: the side the images are resized to (the applications need 32 at
  least; their ImageNet weights were trained at 224).
* ``flip``, ``rotation``, ``zoom``: the ``augment`` layers (RandomFlip horizontal,
  RandomRotation and RandomZoom by that fraction); Keras runs them in training only, so
  evaluation, the exported model and serving see the image as it is. 0 or false: none.
* ``dropout``: the rate of the Dropout before the classifier.

The application is the layer named ``backbone`` (``models.BACKBONE``). It is built with
``weights=None``: nothing is downloaded. ``model.weights`` in the config loads a
``.weights.h5`` file into it, saved from the same application without its top, for
example on a machine with internet::

    keras.applications.MobileNetV3Small(include_top=False, pooling="avg",
        input_shape=(96, 96, 3)).save_weights("mobilenet_v3_small.weights.h5")

and ``model.freeze_epochs`` / ``unfreeze_layers`` fine-tune it
(``training.train.callbacks.fine_tune``).

Every layer is a Keras built-in one, so a stored model loads with ``safe_mode=True``
where only Keras is installed. The preprocessing each application's weights expect is in
the model: MobileNetV3 and EfficientNet rescale 0-255 pixels themselves; ResNet50 wants
caffe input (BGR, ImageNet mean subtracted), done by a fixed 1x1 convolution.
"""

from __future__ import annotations

from typing import Annotated, Any

from training.train.models import BACKBONE, Between, register

# name -> (keras.applications class, its input: "pixels" 0-255 or "caffe")
APPLICATIONS = {
    "mobilenet_v3_small": ("MobileNetV3Small", "pixels"),
    "efficientnet_b0": ("EfficientNetB0", "pixels"),
    "resnet50": ("ResNet50", "caffe"),
}
IMAGENET_MEAN_BGR = (103.939, 116.779, 123.68)


def _builder(name: str) -> Any:
    application, expects = APPLICATIONS[name]

    def build(input_shape: tuple[int, ...], num_classes: int, *,
              image_size: Annotated[int, Between(32, 1024)] = 96,
              dropout: Annotated[float, Between(0.0, 0.9)] = 0.2,
              flip: bool = False,
              rotation: Annotated[float, Between(0.0, 0.5)] = 0.0,
              zoom: Annotated[float, Between(0.0, 0.9)] = 0.0) -> Any:
        import keras
        from keras import layers

        inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")
        x = layers.Rescaling(1.0, name="pixels")(inputs)  # uint8 to float, still 0-255
        x = layers.Resizing(image_size, image_size, name="resize")(x)
        if input_shape[-1] == 1:
            x = layers.Concatenate(name="grey_to_rgb")([x, x, x])
        elif input_shape[-1] != 3:
            raise ValueError(f"{name} takes images with 1 or 3 channels, got "
                             f"{input_shape[-1]}")
        augment = []  # Keras runs these in training only
        if flip:
            augment.append(layers.RandomFlip("horizontal"))
        if rotation:
            augment.append(layers.RandomRotation(rotation))
        if zoom:
            augment.append(layers.RandomZoom(zoom))
        if augment:
            x = keras.Sequential(augment, name="augment")(x)
        if expects == "caffe":
            x = _caffe_input(x)
        backbone = getattr(keras.applications, application)(
            include_top=False, weights=None, input_shape=(image_size, image_size, 3),
            pooling="avg", name=BACKBONE)
        x = backbone(x)
        x = layers.Dropout(dropout, name="head_dropout")(x)
        outputs = layers.Dense(num_classes, activation="softmax", dtype="float32",
                               name="classifier")(x)
        return keras.Model(inputs, outputs, name=name)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = (f"keras.applications.{application} as the backbone (module doc: "
                     "arguments and layers).")
    return build


def _caffe_input(x: Any) -> Any:
    """RGB 0-255 to what ResNet50's ImageNet weights expect: BGR minus the ImageNet
    mean. A fixed (never trained) 1x1 convolution: built-in, so no custom object."""
    import numpy as np
    from keras import layers

    conv = layers.Conv2D(3, 1, trainable=False, name="caffe_input")
    y = conv(x)
    conv.set_weights([np.eye(3, dtype="float32")[::-1].reshape(1, 1, 3, 3),
                      -np.asarray(IMAGENET_MEAN_BGR, dtype="float32")])
    return y


for _name in APPLICATIONS:
    register(_name)(_builder(_name))
