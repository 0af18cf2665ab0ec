"""A model's ``backbone`` layer: pretrained weights (``model.weights``) and the
fine-tuning schedule (``model.freeze_epochs``) for it.

``model.weights`` is a local path or an ``s3://`` URI of a ``.weights.h5`` file (Keras
3's weights format) saved from the backbone alone: ``backbones.py`` shows how. An S3
file is read with the training process's credentials (the launcher hands it the Airflow
connection's, as for the store). Every worker loads the same file; a resumed run loads
it too, then the backup's weights replace it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from training.errors import ConfigError, StorageError, shown
from training.files import sha256_file
from training.train.models import BACKBONE


def backbone_of(model: Any, name: str, why: str) -> Any:
    """The model's layer named ``backbone``, or ConfigError naming the model and the
    setting (``why``) that needs it."""
    try:
        return model.get_layer(BACKBONE)
    except ValueError:
        raise ConfigError(
            f"{why} needs a layer named {BACKBONE!r}, and model {name!r} has none (its "
            f"layers: {', '.join(layer.name for layer in model.layers)}); the built-in "
            "backbones are mobilenet_v3_small, efficientnet_b0 and resnet50") from None


def fetch(uri: str, directory: Path) -> Path:
    """The weights file at ``uri`` as a local path (an S3 object is downloaded into
    ``directory``); ConfigError when there is none."""
    from training.registry.uri import is_s3

    if not is_s3(uri):
        if not Path(uri).is_file():
            raise ConfigError(f"model.weights: there is no file {uri!r}")
        return Path(uri)
    from training.registry import open_store

    parent, _, key = uri.rpartition("/")
    target = directory / key
    try:
        open_store(parent).get_file(key, target)
    except StorageError as exc:
        raise ConfigError(f"model.weights: cannot read {uri!r} ({shown(exc)})") from None
    return target


def load(model: Any, name: str, uri: str) -> dict[str, str]:
    """Load ``uri`` into the model's backbone; what was loaded (uri, sha256) for
    ``run.json``. ConfigError when the file does not fit the backbone."""
    backbone = backbone_of(model, name, f"model.weights {uri!r}")
    with tempfile.TemporaryDirectory(prefix="weights-") as tmp:
        path = fetch(uri, Path(tmp))
        digest = sha256_file(path)
        try:
            backbone.load_weights(os.fspath(path))
        except Exception as exc:  # Keras: ValueError, KeyError, OSError for a bad file
            raise ConfigError(f"model.weights {uri!r} does not fit the backbone of model "
                              f"{name!r} ({type(exc).__name__}: {shown(exc)})") from None
    return {"uri": uri, "sha256": digest}


def prepare(spec: Any, model: Any) -> tuple[dict[str, str] | None, list[Any]]:
    """For the ``model`` section ``spec``: its weights loaded into the backbone (what was
    loaded, for ``run.json``, or None) and the ``FineTuning`` callback of
    ``freeze_epochs`` (or none). ConfigError, before any training, when the model has no
    backbone or the file does not fit it."""
    from training.train.callbacks.fine_tune import FineTuning

    weights = load(model, spec.name, spec.weights) if spec.weights else None
    if not spec.freeze_epochs:
        return weights, []
    backbone = backbone_of(model, spec.name, f"model.freeze_epochs {spec.freeze_epochs}")
    return weights, [FineTuning(backbone, freeze_epochs=spec.freeze_epochs,
                                unfreeze_layers=spec.unfreeze_layers,
                                lr_factor=spec.fine_tune_lr_factor)]
