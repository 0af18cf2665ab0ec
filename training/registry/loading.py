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
        on ``examples`` inputs of its input shape (``check_model_runs``). Returns what was
        seen."""
        with tempfile.TemporaryDirectory(prefix="check-") as tmp:
            model = self.load_model(name, version, tmp)
            return check_model_runs(model, f"model {name!r} version {version!r}", examples)

    def check_runs_or_evaluated(self, name: str, version: str) -> dict[str, Any]:
        """``check_runs`` without loading Keras when the version's own evaluation already
        loaded and ran this very model file: its ``evaluation.json`` (``model_check``,
        written by ``steps.evaluate``) names the SHA-256 of the file it checked, and
        the version's manifest, verified here file by file, gives the model file that
        SHA-256. Anything else (an older version, another file) is checked with Keras."""
        import json

        from training.layout import EVALUATION, version_key

        manifest = self.verify(name, version)
        listed = {entry["path"]: entry for entry in manifest["files"]}
        check: Any = {}
        if MODEL_FILE in listed and EVALUATION in listed:
            try:
                check = json.loads(self.store.get_bytes(
                    version_key(name, version, EVALUATION))).get("model_check") or {}
            except (ValueError, AttributeError):  # not a JSON object: check with Keras
                check = {}
        if isinstance(check, dict) and check.get("sha256") and check.get(
                "sha256") == listed[MODEL_FILE]["sha256"]:
            return check
        return self.check_runs(name, version)


def check_model_runs(model: Any, what: str, examples: int = 2) -> dict[str, Any]:
    """Run a loaded model on ``examples`` inputs of its input shape (zeros, the model's
    dtype); RegistryError unless every output is finite with one row per input."""
    import numpy as np

    shape = tuple(model.input_shape)[1:]
    if not shape or any(d is None for d in shape):
        raise RegistryError(f"{what} has no fixed input shape to check it with, got "
                            f"{model.input_shape}")
    dtype = getattr(model.inputs[0], "dtype", "float32")
    inputs = np.zeros((examples, *shape), dtype=str(dtype))
    try:
        outputs = np.asarray(model.predict(inputs, verbose=0))
    except Exception as exc:
        raise RegistryError(f"{what} fails on inputs of its own shape {shape}: "
                            f"{type(exc).__name__}: {shown(exc)}") from exc
    finite = bool(np.all(np.isfinite(outputs)))
    if outputs.shape[:1] != (examples,) or not finite:
        raise RegistryError(f"{what} gives unusable outputs (shape {outputs.shape}, all "
                            f"finite: {finite}) for {examples} inputs of shape {shape}")
    return {"input_shape": list(shape), "output_shape": list(outputs.shape)}
