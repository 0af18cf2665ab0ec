"""The SavedModel export: raw uint8 images in, class probabilities out, for serving.

Why not ``model.export``: Keras 3.15's export calls ``model.__call__`` without
``training``, and an image preprocessing layer (``Resizing``, ``RandomFlip``: their
``call`` defaults to ``training=True``) then puts every layer after it in training mode.
A backbone's BatchNormalization uses the batch's statistics, so the SavedModel of a
``resnet50`` served other answers than its ``.keras`` file (measured here: up to 23 apart
on raw outputs). The endpoint here calls the model with ``training=False``; the
signature is the one ``model.export`` writes (``serve`` and ``serving_default``, the
model's input name).
"""

from __future__ import annotations

import os
from typing import Any


def export(model: Any, path: str | os.PathLike[str]) -> None:
    """Write the model's inference SavedModel to ``path`` (which must not exist)."""
    import keras
    import tensorflow as tf

    specs = [tf.TensorSpec(t.shape, t.dtype, name=t.name) for t in model.inputs]
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", lambda *inputs: model(list(inputs) if len(inputs) > 1
                                                         else inputs[0], training=False),
                         input_signature=specs)
    archive.write_out(os.fspath(path), verbose=False)
