"""Loading a published model with Keras, safely, and checking that it runs.

A model file is code: every load goes through ``keras.saving.load_model(path,
safe_mode=True)``, so a model that carries code (a ``Lambda`` layer's bytecode, for
one) is refused with RegistryError. Keras (and NumPy) are imported only here, inside
the methods.

``ModelLoading`` is a mixin of ``ModelRegistry`` (``versions.py``): it uses the
registry's ``download``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from training.errors import RegistryError, shown
from training.layout import MODEL_FILE

__all__ = ["ModelLoading"]


def load_keras(path: str | os.PathLike[str], what: str) -> Any:
    """``keras.saving.load_model(path, safe_mode=True)``: every model is loaded this way.

    A missing file, a model that needs unsafe deserialization (a Lambda layer's
    bytecode, for one) or a file Keras cannot read is a RegistryError naming ``what``.
    """
    if not Path(path).is_file():  # Keras says ValueError("File not found ...")
        raise RegistryError(f"{what} does not exist ({path})")
    import keras

    try:
        return keras.saving.load_model(path, safe_mode=True)
    except ValueError as exc:
        if "safe_mode" not in str(exc):
            raise RegistryError(f"{what} cannot be loaded by Keras: {shown(exc)}") from exc
        raise RegistryError(
            f"{what} was refused by Keras safe_mode (it carries code, such as a Lambda "
            f"layer, that loading would run): {shown(exc)}") from exc
    except Exception as exc:  # a truncated or foreign file: Keras raises many kinds
        raise RegistryError(f"{what} cannot be loaded by Keras: {type(exc).__name__}: "
                            f"{shown(exc)}") from exc


class ModelLoading:
    """``load_model`` and ``check_runs`` (a mixin of ``ModelRegistry``)."""

    def load_model(
        self,
        name: str,
        version: str,
        dest_dir: str | os.PathLike[str],
        *,
        filename: str = MODEL_FILE,
    ):
        """Download and verify a version into ``dest_dir``, then load ``filename`` with
        ``keras.saving.load_model(..., safe_mode=True)``.

        A model that needs unsafe deserialization (a Lambda layer's bytecode, for one)
        is refused with RegistryError.
        """
        dest = Path(self.download(name, version, dest_dir))
        path = dest / filename
        if not path.is_file():
            raise RegistryError(
                f"model {name!r} version {version!r} has no file {filename!r} to load"
            )
        return load_keras(path, f"model {name!r} version {version!r} file {filename!r}")

    def check_runs(self, name: str, version: str, examples: int = 2) -> dict[str, Any]:
        """Download and verify a version, load its model with ``safe_mode=True`` and run it
        on ``examples`` inputs of its input shape (zeros, the model's dtype); RegistryError
        unless every output is finite with one row per input. Returns what was seen."""
        import numpy as np

        with tempfile.TemporaryDirectory(prefix="check-") as tmp:
            model = self.load_model(name, version, tmp)
            shape = tuple(model.input_shape)[1:]
            if not shape or any(d is None for d in shape):
                raise RegistryError(f"model {name!r} version {version!r} has no fixed input "
                                    f"shape to check it with, got {model.input_shape}")
            dtype = getattr(model.inputs[0], "dtype", "float32")
            inputs = np.zeros((examples, *shape), dtype=str(dtype))
            try:
                outputs = np.asarray(model.predict(inputs, verbose=0))
            except Exception as exc:
                raise RegistryError(f"model {name!r} version {version!r} fails on inputs of "
                                    f"its own shape {shape}: {type(exc).__name__}: "
                                    f"{shown(exc)}") from exc
        finite = bool(np.all(np.isfinite(outputs)))
        if outputs.shape[:1] != (examples,) or not finite:
            raise RegistryError(f"model {name!r} version {version!r} gives unusable outputs "
                                f"(shape {outputs.shape}, all finite: {finite}) for {examples} "
                                f"inputs of shape {shape}")
        return {"input_shape": list(shape), "output_shape": list(outputs.shape)}
