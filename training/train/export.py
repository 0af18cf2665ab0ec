"""The SavedModel export: raw uint8 images in, class probabilities out, for serving.

Why not ``model.export``: Keras 3.15's export calls ``model.__call__`` without
``training``, and an image preprocessing layer (``Resizing``, ``RandomFlip``: their
``call`` defaults to ``training=True``) then puts every layer after it in training mode.
A backbone's BatchNormalization uses the batch's statistics, so the SavedModel of a
``resnet50`` served other answers than its ``.keras`` file (measured here: up to 23 apart
on raw outputs). The endpoint here calls the model with ``training=False``; the
signature is the one ``model.export`` writes (``serve`` and ``serving_default``, the
model's input name).

A model trained on Keras's JAX backend is exported by ``export_in_tensorflow``: its
``.keras`` file loaded (``safe_mode``) in a child process of the TensorFlow backend
(``python -m training.train.export MODEL DIR``), since a JAX training process imports no
TensorFlow (``training.backend``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from training.errors import TrainingError


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


def export_in_tensorflow(model_path: str | os.PathLike[str], path: str | os.PathLike[str],
                         model_name: str) -> None:
    """Write the SavedModel of the ``.keras`` file at ``model_path`` (of ``model.name``
    ``model_name``, whose module registers its custom layers) to ``path`` from a child
    process on the TensorFlow backend; TrainingError with its last lines if it fails."""
    from training import backend

    env = {**backend.child_env("tensorflow"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "training.train.export",
                           os.fspath(model_path), os.fspath(path), model_name],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise TrainingError(f"the SavedModel export of {model_path} (TensorFlow backend, "
                            f"a child process) failed with exit {done.returncode}: {tail}")


def main(argv: list[str]) -> int:
    """``python -m training.train.export MODEL DIR NAME``: the SavedModel of a .keras
    file."""
    from training import backend
    from training.registry.loading import load_keras
    from training.train import models

    backend.use("tensorflow")
    model_path, path, name = argv
    models.resolve(name)  # a plugin's module registers its custom layers
    export(load_keras(model_path, f"the trained model {model_path}"), path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
